"""The measuring loop of ``aionet bench OP``, run by every rank of a group: nccl-tests' columns
(time, algbw, busbw, #wrong) for each size, out of place and, for allreduce, in place.

It runs in the bench's own processes, and on the members of a running cluster when ``aionet
bench --connect URL`` asks them (the ``aionet.collectives.bench`` service): then every member
creates the same group and runs this loop; rank 0's rows are the answer.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .aligned import empty_aligned

__all__ = ["BENCH_SERVICE", "BUS", "DEVICES", "OPS", "array_module", "measure", "warm_array_module"]

BENCH_SERVICE = "aionet.collectives.bench"
OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter")
#: where the benchmarked buffers live: host numpy arrays, or CuPy arrays on the current GPU
DEVICES = ("cpu", "gpu")
#: busbw = algbw * what each rank's link carries, so results compare across group sizes
BUS: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}


def array_module(device: str) -> Any:
    """numpy for ``cpu``; CuPy for ``gpu``, imported only then, with the reason when this node
    cannot (no CuPy, no driver, no device)."""
    if device == "cpu":
        return np
    if device != "gpu":
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, not {device!r}")
    from ..devices import Devices

    Devices(use_nvml=False).require_cuda("aionet bench --device gpu")
    import cupy

    return cupy


def warm_array_module(device: str) -> Any:
    """``array_module`` with the GPU context already created: CuPy's first allocation takes
    about half a second, which must not run on an event loop (peers would see a stall)."""
    xp = array_module(device)
    if xp is not np:
        xp.zeros(1, dtype=xp.uint8)
    return xp


async def measure(
    grp: Any,
    op: str,
    sizes: list[int],
    iters: int,
    warmup: int,
    report: Callable[[dict[str, Any]], None] | None = None,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """Time ``op`` on ``grp`` at each size; every rank runs this, every rank gets the rows.
    ``device="gpu"``: the buffers are CuPy arrays (staged through host copies); the in-place
    variant is skipped there, since ``out=`` takes host arrays. Out of place, a host allreduce
    writes into one preallocated receive buffer (nccl-tests' ``recvbuff``), not a new array."""
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, not {op!r}")
    xp = await asyncio.to_thread(warm_array_module, device)
    n, rank = grp.size, grp.rank
    rows = []
    for size in sizes:
        count = max(1, size // 4)
        if op == "allgather":
            count = max(1, count // n)  # size is the gathered output
        row: dict[str, Any] = {"size": size, "count": count, "type": "float", "device": device,
                               "redop": "sum" if op in ("allreduce", "reduce_scatter") else "-"}  # fmt: skip
        for variant in ("out", "in"):
            if variant == "in" and (op != "allreduce" or xp is not np):
                continue  # only allreduce writes into its input (out=), and only host arrays
            times, wrong = [], 0
            recv = empty_aligned(count) if op == "allreduce" and xp is np else None  # on a page: fastest here
            for i in range(warmup + iters):
                if xp is np:
                    x = empty_aligned(count)
                    x.fill(rank + 1)
                else:
                    x = xp.full(count, rank + 1, dtype=xp.float32)
                await grp.barrier()
                t = time.perf_counter()
                got = await _call(grp, op, x, variant, recv)
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


async def _call(grp: Any, op: str, x: np.ndarray, variant: str, recv: np.ndarray | None = None) -> Any:
    if op == "allreduce":
        return await grp.allreduce(x, out=x if variant == "in" else recv)
    if op == "broadcast":
        return await grp.broadcast(x if grp.rank == 0 else None, root=0)
    if op == "allgather":
        return await grp.allgather(x)
    return await grp.reduce_scatter(x)


def _host(a: Any) -> np.ndarray:
    """A result as a host array: CuPy's ``.get()`` copies device memory back (np.asarray refuses)."""
    return np.asarray(a) if isinstance(a, np.ndarray) or not hasattr(a, "get") else a.get()


def _wrong(op: str, got: Any, n: int) -> int:
    """Elements that differ from the expected result (rank r contributes r + 1 everywhere)."""
    total = n * (n + 1) / 2
    if op in ("allreduce", "reduce_scatter"):
        return int(np.count_nonzero(_host(got) != total))
    if op == "broadcast":
        return int(np.count_nonzero(_host(got) != 1))  # rank 0's value
    return sum(int(np.count_nonzero(_host(part) != i + 1)) for i, part in enumerate(got))
