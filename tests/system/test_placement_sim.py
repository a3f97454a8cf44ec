"""The placement simulator (benchmarks/placement_sim.py) on a small seeded workload: the learned
policy, driven through the same policy objects the scheduler uses, beats round-robin."""

from __future__ import annotations

import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_learned_beats_round_robin_in_a_small_simulation() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        from placement_sim import simulate
    finally:
        sys.path.remove(str(BENCH))
    t0 = time.monotonic()
    out = simulate(tasks=4000, seed=7, policies=("round-robin", "shortest-expected", "learned"))
    res = out["policies"]
    assert time.monotonic() - t0 < 20
    assert res["learned"]["mean"] < 0.73 * res["round-robin"]["mean"]  # the bar: >= 27 % lower
    assert res["learned"]["mean"] < 1.05 * res["shortest-expected"]["mean"]  # and no worse than the best heuristic
    assert len(res["learned"]["windows_after_shift"]) == 2  # 2,000 tasks after the shift, windows of 1,000
    assert out["learned_stats"]["samples"] > 3500  # it learned from (nearly) every completion
