"""A bounded pool of reusable host buffers in size classes.

One pool serves two users that both want the same property, memory whose address never moves
and that is expensive to set up:

* GPU staging copies device memory into these buffers; with a GPU they are *pinned*
  (page-locked through CuPy) so ``cudaMemcpyAsync`` is truly asynchronous and runs at full
  PCIe speed.
* The RDMA transport registers them as memory regions (``ibv_reg_mr``) once, through a
  :class:`MemoryRegistrar`, instead of registering every message's memory.

Why a pool at all: pinning and registration cost far more than a memcpy, so buffers are reused
rather than allocated per message; and memory held for staging or RDMA must be bounded by
config, never by luck. The pool never allocates past ``max_bytes``: an :meth:`BufferPool.acquire`
that would exceed it first frees idle buffers of other size classes and otherwise waits until a
buffer is released (back-pressure). A request larger than the largest size class is an error:
callers split their data into chunks of at most :attr:`BufferPool.max_buffer_bytes`.

The pool is used from one event loop (acquire/release are not thread-safe); worker threads may
read and write a buffer's memory while they hold it.
"""

from __future__ import annotations

import asyncio
import bisect
import mmap
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import numpy as np

from ..errors import DeviceUnavailable
from ..log import get_logger
from ..stats import BufferPoolStats
from .discovery import Devices

__all__ = [
    "DEFAULT_SIZE_CLASSES",
    "BufferPool",
    "HostAllocator",
    "MemoryRegistrar",
    "PinnedAllocator",
    "PlainAllocator",
    "PooledBuffer",
]

log = get_logger("aionet.buffers")

KiB, MiB = 1 << 10, 1 << 20
DEFAULT_SIZE_CLASSES: tuple[int, ...] = (64 * KiB, 1 * MiB, 4 * MiB, 16 * MiB)
DEFAULT_MAX_BYTES = 256 * MiB


class HostAllocator(Protocol):
    """Allocates host memory for the pool. ``alloc`` returns a flat uint8 array whose
    address is stable for its lifetime; ``pinned`` says whether it is page-locked."""

    pinned: bool

    def alloc(self, nbytes: int) -> np.ndarray: ...


class PlainAllocator:
    """Page-aligned anonymous memory (``mmap``): page alignment keeps RDMA registration and
    later pinning cheap, and anonymous pages are not touched until first written."""

    pinned = False

    def alloc(self, nbytes: int) -> np.ndarray:
        mm = mmap.mmap(-1, nbytes)
        return np.frombuffer(mm, dtype=np.uint8, count=nbytes)


class PinnedAllocator:
    """Page-locked memory from CuPy's pinned allocator (``cudaHostAlloc``).

    Raises :class:`~aionet.errors.DeviceUnavailable` at construction when CUDA is unusable
    (``devices`` says whether it is: the node's :class:`~aionet.devices.discovery.Devices`), so
    a pool never silently pretends to be pinned.
    """

    pinned = True

    def __init__(self, devices: Devices) -> None:
        devices.require_cuda("pinned host memory")
        try:
            import cupyx
        except ImportError as exc:  # cupy present but cupyx missing: a broken install
            raise DeviceUnavailable(f"no CUDA device: cupyx cannot be imported: {exc}") from exc
        self._empty_pinned = cupyx.empty_pinned

    def alloc(self, nbytes: int) -> np.ndarray:
        return self._empty_pinned((nbytes,), dtype=np.uint8)


class MemoryRegistrar(Protocol):
    """Registers host memory with a device (e.g. an RDMA protection domain).

    ``register`` returns an opaque region handle (for RDMA: an object with ``lkey`` and
    ``rkey``); ``deregister`` releases it. Both are called on the pool's event loop."""

    def register(self, memory: np.ndarray) -> Any: ...

    def deregister(self, region: Any) -> None: ...


class PooledBuffer:
    """A buffer on loan from a :class:`BufferPool`. Return it with :meth:`release` (or use
    ``async with pool.lease(n)``); using it after release is a bug the pool cannot see."""

    __slots__ = ("_pool", "_released", "array", "capacity", "nbytes", "regions")

    def __init__(self, pool: BufferPool, array: np.ndarray) -> None:
        self._pool = pool
        self.array = array  # the whole buffer (capacity bytes), flat uint8
        self.capacity = int(array.nbytes)
        self.nbytes = 0  # bytes requested by the current borrower
        self.regions: dict[int, Any] = {}  # registrar id -> region handle
        self._released = True

    @property
    def view(self) -> memoryview:
        """A writable memoryview of the requested length."""
        return memoryview(self.array)[: self.nbytes]

    @property
    def address(self) -> int:
        return int(self.array.ctypes.data)

    @property
    def pinned(self) -> bool:
        return self._pool.pinned

    def region(self, registrar: MemoryRegistrar) -> Any:
        """The region handle ``registrar`` made for this buffer (KeyError if not registered)."""
        return self.regions[id(registrar)]

    def release(self) -> None:
        self._pool.release(self)

    def __repr__(self) -> str:
        return f"<PooledBuffer {self.nbytes}/{self.capacity} B at {self.address:#x}>"


