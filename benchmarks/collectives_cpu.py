#!/usr/bin/env python
"""CPU per small allreduce with every rank in one process over tcp:// (no scheduler between
ranks, so other tenants' load moves it far less than the latency of separate processes).

    python benchmarks/collectives_cpu.py --nodes 4 --calls 3000 [--profile]

Prints wall time, user and system CPU per call summed over the ranks, and the standalone ACK
frames the links wrote per call (acks that could not ride on a send). ``--profile``: cProfile's
top functions and Python calls per rank per call. Compare trees by running it alternately
from each, with ``PYTHONPATH`` set to the tree.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import uvloop  # noqa: E402

from aionet.core.link import Link  # noqa: E402
from aionet.testing import cluster  # noqa: E402


def count_acks() -> dict[str, int]:
    """Count the ACK frames links write on their own (patched into the class: benchmark only)."""
    n = {"acks": 0}
    flush = Link.flush_ack

    def counted(self: Link) -> None:
        if self.state.ack_owed and self.current is not None:
            n["acks"] += 1
        flush(self)

    Link.flush_ack = counted  # type: ignore[method-assign]
    return n


async def run(nodes_n: int, calls: int, nbytes: int, profile: bool, acks: dict[str, int]) -> None:
    async with cluster(nodes_n, "tcp") as nodes:
        groups = [n.group() for n in nodes]
        xs = [np.ones(max(1, nbytes // 4), np.float32) for _ in groups]
        ys = [np.empty_like(x) for x in xs]

        async def loop(g: Any, k: int) -> None:
            for _ in range(k):
                await g.allreduce(xs[g.rank], out=ys[g.rank])

        await asyncio.gather(*(loop(g, 200) for g in groups))  # warm-up
        prof = cProfile.Profile() if profile else None
        a0, u0, t0 = acks["acks"], resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        if prof:
            prof.enable()
        await asyncio.gather(*(loop(g, calls) for g in groups))
        if prof:
            prof.disable()
        t1, u1, a1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF), acks["acks"]
        assert all((y == nodes_n).all() for y in ys), "wrong result"
        per = 1e6 / calls
        print(
            f"n={nodes_n} {nbytes} B: wall {(t1 - t0) * per:.0f} us/call, user {(u1.ru_utime - u0.ru_utime) * per:.0f} "
            f"+ sys {(u1.ru_stime - u0.ru_stime) * per:.0f} us/call over the ranks, "
            f"{(a1 - a0) / calls:.2f} standalone ACKs/call"
        )
        if prof:
            st = pstats.Stats(prof)
            st.sort_stats("tottime").print_stats(30)
            print(f"Python calls per rank per call: {st.total_calls / calls / nodes_n:.0f}")  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--bytes", type=int, default=8, help="float32 bytes per rank")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    acks = count_acks()
    uvloop.run(run(args.nodes, args.calls, args.bytes, args.profile, acks))


if __name__ == "__main__":
    main()
