#!/usr/bin/env python
"""CPU cost of a placement policy on the owner's whole per-task path, without processes or sockets.

The owner state machine (``aionet.scheduler.owner.Owner``) on a stand-in host places ``--tasks``
no-op tasks on ``--workers`` workers in batches and is fed their results, as the client node of
``benchmarks/tasks.py`` is: submit, dispatch (``choose``), spec, result, completion bookkeeping
(``observe`` for a learning policy). It prints the wall time per task; on a shared machine run it
under callgrind for numbers other tenants cannot move (instructions do not depend on load):

    python benchmarks/placement_owner_cost.py --policy learned
    valgrind --tool=callgrind --callgrind-out-file=/dev/null --collect-atstart=no \\
        --toggle-collect=functools_reduce python benchmarks/placement_owner_cost.py --policy learned --tasks 20000
    # "Collected" / tasks = instructions per task in the measured loop (warm-up excluded)

The messaging, codec and event-loop work around it is the same for every policy and is not
included, so the ratio printed here overstates a policy's share of a real task's cost.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aionet.scheduler.owner import Owner  # noqa: E402
from aionet.scheduler.wire import R_VALUE  # noqa: E402
from tests.unit.scheduler.fake_host import FakeHost  # noqa: E402

FN = "tests.tasks_fns:inc"


def run(policy: str, workers: int, batch: int, rounds: int, runtime: float) -> None:
    """``rounds`` rounds of: submit ``batch`` tasks, dispatch them, feed back every result."""
    host = FakeHost("me", policy=policy)
    o = Owner(host)  # type: ignore[arg-type]
    names = [f"w{i}" for i in range(workers)]
    for w in names:
        o.node_up(w, {"cpu": 4.0}, run_tasks=True)

    def one_round(_: object, i: int) -> None:
        refs = [o.submit(FN, (j,), None) for j in range(batch)]
        host.loop.run_soon()
        by_node: dict[str, list[list[object]]] = {}
        for r in refs:
            rec = r._rec
            by_node.setdefault(rec.node, []).append([rec.tid, 1, R_VALUE, None, runtime, 8])
        o.outbox.clear()
        for w, items in by_node.items():
            host.perform(o.on_results(w, items, None))
        host.now += runtime

    for i in range(max(rounds // 10, 2)):  # warm-up, outside functools.reduce (callgrind's toggle)
        one_round(None, i)
    t = time.perf_counter()
    functools.reduce(one_round, range(rounds), None)
    dt = time.perf_counter() - t
    print(f"{policy}: {1e6 * dt / (rounds * batch):.2f} us per task (wall, {rounds * batch} tasks)")
    host.loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="least-loaded")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--runtime", type=float, default=2e-5, help="seconds each task reports (no-op: 20 us)")
    a = ap.parse_args()
    run(a.policy, a.workers, a.batch, max(a.tasks // a.batch, 1), a.runtime)


if __name__ == "__main__":
    main()
