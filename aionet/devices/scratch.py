"""Reusable host working copies of device arrays, for collectives that reduce on the host.

A collective on a GPU array copies it to host memory, runs the ring (or tree) there, and copies
the result back. Into fresh pageable memory (``numpy.empty``) both copies run at a fraction of
the bus speed (on an H200: 14 GB/s device->host and 7.8 GB/s host->device pageable, against
55 GB/s pinned), and every call faults in the whole array again. Training calls the same
allreduce on the same gradient sizes every step, so the host copies are worth keeping: pinned
once (``cudaHostAlloc`` costs far more than a copy) and handed out again for the next call of
the same size.

:class:`HostScratch` is that cache. :meth:`HostScratch.take` lends a flat buffer of at least
the asked size (an idle one when one fits, else a new one), :meth:`HostScratch.give` takes it
back once nothing references it any more. Idle buffers are bounded by ``max_bytes`` (the
oldest are dropped first); an array larger than the bound gets plain memory, used once.
A buffer that is never given back (a collective that failed, whose sends may still reference
it) is simply left to the garbage collector: correctness never depends on giving back.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .buffers import HostAllocator

__all__ = ["HostScratch"]

#: Buffers are allocated in multiples of this (a page multiple; sizes that differ by a few
#: bytes share one buffer).
GRANULE = 64 * 1024


class HostScratch:
    """Lends host buffers for device arrays' working copies and keeps them for reuse.

    Args:
        allocator: where new buffers come from (pinned with a GPU, plain mmap otherwise).
        max_bytes: idle buffers kept at most this many bytes; larger requests are not cached.
    """

    def __init__(self, allocator: HostAllocator, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.allocator = allocator
        self.max_bytes = int(max_bytes)
        self._idle: OrderedDict[int, np.ndarray] = OrderedDict()  # address -> buffer, oldest first
        self._idle_bytes = 0
        self._lent: dict[int, np.ndarray] = {}  # address -> buffer
        self.reused = 0  # takes served by an idle buffer
        self.allocated = 0  # takes that allocated

    @property
    def pinned(self) -> bool:
        return bool(self.allocator.pinned)

    @property
    def idle_bytes(self) -> int:
        return self._idle_bytes

    def take(self, nbytes: int) -> np.ndarray:
        """A flat uint8 array of exactly ``nbytes`` in a lent buffer (contents undefined)."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        want = max(GRANULE, -(-nbytes // GRANULE) * GRANULE)
        if want > self.max_bytes:
            self.allocated += 1
            return np.empty(nbytes, dtype=np.uint8)  # too big to keep: plain memory, used once
        best = None
        for addr, buf in self._idle.items():
            # the smallest idle buffer that fits, but never one more than twice the size asked
            if want <= buf.nbytes <= 2 * want and (best is None or buf.nbytes < self._idle[best].nbytes):
                best = addr
        if best is not None:
            buf = self._idle.pop(best)
            self._idle_bytes -= buf.nbytes
            self.reused += 1
        else:
            buf = self.allocator.alloc(want)
            self.allocated += 1
        self._lent[_address(buf)] = buf
        return buf[:nbytes]

    def give(self, arr: np.ndarray) -> None:
        """Take back what :meth:`take` lent (any view starting at its first byte); other
        arrays are ignored. The caller promises nothing references the memory any more."""
        buf = self._lent.pop(_address(arr), None)
        if buf is None:
            return
        self._idle[_address(buf)] = buf
        self._idle_bytes += buf.nbytes
        while self._idle_bytes > self.max_bytes and self._idle:
            _, old = self._idle.popitem(last=False)
            self._idle_bytes -= old.nbytes

    def clear(self) -> None:
        """Drop every idle buffer (lent ones are forgotten: they are freed when unreferenced)."""
        self._idle.clear()
        self._idle_bytes = 0
        self._lent.clear()


def _address(arr: np.ndarray) -> int:
    return int(arr.__array_interface__["data"][0])
