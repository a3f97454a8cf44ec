"""Arrays that start on a page boundary, for the buffers the kernel receives into.

numpy starts a large array 16 bytes into its mapping; torch's CPU allocator 64 bytes. On this
project's test machine (AMD EPYC, Linux) where a received byte lands changed what the native ring
cost (BENCHMARKS.md, "Array alignment"):
- at 4 ranks and 64 MiB, 5-20 % more CPU with the arrays 16 bytes past a page than on one,
  50-60 % more at 8 bytes past;
- at 2 ranks and 16 MiB, 15-50 % more time with them 64 bytes past a page than on one.
Page-aligned arrays were the fastest or level in every case measured. aionet allocates its own
results and scratch buffers with these helpers; numpy users can allocate their ``out=`` arrays
with them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Bytes: a page (the fastest alignment measured; a cache line is not enough, above).
ALIGN = 4096


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
