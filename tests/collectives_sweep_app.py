"""A rank of a launched world (tests/system/test_collectives_processes.py): every allreduce
algorithm into a new array, a separate ``out=`` and in place, then the other collectives, at
sizes from one segment to many, against numpy's answer over the same inputs. Prints one JSON
line: the rank, the ring's pieces per chunk and the busy-poll window it runs with, and every wrong
result."""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

import aionet

SIZES = (300_000, (16 << 20) + 12)  # bytes: one ring segment per chunk; several, pipelined
ALGORITHMS = ("auto", "ring", "direct")


def inputs(nbytes: int, n: int) -> list[np.ndarray]:
    """Every rank's input (each rank builds them all alike: the expected results need them)."""
    count = nbytes // 4
    return [np.random.default_rng(100 * r + count % 97).integers(-20, 20, count).astype(np.float32) for r in range(n)]


async def sweep(grp: Any) -> list[str]:
    bad: list[str] = []
    n, rank = grp.size, grp.rank
    for nbytes in SIZES:
        xs = inputs(nbytes, n)
        mine = xs[rank]
        for op, red in (("sum", np.add.reduce), ("max", np.maximum.reduce)):
            expect = red(np.stack(xs))
            for alg in ALGORITHMS:
                for to in ("new", "out", "inplace"):
                    for _ in range(2):
                        if to == "inplace":
                            got = mine.copy()
                            await grp.allreduce(got, op=op, algorithm=alg, out=got)
                        elif to == "out":
                            got = np.full_like(mine, np.nan)
                            await grp.allreduce(mine, op=op, algorithm=alg, out=got)
                        else:
                            got = await grp.allreduce(mine, op=op, algorithm=alg)
                        if not np.array_equal(got, expect):
                            bad.append(f"{nbytes} B {op} {alg} {to}: {int(np.count_nonzero(got != expect))} wrong")
        total = np.add.reduce(np.stack(xs))
        if not np.array_equal(await grp.broadcast(mine if rank == 0 else None, root=0), xs[0]):
            bad.append(f"{nbytes} B broadcast")
        if not all(np.array_equal(a, x) for a, x in zip(await grp.allgather(mine), xs, strict=True)):
            bad.append(f"{nbytes} B allgather")
        block = await grp.reduce_scatter(mine)
        if not np.array_equal(np.concatenate(await grp.allgather(block)), total):
            bad.append(f"{nbytes} B reduce_scatter")
        got = mine.copy()
        await grp.reduce(got, root=n - 1, out=got)
        if rank == n - 1 and not np.array_equal(got, total):
            bad.append(f"{nbytes} B reduce in place")
        part = max(1, nbytes // 4 // n)
        parts = await grp.alltoall([np.full(part, 10 * rank + j, np.float32) for j in range(n)])
        if not all(np.array_equal(p, np.full(part, 10 * j + rank, np.float32)) for j, p in enumerate(parts)):
            bad.append(f"{nbytes} B alltoall")
    return bad


async def main() -> int:
    async with aionet.Node.from_env() as node:
        grp = node.group()
        bad = await sweep(grp)
        out = {
            "rank": node.rank,
            "pipeline_segments": node.config.collectives.pipeline_segments,
            "busy_poll_us": node.config.node.busy_poll_us,
            "bad": bad,
        }
        print(json.dumps(out), flush=True)
        await grp.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(aionet.run(main()))
