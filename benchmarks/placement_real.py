#!/usr/bin/env python
"""Placement policies on real processes: does ``learned`` cost throughput, does it help with a slow worker?

1. No-op throughput (submit N, gather all) from a client node to two ``aionet serve`` workers,
   ``least-loaded`` and ``learned`` alternating on the same cluster (ABAB..., so machine load
   hits both alike); bar: learned within 5 % of least-loaded.
2. A slowed worker: 400 tasks of 5 ms on two workers, w1 4x slower, work stealing off so
   placement alone decides, for round-robin, least-loaded, shortest-expected and learned.

    python benchmarks/placement_real.py              # about a minute
    python benchmarks/placement_real.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
from tasks import AionetCluster, _client


async def throughput(seeds: list[str], policy: str, n: int) -> float:
    node = await _client(seeds, 2, policy=policy)
    try:
        await node.gather([node.submit("tasks:noop") for _ in range(min(n, 2000))])  # warm-up (and learn)
        t = time.perf_counter()
        res = await node.gather([node.submit("tasks:noop") for _ in range(n)])
        dt = time.perf_counter() - t
        assert len(res) == n
    finally:
        await node.stop()
    return n / dt


async def slowed(seeds: list[str], policy: str, n: int, base: float) -> float:
    node = await _client(seeds, 2, policy=policy)
    try:
        slow = {"w1": 4.0}
        t = time.perf_counter()
        res = await node.map("tasks:work", range(n), [base] * n, [slow] * n, resources={"cpu": 1})
        dt = time.perf_counter() - t
        assert sorted(res) == list(range(n))
    finally:
        await node.stop()
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default=str(C.RESULTS_DIR / "placement_real.json"))
    args = ap.parse_args()
    from aionet.log import configure

    configure("warning")
    n = 5000 if args.quick else 20000
    reps = 2 if args.quick else args.repeat
    out: dict[str, Any] = {"environment": C.environment(), "n": n, "repeat": reps, "throughput": {}, "slowed": {}}

    print(f"throughput: {reps} x {n} no-op tasks per policy, alternating ...", flush=True)
    cl = AionetCluster(2)
    try:
        seeds = cl.start()
        tp: dict[str, list[float]] = {"least-loaded": [], "learned": []}
        for _ in range(reps):
            for policy in tp:
                tp[policy].append(C.run_async(throughput(seeds, policy, n)))
    finally:
        cl.stop()
    out["throughput"] = tp
    med = {k: statistics.median(v) for k, v in tp.items()}
    ratio = med["learned"] / med["least-loaded"]

    print("slowed worker: 400 x 5 ms, w1 4x slower, no stealing ...", flush=True)
    cl = AionetCluster(2, env={"AIONET_SCHEDULER_STEAL": "false"})
    try:
        seeds = cl.start()
        for policy in ("round-robin", "least-loaded", "shortest-expected", "learned"):
            out["slowed"][policy] = C.run_async(slowed(seeds, policy, 400, 0.005))
    finally:
        cl.stop()

    rows = [[k, f"{statistics.median(v):,.0f}", ", ".join(f"{x:,.0f}" for x in v)] for k, v in tp.items()]
    C.print_table(f"No-op throughput, 2 workers (tasks/s, {reps} alternating runs)", ["policy", "median", "runs"], rows)
    rr = out["slowed"]["round-robin"]
    rows = [[k, f"{v:.2f}", f"{rr / v:.2f}x"] for k, v in out["slowed"].items()]
    C.print_table("Slowed worker: 400 x 5 ms, w1 4x slower (s)", ["policy", "seconds", "vs round-robin"], rows)
    ok = ratio >= 0.95
    print(f"learned / least-loaded throughput: {ratio:.3f} (bar >= 0.95): {'PASS' if ok else 'FAIL'}")
    out["learned_vs_least_loaded"] = ratio
    print("wrote", C.write_json(args.json, out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
