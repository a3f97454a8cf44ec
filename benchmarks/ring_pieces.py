#!/usr/bin/env python
"""CPU per large ring allreduce with whole chunks against pipelined pieces, alternated call by call.

    python benchmarks/ring_pieces.py --nodes 4 --mib 16 --calls 10 --pieces 1,2

Every rank is an in-process node over tcp://127.0.0.1 on one loop (one thread), so no rank waits
for a core and the machine's scheduler does not enter: what differs between the variants is the
work itself (each piece's Python on both ends, its syscalls and wake-ups, the kernel's copies).
Each call sets ``pipeline`` (``collectives.pipeline_segments``: pieces per ring chunk, at least)
on every rank's group, then times ``allreduce(x, out=y)`` of float32 with ``getrusage`` (the
process: all ranks together). Prints, per variant, the median and minimum CPU per call and CPU
seconds per GB of the array per rank. Context for ``aionet.launch.local.shared_cores_settings``.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import uvloop  # noqa: E402

from aionet.testing import cluster  # noqa: E402


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def main(n: int, mib: int, calls: int, pieces: list[int]) -> None:
    async with cluster(n, "tcp") as nodes:
        names = sorted(x.name for x in nodes)
        by_name = {x.name: x for x in nodes}
        groups = [by_name[m].group(names) for m in names]
        xs = [np.ones(mib * 2**18, np.float32) for _ in groups]
        ys = [np.empty_like(x) for x in xs]

        async def one(p: int) -> tuple[float, float]:
            for g in groups:
                g.pipeline = p  # every rank alike, as the setting must be
            c0, t0 = cpu_s(), time.perf_counter()
            await asyncio.gather(*(g.allreduce(x, out=y) for g, x, y in zip(groups, xs, ys, strict=True)))
            return cpu_s() - c0, time.perf_counter() - t0

        for p in pieces:  # warm-up: buffers, connections
            await one(p)
        got: dict[int, list[tuple[float, float]]] = {p: [] for p in pieces}
        for _ in range(calls):
            for p in pieces:
                got[p].append(await one(p))
        if not all(np.array_equal(y, np.full_like(y, n)) for y in ys):
            raise SystemExit("wrong result")
        gb = mib * 2**20 / 1e9
        print(f"n = {n}, {mib} MiB float32, {calls} calls per variant, alternated (CPU: all ranks, one process)")
        for p in pieces:
            cpu = [c for c, _ in got[p]]
            wall = [w for _, w in got[p]]
            med = statistics.median(cpu)
            print(
                f"  pipeline_segments {p}: CPU per call median {med * 1e3:6.1f} ms (min {min(cpu) * 1e3:6.1f}), "
                f"wall {statistics.median(wall) * 1e3:6.1f} ms, {med / n / gb:.3f} s/GB/rank"
            )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--mib", type=int, default=16, help="array size per rank, MiB")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--pieces", default="1,2", help="pipeline_segments values, comma separated, alternated")
    a = ap.parse_args()
    uvloop.run(main(a.nodes, a.mib, a.calls, [int(p) for p in a.pieces.split(",")]))
