#!/usr/bin/env python
"""Python calls per large allreduce per rank, by function and by layer (cProfile call counts).

    python benchmarks/collectives_calls.py --nodes 4 --mib 16,64 --calls 3 [--top 40]

Every rank is an in-process node over tcp://127.0.0.1 (one loop, so the counts are summed over the
ranks and divided). Call counts do not move with the machine's load the way CPU time does, apart
from the reads a large message takes (the kernel's queue at each wake-up). Background timers
(heartbeats, gossip, load samples) are kept apart two ways: ``--heartbeat`` (s, default 30)
stretches the membership interval so few fire during the measurement, and the same wall time is
then profiled idle and printed as the background share. A builtin call (``len``, ``dict.get``) is
counted under the layer of the function that made it. Compare trees by running it from each,
with ``PYTHONPATH`` set to the tree.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import pstats
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import uvloop  # noqa: E402

from aionet.testing import cluster  # noqa: E402


def layer(filename: str) -> str | None:
    """aionet's package of a profiled function (``core``, ``codecs``...), else a short origin;
    None for builtins (attributed to their callers)."""
    if filename == "~":
        return None
    if "aionet/" in filename:
        rel = filename.split("aionet/")[-1]
        return rel.rsplit("/", 1)[0] if "/" in rel else rel
    return "asyncio" if "asyncio" in filename else "other"


def by_layer(st: Any, div: float) -> list[tuple[str, float]]:
    tot: collections.Counter[str] = collections.Counter()
    for (f, _l, _n), (_cc, nc, _tt, _ct, callers) in st.stats.items():
        own = layer(f)
        if own is not None:
            tot[own] += nc
            continue
        total = sum(v[0] for v in callers.values()) or 1
        for (cf, _cl, _cn), v in callers.items():
            tot[layer(cf) or "other"] += nc * v[0] / total
    return [(k, v / div) for k, v in tot.most_common()]


async def run(n: int, mib: list[int], calls: int, heartbeat: float, top: int) -> None:
    async with cluster(n, "tcp", config={"heartbeat": {"interval": heartbeat}}) as nodes:
        groups = [nd.group() for nd in nodes]
        for size in mib:
            xs = [np.ones((size << 20) // 4, np.float32) for _ in groups]
            ys = [np.empty_like(x) for x in xs]

            async def loop(g: Any, k: int, xs: list[np.ndarray] = xs, ys: list[np.ndarray] = ys) -> None:
                for _ in range(k):
                    await g.allreduce(xs[g.rank], out=ys[g.rank])

            await asyncio.gather(*(loop(g, 3) for g in groups))  # warm-up
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            prof.enable()
            await asyncio.gather(*(loop(g, calls) for g in groups))
            prof.disable()
            wall = time.perf_counter() - t0
            assert all((y == n).all() for y in ys), "wrong result"
            idle = cProfile.Profile()
            idle.enable()
            await asyncio.sleep(wall)
            idle.disable()
            st, st_idle = pstats.Stats(prof), pstats.Stats(idle)
            div = calls * n
            print(
                f"n={n} {size} MiB: {st.total_calls / div:.0f} Python calls per rank per call "  # type: ignore[attr-defined]
                f"({wall / calls * 1e3:.0f} ms/call); background alone over the same time: "
                f"{st_idle.total_calls / div:.0f}"  # type: ignore[attr-defined]
            )
            print("  by layer: " + ", ".join(f"{k} {v:.0f}" for k, v in by_layer(st, div)))
            rows = sorted(st.stats.items(), key=lambda kv: -kv[1][1])[:top]  # type: ignore[attr-defined]
            for (f, line, name), (_cc, nc, *_rest) in rows:
                print(f"  {nc / div:8.1f}  {f.split('aionet/')[-1]}:{line}({name})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--mib", default="16,64", help="array sizes in MiB, comma-separated")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--heartbeat", type=float, default=30.0, help="membership interval (s) while measuring")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    uvloop.run(run(args.nodes, [int(m) for m in args.mib.split(",")], args.calls, args.heartbeat, args.top))


if __name__ == "__main__":
    main()