class BufferPool:
    """Reusable host buffers in size classes, bounded by ``max_bytes``.

    Args:
        size_classes: buffer sizes; a request gets the smallest class that fits.
        max_bytes: upper bound on memory the pool holds (in use plus idle).
        pinned: True = page-locked via CuPy (raises DeviceUnavailable without CUDA),
            False = plain memory, None = pinned when CUDA is usable here.
        allocator: overrides ``pinned`` (tests, custom memory).
        devices: where to ask whether CUDA works (a node passes its one
            :class:`~aionet.devices.discovery.Devices`); without it a pinned or auto pool
            probes for itself.
    """

    def __init__(
        self,
        *,
        size_classes: tuple[int, ...] | list[int] = DEFAULT_SIZE_CLASSES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        pinned: bool | None = False,
        allocator: HostAllocator | None = None,
        devices: Devices | None = None,
    ) -> None:
        classes = sorted({int(c) for c in size_classes})
        if not classes or classes[0] <= 0:
            raise ValueError("size_classes must be positive sizes")
        if max_bytes < classes[-1]:
            raise ValueError(f"max_bytes ({max_bytes}) must hold at least one largest buffer ({classes[-1]})")
        self.size_classes: tuple[int, ...] = tuple(classes)
        self.max_bytes = int(max_bytes)
        if allocator is None:
            if pinned is None or pinned:
                # standalone use (tests, benchmarks) probes CUDA itself; a node passes its own
                devices = devices if devices is not None else Devices(use_nvml=False)
                pinned = devices.cuda_available() if pinned is None else pinned
            allocator = PinnedAllocator(devices) if pinned else PlainAllocator()
        self._alloc = allocator
        self._free: dict[int, list[PooledBuffer]] = {c: [] for c in classes}
        self._all: list[PooledBuffer] = []
        self._allocated = 0
        self._in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._registrars: list[MemoryRegistrar] = []
        self._closed = False
        self._stats = {"acquires": 0, "allocations": 0, "reuses": 0, "evictions": 0, "waits": 0}

    # ------------------------------------------------------------------ info
    @property
    def pinned(self) -> bool:
        return bool(getattr(self._alloc, "pinned", False))

    @property
    def max_buffer_bytes(self) -> int:
        """The largest single buffer this pool hands out."""
        return self.size_classes[-1]

    @property
    def allocated_bytes(self) -> int:
        return self._allocated

    @property
    def in_use(self) -> int:
        """Buffers currently on loan."""
        return self._in_use

    def stats(self) -> BufferPoolStats:
        return BufferPoolStats(
            **self._stats,
            allocated_bytes=self._allocated,
            max_bytes=self.max_bytes,
            in_use=self._in_use,
            idle=sum(len(v) for v in self._free.values()),
            waiters=len(self._waiters),
            pinned=self.pinned,
            registered_with=len(self._registrars),
        )

    def size_class(self, nbytes: int) -> int:
        """The class serving a request of ``nbytes`` (ValueError if none is large enough)."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        i = bisect.bisect_left(self.size_classes, max(nbytes, 1))
        if i == len(self.size_classes):
            raise ValueError(
                f"request of {nbytes} bytes exceeds the largest buffer size class "
                f"({self.max_buffer_bytes} bytes); split the data into chunks"
            )
        return self.size_classes[i]

    # ------------------------------------------------------------------ acquire / release
    def try_acquire(self, nbytes: int) -> PooledBuffer | None:
        """A buffer of at least ``nbytes`` now, or None if the pool is at its bound."""
        if self._closed:
            raise RuntimeError("buffer pool is closed")
        cls = self.size_class(nbytes)
        if self._waiters:  # keep FIFO order: do not overtake a waiting acquirer
            return None
        return self._take(cls, nbytes)

    async def acquire(self, nbytes: int) -> PooledBuffer:
        """A buffer of at least ``nbytes``; waits (back-pressure) while the pool is full."""
        buf = self.try_acquire(nbytes)
        if buf is not None:
            return buf
        cls = self.size_class(nbytes)
        self._stats["waits"] += 1
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            while True:
                await fut
                if self._closed:
                    raise RuntimeError("buffer pool is closed")
                if self._waiters and self._waiters[0] is fut:
                    buf = self._take(cls, nbytes)
                    if buf is not None:
                        self._waiters.popleft()
                        self._wake_next()
                        return buf
                fut = asyncio.get_running_loop().create_future()
                self._waiters[0] = fut  # still first in line; wait for the next release
        except BaseException:
            try:
                self._waiters.remove(fut)
            except ValueError:
                pass
            self._wake_next()
            raise

    @asynccontextmanager
    async def lease(self, nbytes: int) -> AsyncIterator[PooledBuffer]:
        buf = await self.acquire(nbytes)
        try:
            yield buf
        finally:
            buf.release()

    def release(self, buf: PooledBuffer) -> None:
        if buf._pool is not self:
            raise ValueError("buffer belongs to another pool")
        if buf._released:
            raise RuntimeError(f"{buf!r} released twice")
        buf._released = True
        buf.nbytes = 0
        self._in_use -= 1
        if self._closed:
            self._drop(buf)
            return
        self._free[buf.capacity].append(buf)
        self._wake_next()

    def _take(self, cls: int, nbytes: int) -> PooledBuffer | None:
        free = self._free[cls]
        if free:
            buf = free.pop()
            self._stats["reuses"] += 1
        else:
            if self._allocated + cls > self.max_bytes and not self._evict(cls):
                return None
            buf = self._new_buffer(cls)
        buf._released = False
        buf.nbytes = nbytes
        self._in_use += 1
        self._stats["acquires"] += 1
        return buf

    def _evict(self, need: int) -> bool:
        """Free idle buffers of other classes until ``need`` more bytes fit under the bound."""
        idle = sorted((b for bs in self._free.values() for b in bs), key=lambda b: b.capacity)
        room = self.max_bytes - self._allocated
        if room + sum(b.capacity for b in idle) < need:
            return False
        for b in idle:  # smallest first: keeps the big (expensive) buffers around
            if room >= need:
                break
            self._free[b.capacity].remove(b)
            self._drop(b)
            self._stats["evictions"] += 1
            room = self.max_bytes - self._allocated
        return room >= need

    def _new_buffer(self, cls: int) -> PooledBuffer:
        buf = PooledBuffer(self, self._alloc.alloc(cls))
        self._allocated += cls
        self._all.append(buf)
        self._stats["allocations"] += 1
        for r in self._registrars:
            buf.regions[id(r)] = r.register(buf.array)
        return buf

    def _drop(self, buf: PooledBuffer) -> None:
        for r in self._registrars:
            region = buf.regions.pop(id(r), None)
            if region is not None:
                try:
                    r.deregister(region)
                except Exception as exc:
                    log.warning("deregistering a pool buffer failed", error=repr(exc))
        self._allocated -= buf.capacity
        self._all.remove(buf)

    def _wake_next(self) -> None:
        if self._waiters and not self._waiters[0].done():
            self._waiters[0].set_result(None)

    # ------------------------------------------------------------------ registration
    def add_registrar(self, registrar: MemoryRegistrar) -> None:
        """Register every buffer (now and future) with ``registrar`` (e.g. an RDMA PD)."""
        if any(r is registrar for r in self._registrars):
            return
        done: list[PooledBuffer] = []
        try:
            for b in self._all:
                b.regions[id(registrar)] = registrar.register(b.array)
                done.append(b)
        except BaseException:
            for b in done:
                registrar.deregister(b.regions.pop(id(registrar)))
            raise
        self._registrars.append(registrar)

    def remove_registrar(self, registrar: MemoryRegistrar) -> None:
        """Deregister every buffer from ``registrar`` (the transport is shutting down)."""
        if not any(r is registrar for r in self._registrars):
            return
        self._registrars = [r for r in self._registrars if r is not registrar]
        for b in self._all:
            region = b.regions.pop(id(registrar), None)
            if region is not None:
                try:
                    registrar.deregister(region)
                except Exception as exc:
                    log.warning("deregistering a pool buffer failed", error=repr(exc))

    def close(self) -> None:
        """Free idle buffers and fail waiters; buffers on loan are freed when released."""
        if self._closed:
            return
        self._closed = True
        for bs in self._free.values():
            for b in bs:
                self._drop(b)
            bs.clear()
        for r in list(self._registrars):
            self.remove_registrar(r)
        for w in self._waiters:
            if not w.done():
                w.set_result(None)
