"""Arrays that start on a cache-line boundary, for the buffers the kernel receives into.

numpy starts a large array 16 bytes into its mapping. On this project's test machine (AMD EPYC,
Linux) the kernel's copy of received bytes into such a destination cost measurably more: the
native ring spent 10-15 % more CPU per 64 MiB allreduce with its result array 16 bytes past a
64-byte boundary, and about 50 % more at 8 bytes past (BENCHMARKS.md, "Array alignment"). torch's
CPU allocator already aligns to 64 bytes; these helpers give numpy users the same, and aionet
allocates its own results and scratch buffers with them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Bytes: a cache line, and what torch's CPU allocator guarantees.
ALIGN = 64


def empty_aligned(shape: int | tuple[int, ...], dtype: Any = np.float32, *, align: int = ALIGN) -> np.ndarray:
    """An uninitialized C-contiguous array whose first byte sits on an ``align``-byte boundary
    (a power of two). Use it for ``out=`` buffers and arrays you allreduce in place. (An empty
    array has no first byte: numpy gives it a pointer of its own.)"""
    if align < 1 or align & (align - 1):
        raise ValueError(f"align must be a power of two, got {align}")
    dt = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = math.prod(dims) * dt.itemsize
    if nbytes == 0:
        return np.empty(dims, dt)
    raw = np.empty(nbytes + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start : start + nbytes].view(dt).reshape(dims)


def empty_like_aligned(x: np.ndarray, *, align: int = ALIGN) -> np.ndarray:
    """``np.empty_like(x)`` (C order), aligned as :func:`empty_aligned` aligns."""
    return empty_aligned(x.shape, x.dtype, align=align)


def is_aligned(x: np.ndarray, align: int = ALIGN) -> bool:
    """Whether ``x``'s first byte sits on an ``align``-byte boundary."""
    return x.ctypes.data % align == 0
