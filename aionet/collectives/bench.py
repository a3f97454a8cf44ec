"""The measuring loop of ``aionet bench OP``, run by every rank of a group: nccl-tests' columns
(time, algbw, busbw, #wrong) for each size, out of place and, for allreduce, in place.

It runs in the bench's own processes, and on the members of a running cluster when ``aionet
bench --connect URL`` asks them (the ``aionet.collectives.bench`` service): then every member
creates the same group and runs this loop; rank 0's rows are the answer.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["BENCH_SERVICE", "BUS", "OPS", "measure"]

BENCH_SERVICE = "aionet.collectives.bench"
OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter")
#: busbw = algbw * what each rank's link carries, so results compare across group sizes
BUS: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}


async def measure(
    grp: Any, op: str, sizes: list[int], iters: int, warmup: int, report: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """Time ``op`` on ``grp`` at each size; every rank runs this, every rank gets the rows."""
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, not {op!r}")
    n, rank = grp.size, grp.rank
    rows = []
    for size in sizes:
        count = max(1, size // 4)
        if op == "allgather":
            count = max(1, count // n)  # size is the gathered output
        row: dict[str, Any] = {"size": size, "count": count, "type": "float",
                               "redop": "sum" if op in ("allreduce", "reduce_scatter") else "-"}  # fmt: skip
        for variant in ("out", "in"):
            if variant == "in" and op != "allreduce":
                continue  # only allreduce writes into its input (out=)
            times, wrong = [], 0
            for i in range(warmup + iters):
                x = np.full(count, rank + 1, dtype=np.float32)
                await grp.barrier()
                t = time.perf_counter()
                got = await _call(grp, op, x, variant)
                if i >= warmup:
                    times.append(time.perf_counter() - t)
                    wrong += _wrong(op, got, n)
            wrong = sum(await grp.allgather(wrong))
            med = statistics.median(times)
            alg = size / med / 1e9
            row[variant] = {"time_us": med * 1e6, "algbw": alg, "busbw": alg * BUS.get(op, lambda _n: 1.0)(n),
                            "wrong": wrong}  # fmt: skip
        rows.append(row)
        if report is not None:
            report(row)
    await grp.barrier()
    return rows


async def _call(grp: Any, op: str, x: np.ndarray, variant: str) -> Any:
    if op == "allreduce":
        return await grp.allreduce(x, out=x if variant == "in" else None)
    if op == "broadcast":
        return await grp.broadcast(x if grp.rank == 0 else None, root=0)
    if op == "allgather":
        return await grp.allgather(x)
    return await grp.reduce_scatter(x)


def _wrong(op: str, got: Any, n: int) -> int:
    """Elements that differ from the expected result (rank r contributes r + 1 everywhere)."""
    total = n * (n + 1) / 2
    if op in ("allreduce", "reduce_scatter"):
        return int(np.count_nonzero(np.asarray(got) != total))
    if op == "broadcast":
        return int(np.count_nonzero(np.asarray(got) != 1))  # rank 0's value
    return sum(int(np.count_nonzero(np.asarray(part) != i + 1)) for i, part in enumerate(got))
