"""GPU staging: move device arrays over transports that only move host memory.

A device array (CuPy, anything with ``__cuda_array_interface__``, or a DLPack array on a CUDA
device) is copied to host memory in chunks, each chunk into a buffer from the
:class:`~aionet.devices.buffers.BufferPool` (pinned when a GPU is present), and sent chunk by chunk.
The copies are *double-buffered*: while chunk ``k`` is on the wire, chunk ``k+1`` is being
copied in a worker thread (which, on a GPU, issues ``cudaMemcpyAsync`` on its own stream and
waits on it with the GIL released). The receiver mirrors this: each arriving chunk is copied
to the destination while the next one is being received. The extra copy is therefore hidden
behind the network instead of added to it (``benchmarks/staging.py`` measures this).

What the CPU benchmark taught (2 cores, sender and receiver in separate processes, so every
CPU-second counts): per-chunk thread handoffs cost more than the memcpys they hide, so host
memcpys run on the event loop queued behind the sends in flight (``host_copies``); fresh
memory is expensive to touch, so the receiver drops each chunk's frame as soon as it is copied
(the transport reuses it), can receive chunks straight into pool buffers or, without a GPU,
into the final array (:meth:`Receiver.alloc`), and the simulated device reuses destination
memory like CuPy's memory pool (:class:`CachingAllocator`); 1 MiB chunks stay in cache
between the staging copy and the kernel's copy.

Transports that move device memory themselves (``Connection.moves_device_memory``, e.g. UCX
built with CUDA) skip staging: :meth:`Stager.encode` hands them the device buffer as a frame.

Everything device-specific sits behind a small
:class:`~aionet.devices.backends.ArrayBackend` interface (:mod:`aionet.devices.backends`: CuPy,
the simulated device, the no-GPU host target), so the whole pipeline runs and is tested on the
CPU.

Integration (serializer / connection layer)::

    stager = Stager(pool=pool)                       # one per node
    if is_device_array(obj):
        meta, frames = stager.encode(obj)            # sync: whole array -> host frames
        ...
        arr = stager.decode(meta, frames)            # cupy on this device, or numpy

    # streaming, overlapped with the network:
    meta = stager.header(obj)
    async with stager.chunks(obj) as chunks:
        async for chunk in chunks:                   # chunk k+1 is copied while you send k
            await conn.send([chunk])
    rx = stager.receiver(meta)
    for _ in range(meta["nchunks"]):
        await rx.feed((await conn.recv())[0])
    arr = await rx.finish()
    # or: await stager.send_array(obj, conn.send) / await stager.recv_array(meta, conn.recv)
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..codecs.dtypes import check_descr_bounds
from ..errors import DecodeError, DeviceUnavailable, FrameTooLarge, SerializationError
from ..log import get_logger
from .backends import (
    ArrayBackend,
    CachingAllocator,
    CupyBackend,
    HostTarget,
    NoDevice,
    SimulatedDeviceBackend,
    check_dtype,
    is_device_array,
    source_kind,
)
from .buffers import BufferPool, PinnedAllocator, PlainAllocator, PooledBuffer
from .discovery import Devices
from .scratch import HostScratch

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_DEPTH",
    "ChunkStream",
    "Receiver",
    "Stager",
]

log = get_logger("aionet.staging")

DEFAULT_CHUNK_BYTES = 1 << 20  # measured best of 512 KiB..8 MiB: see benchmarks/staging.py
DEFAULT_DEPTH = 2  # chunks copied ahead: double buffering (3 measured no better)
DEFAULT_SCRATCH_BYTES = 1 << 30  # idle host working copies kept for collectives (HostScratch)
WIRE_VERSION = 1


# ---------------------------------------------------------------------------- the stager
class Stager:
    """Encodes device arrays to host frames and back, optionally streaming and overlapped.

    Args:
        backend: array library for device arrays; default CuPy when CUDA works here, else a
            stand-in that raises :class:`~aionet.errors.DeviceUnavailable` on use.
        pool: staging buffers; default a private plain pool (pinned if CUDA works).
        chunk_bytes: bytes per chunk/frame (capped at the pool's largest buffer).
        depth: chunks in flight (2 = double buffering).
        host_fallback: on a node without a GPU, deliver received device arrays as numpy
            (else raise DeviceUnavailable).
        max_nbytes: largest array accepted from the network.
        devices: whether CUDA works here (a node passes its one
            :class:`~aionet.devices.discovery.Devices`; standalone, the stager probes itself).
        scratch_max_bytes: idle host working copies (:meth:`borrow_host`) kept at most this
            many bytes; pinned when the backend is a real device.
    """

    def __init__(
        self,
        *,
        backend: ArrayBackend | None = None,
        pool: BufferPool | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        depth: int = DEFAULT_DEPTH,
        host_fallback: bool = True,
        max_nbytes: int = 16 << 30,
        devices: Devices | None = None,
        scratch_max_bytes: int = DEFAULT_SCRATCH_BYTES,
    ) -> None:
        if chunk_bytes <= 0 or depth < 1:
            raise ValueError("chunk_bytes must be positive and depth >= 1")
        # standalone use (tests, benchmarks) probes CUDA itself; a node passes its own Devices
        self._devices = devices if devices is not None else Devices(use_nvml=False)
        if backend is None:
            backend = (
                CupyBackend(self._devices) if self._devices.cuda_available() else NoDevice(self._devices.cuda_reason())
            )
        self.backend: Any = backend
        self._own_pool = pool is None
        self.pool = (
            pool if pool is not None else BufferPool(pinned=None if backend.on_device else False, devices=self._devices)
        )
        self.chunk_bytes = min(int(chunk_bytes), self.pool.max_buffer_bytes)
        self.depth = int(depth)
        self.host_fallback = host_fallback
        self.max_nbytes = int(max_nbytes)
        self._executor: ThreadPoolExecutor | None = None
        self._host_target: HostTarget | None = None
        self._scratch_max = int(scratch_max_bytes)
        self._scratch: HostScratch | None = None

    # ------------------------------------------------------------------ plumbing
    def _run(self, fn: Callable[..., None], *args: Any) -> asyncio.Future[None]:
        if self._executor is None:
            # one copy thread: copies stay in order and do not fight each other for bandwidth
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aionet-staging")
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _copy(self, backend: Any, fn: Callable[..., None], *args: Any) -> asyncio.Future[None]:
        """Start one chunk copy; the future completes when it is done.

        Device copies go to the worker thread. Host memcpys are queued on the loop
        (``call_soon``): they run as soon as the current task yields, i.e. while the sends
        already handed to the transport are in flight -- the same overlap, without a thread
        handoff per chunk."""
        if not getattr(backend, "host_copies", False):
            return self._run(fn, *args)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        loop.call_soon(_run_into, fut, fn, args)
        return fut

    def close(self) -> None:
        """Stop the copy thread, free the pool (if the stager made it) and cached memory."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._own_pool:
            self.pool.close()
        if self._scratch is not None:
            self._scratch.clear()
        for b in (self.backend, self._host_target):
            mem = getattr(b, "memory", None)
            if isinstance(mem, CachingAllocator):
                mem.trim()

    @staticmethod
    def is_device_array(obj: Any) -> bool:
        return is_device_array(obj)

    @staticmethod
    def needs_staging(conn: Any) -> bool:
        """False when ``conn`` moves device memory itself (UCX with CUDA)."""
        return not getattr(conn, "moves_device_memory", False)

    def _meta(self, dtype: np.dtype, shape: tuple[int, ...], order: str, nbytes: int, src: str) -> dict[str, Any]:
        chunk = self.chunk_bytes
        return {
            "v": WIRE_VERSION,
            "dtype": dtype.str if dtype.fields is None else dtype.descr,
            "shape": list(shape),
            "order": order,
            "nbytes": nbytes,
            "chunk": chunk,
            "nchunks": max(1, -(-nbytes // chunk)) if nbytes else 0,
            "src": src,
        }

    def header(self, obj: Any) -> dict[str, Any]:
        """Metadata for ``obj`` (dtype, shape, chunking) without copying anything."""
        flat, dtype, shape, order = self.backend.prepare(obj)
        return self._meta(dtype, shape, order, int(flat.nbytes), source_kind(obj))

    # ------------------------------------------------------------------ sync (serializer)
    def encode(self, obj: Any, *, device_frames: bool = False) -> tuple[dict[str, Any], list[Any]]:
        """(metadata, frames) for a device array. Host frames of at most ``chunk_bytes``
        unless ``device_frames`` (the transport moves device memory): then one device frame."""
        flat, dtype, shape, order = self.backend.prepare(obj)
        nbytes = int(flat.nbytes)
        meta = self._meta(dtype, shape, order, nbytes, source_kind(obj))
        if device_frames:
            meta["nchunks"], meta["chunk"], meta["device"] = 1, max(nbytes, 1), True
            return meta, [flat]
        host = np.empty(nbytes, dtype=np.uint8)
        for off in range(0, nbytes, self.chunk_bytes):
            self.backend.copy_to_host(flat, off, host[off : off + self.chunk_bytes])
        mv = memoryview(host)
        return meta, [mv[off : off + self.chunk_bytes] for off in range(0, nbytes, self.chunk_bytes)]

    def decode(self, meta: Any, frames: Sequence[Any]) -> Any:
        """The array described by ``meta`` from its frames: CuPy on the current device when
        this node has CUDA, numpy if it has not and ``host_fallback`` allows it."""
        dtype, shape, order, nbytes = self._validate(meta)
        target = self._target()
        if meta.get("device") and len(frames) == 1 and target.on_device and is_device_array(frames[0]):
            flat = self._device_frame(frames[0], nbytes)
            return target.finalize(flat, dtype, shape, order)
        views = [_as_bytes_view(f) for f in frames]
        self._check_frames(meta, [v.nbytes for v in views])
        if getattr(target, "host_destination", False) and len(views) == 1 and not views[0].readonly:
            flat = np.frombuffer(views[0], dtype=np.uint8)  # zero-copy: the frame is ours
        else:
            flat = target.empty(nbytes)
            off = 0
            for v in views:
                target.copy_from_host(flat, off, v)
                off += v.nbytes
        return target.finalize(flat, dtype, shape, order)

    def to_host(self, obj: Any) -> np.ndarray:
        """A host (numpy) copy of device array ``obj``, in its dtype and shape."""
        flat, dtype, shape, order = self.backend.prepare(obj)
        nbytes = int(flat.nbytes)
        host = np.empty(nbytes, dtype=np.uint8)
        for off in range(0, nbytes, self.chunk_bytes):
            self.backend.copy_to_host(flat, off, host[off : off + self.chunk_bytes])
        return host.view(dtype).reshape(shape, order=order)

    @property
    def scratch(self) -> HostScratch:
        """The host working copies :meth:`borrow_host` lends (pinned on a real device)."""
        if self._scratch is None:
            on_device = bool(getattr(self.backend, "on_device", False))
            alloc = PinnedAllocator(self._devices) if on_device else PlainAllocator()
            self._scratch = HostScratch(alloc, self._scratch_max)
        return self._scratch

    def borrow_host(self, obj: Any) -> np.ndarray:
        """A host copy of device array ``obj`` in a reusable (pinned, with a GPU) buffer:
        one copy at full bus speed instead of chunks into fresh pageable memory. Hand it back
        with :meth:`give_back` once nothing references it; until then it is the caller's."""
        flat, dtype, shape, order = self.backend.prepare(obj)
        nbytes = int(flat.nbytes)
        host = self.scratch.take(nbytes)
        self.backend.copy_to_host(flat, 0, host)
        return host.view(dtype).reshape(shape, order=order)

    def give_back(self, arr: np.ndarray) -> None:
        """Return what :meth:`borrow_host` lent, for the next call of that size."""
        if self._scratch is not None:
            self._scratch.give(arr)

    def to_device(self, arr: np.ndarray) -> Any:
        """``arr`` copied to this node's device (numpy when it has none and host fallback allows)."""
        a = np.ascontiguousarray(arr)
        target = self._target()
        flat = target.empty(a.nbytes)
        if a.nbytes:
            target.copy_from_host(flat, 0, memoryview(a.reshape(-1).view(np.uint8)))
        return target.finalize(flat, a.dtype, tuple(a.shape), "C")

    def _device_frame(self, frame: Any, nbytes: int) -> Any:
        flat, _, _, _ = self.backend.prepare(frame)
        if int(flat.nbytes) != nbytes:
            raise DecodeError(f"device frame has {flat.nbytes} bytes, header says {nbytes}")
        return flat

    def _target(self) -> Any:
        if getattr(self.backend, "on_device", False) or isinstance(self.backend, SimulatedDeviceBackend):
            return self.backend
        if self.host_fallback:
            if self._host_target is None:
                self._host_target = HostTarget()  # one per stager: its memory cache is reused
            return self._host_target
        raise DeviceUnavailable(
            "no CUDA device: received a device array but this node cannot hold it "
            f"({self._devices.cuda_reason()}) and host fallback is disabled"
        )

    # ------------------------------------------------------------------ validation
    def _validate(self, meta: Any) -> tuple[np.dtype, tuple[int, ...], str, int]:
        """Check a header from the network; everything wrong is a DecodeError."""
        if not isinstance(meta, dict) or meta.get("v") != WIRE_VERSION:
            raise DecodeError(f"device array header: unsupported or missing version: {meta!r:.200}")
        try:
            raw_dt = meta["dtype"]
            check_descr_bounds(raw_dt)  # before numpy: its cost grows with the fields a peer lists
            dtype = np.dtype([tuple(f) for f in raw_dt] if isinstance(raw_dt, list) else raw_dt)
            shape = tuple(int(s) for s in meta["shape"])
            order = meta["order"]
            nbytes, chunk, nchunks = int(meta["nbytes"]), int(meta["chunk"]), int(meta["nchunks"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DecodeError(f"malformed device array header: {exc}") from None
        try:
            check_dtype(dtype)
        except SerializationError as exc:
            raise DecodeError(str(exc)) from None
        if order not in ("C", "F") or any(s < 0 for s in shape) or len(shape) > 64:
            raise DecodeError("device array header: bad shape or order")
        if nbytes > self.max_nbytes:
            raise FrameTooLarge(f"device array of {nbytes} bytes exceeds the limit of {self.max_nbytes}")
        if math.prod(shape) * dtype.itemsize != nbytes:
            raise DecodeError(f"device array header: shape {shape} x {dtype} != {nbytes} bytes")
        if chunk <= 0 or (nchunks != (-(-nbytes // chunk) if nbytes else 0) and not meta.get("device")):
            raise DecodeError("device array header: inconsistent chunking")
        return dtype, shape, order, nbytes

    @staticmethod
    def _check_frames(meta: dict[str, Any], sizes: list[int]) -> None:
        if sum(sizes) != int(meta["nbytes"]):
            raise DecodeError(f"device array frames hold {sum(sizes)} bytes, header says {meta['nbytes']}")

    # ------------------------------------------------------------------ streaming
    def chunks(self, obj: Any) -> ChunkStream:
        """Host chunks of ``obj``, copied ahead (``depth`` in flight) into pool buffers.

        Each yielded memoryview stays valid until the next iteration (then its buffer goes
        back to the pool), which matches ``await conn.send([chunk])`` returning once the
        transport no longer needs the buffer. Use ``async with`` so an early exit returns
        the buffers."""
        return ChunkStream(self, obj)

    async def send_array(
        self, obj: Any, send: Callable[[list[Any]], Awaitable[None]], *, sends_in_flight: int = 2
    ) -> int:
        """Send ``obj``'s chunks as one-frame messages through ``send`` (e.g. ``conn.send``).

        Unlike iterating :meth:`chunks`, up to ``sends_in_flight`` sends run at once, so the
        transport always has the next chunk queued while the kernel drains the previous one,
        and each pool buffer is released when *its* send returns. The caller sends the
        :meth:`header` first. Returns the number of chunks sent."""
        pending: deque[tuple[PooledBuffer, asyncio.Future[None]]] = deque()
        n = 0
        stream = ChunkStream(self, obj, hand_over=True)
        try:
            async for buf in stream:
                try:
                    while len(pending) >= sends_in_flight:
                        b, t = pending.popleft()
                        try:
                            await t
                        finally:
                            b.release()
                except BaseException:
                    buf.release()
                    raise
                pending.append((buf, asyncio.ensure_future(send([buf.view]))))
                n += 1
            while pending:
                b, t = pending.popleft()
                try:
                    await t
                finally:
                    b.release()
        finally:
            await stream.aclose()
            for b, t in pending:  # failure: stop the rest, return the buffers once done
                t.cancel()
                try:
                    await t
                except BaseException:
                    pass
                b.release()
        return n

    async def recv_array(
        self,
        meta: Any,
        recv: Callable[[], Awaitable[list[Any]]],
        *,
        set_frame_allocator: Callable[[Callable[[int], Any] | None], None] | None = None,
    ) -> Any:
        """Receive the chunks announced by ``meta`` through ``recv`` (e.g. ``conn.recv``).

        ``set_frame_allocator``: the transport's hook for choosing where incoming large frames
        land (called with :meth:`Receiver.alloc`, then with None when done; ``alloc``
        returning None means "use your default buffer"). With it the chunks arrive in pool
        buffers, or straight in the final array on a node without a GPU."""
        rx = self.receiver(meta)
        if set_frame_allocator is not None:
            set_frame_allocator(rx.alloc)
        try:
            for _ in range(int(meta["nchunks"])):
                msg = await recv()
                if len(msg) != 1:
                    raise DecodeError(f"device array chunk message has {len(msg)} frames, expected 1")
                frame = msg[0]
                del msg
                await rx.feed(frame)
                del frame  # host copies are done: let the transport reuse the frame's memory
            return await rx.finish()
        except BaseException:
            await rx.abort()
            raise
        finally:
            if set_frame_allocator is not None:
                set_frame_allocator(None)

    def receiver(self, meta: Any) -> Receiver:
        """Reassembles a streamed array; raises DeviceUnavailable/DecodeError up front."""
        dtype, shape, order, nbytes = self._validate(meta)
        return Receiver(self, self._target(), meta, dtype, shape, order, nbytes)


class ChunkStream:
    """Async iterator of staged chunks; also an async context manager (see Stager.chunks)."""

    def __init__(self, stager: Stager, obj: Any, *, hand_over: bool = False) -> None:
        self._stager = stager
        self._obj = obj
        self._hand_over = hand_over  # yield PooledBuffers the consumer releases (send_array)
        self._gen = self._run()

    def __aiter__(self) -> ChunkStream:
        return self

    async def __anext__(self) -> Any:
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        await self._gen.aclose()

    async def __aenter__(self) -> ChunkStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _run(self) -> Any:
        st = self._stager
        backend, pool, chunk = st.backend, st.pool, st.chunk_bytes
        flat, _dtype, _shape, _order = backend.prepare(self._obj)
        nbytes = int(flat.nbytes)
        n = -(-nbytes // chunk) if nbytes else 0
        inflight: deque[tuple[PooledBuffer, asyncio.Future[None]]] = deque()
        started = 0

        async def start(k: int, wait: bool) -> bool:
            off = k * chunk
            ln = min(chunk, nbytes - off)
            # Only the chunk we are about to yield may wait for a buffer (back-pressure);
            # read-ahead takes a buffer only if one is free, so a small pool cannot deadlock.
            buf = await pool.acquire(ln) if wait else pool.try_acquire(ln)
            if buf is None:
                return False
            fut = st._copy(backend, backend.copy_to_host, flat, off, buf.array[:ln])
            inflight.append((buf, fut))
            return True

        try:
            while True:
                while started < n and len(inflight) < st.depth:
                    if not await start(started, wait=not inflight):
                        break
                    started += 1
                if not inflight:
                    break
                buf, fut = inflight.popleft()
                try:
                    await fut
                except BaseException:
                    buf.release()
                    raise
                if self._hand_over:
                    yield buf  # the consumer owns it now and releases it
                    continue
                try:
                    yield buf.view  # the consumer sends it; the next copy runs meanwhile
                finally:
                    buf.release()
        finally:
            while inflight:  # early exit: let running copies finish before reusing buffers
                buf, fut = inflight.popleft()
                try:
                    await asyncio.shield(fut)
                except BaseException:
                    pass
                buf.release()


class Receiver:
    """Reassembles a streamed array: copies each arriving chunk into the destination.

    Host copies (``backend.host_copies``) happen inside :meth:`feed`, so the chunk's frame can
    be dropped at once and the transport reuses its memory for the next chunk instead of
    faulting in a fresh buffer; device copies run in the worker thread, up to ``depth``
    queued, overlapped with receiving the next chunk.

    Transports that let the receiver choose where a large frame lands call :meth:`alloc` for
    each chunk: it returns a pool buffer (pinned with a GPU, so the host-to-device copy is a
    full-speed DMA) or, when the destination is plain host memory (:class:`HostTarget`), the
    destination slice itself, and then :meth:`feed` copies nothing at all."""

    def __init__(
        self,
        stager: Stager,
        target: Any,
        meta: dict[str, Any],
        dtype: np.dtype,
        shape: tuple[int, ...],
        order: str,
        nbytes: int,
    ) -> None:
        self._st = stager
        self._target = target
        self.meta = meta
        self._dtype, self._shape, self._order, self.nbytes = dtype, shape, order, nbytes
        self._chunk = int(meta["chunk"])
        self._dst = target.empty(nbytes)
        self._inline = bool(getattr(target, "host_copies", False))
        # where the transport may receive in place: only real host memory, never a (simulated)
        # device array, whose host-to-device copy is part of the job
        self._dst_addr = int(self._dst.ctypes.data) if getattr(target, "host_destination", False) and nbytes else None
        self._offset = 0  # bytes fed
        self._alloc_offset = 0  # bytes handed out by alloc()
        self._pending: deque[asyncio.Future[None]] = deque()
        self._failed: BaseException | None = None
        self.copies = 0  # chunks copied into the destination (the rest arrived in place)

    @property
    def complete(self) -> bool:
        return self._offset == self.nbytes

    def alloc(self, nbytes: int) -> Any:
        """A buffer for the transport to receive the next chunk into, or None when ``nbytes``
        is not the next chunk's size (a frame of another message: use the default buffer).

        Synchronous, for a transport's frame-allocator hook (see :meth:`Stager.recv_array`).
        A pool buffer handed out returns to the pool once the frame is dropped (after
        :meth:`feed`, or whenever the transport lets go of it); a full pool means None."""
        off = self._alloc_offset
        if self._failed is not None or off >= self.nbytes or nbytes != min(self._chunk, self.nbytes - off):
            return None
        self._alloc_offset = off + nbytes  # this chunk is being received, wherever it lands
        if self._dst_addr is not None:
            return self._dst[off : off + nbytes]
        pool = self._st.pool
        try:
            buf = pool.try_acquire(nbytes) if nbytes <= pool.max_buffer_bytes else None
        except RuntimeError:  # pool closed
            return None
        return None if buf is None else _lend(buf, asyncio.get_running_loop())

    async def feed(self, frame: Any) -> None:
        """Accept the next chunk; returns once it is copied (host) or its copy is queued
        (device, at most ``depth`` queued; the frame must then stay unmodified until
        :meth:`finish` returns)."""
        if self._failed is not None:
            raise self._failed
        view = _as_bytes_view(frame)
        n = view.nbytes
        off = self._offset
        expect = min(self._chunk, self.nbytes - off)
        if n != expect:
            self._failed = DecodeError(f"device array chunk of {n} bytes at offset {off}, expected {expect}")
            raise self._failed
        self._offset = off + n
        if self._dst_addr is not None and n and _address(view) == self._dst_addr + off:
            return  # the transport received it in place
        self.copies += 1
        if self._inline:
            self._target.copy_from_host(self._dst, off, view)
            return
        while len(self._pending) >= self._st.depth:
            await self._pending.popleft()
        self._pending.append(self._st._copy(self._target, self._target.copy_from_host, self._dst, off, view))

    async def finish(self) -> Any:
        """Wait for the copies and return the array (CuPy on this device, or numpy)."""
        while self._pending:
            await self._pending.popleft()
        if self._offset != self.nbytes:
            raise DecodeError(f"device array incomplete: {self._offset} of {self.nbytes} bytes")
        return self._target.finalize(self._dst, self._dtype, self._shape, self._order)

    async def abort(self) -> None:
        """Drop a half-received array (connection lost); waits for queued copies."""
        self._failed = self._failed or DecodeError("device array receive aborted")
        while self._pending:
            try:
                await self._pending.popleft()
            except BaseException:
                pass


class _Lent:
    """Owner of a pool buffer lent to a transport as a frame: every view of the frame keeps
    it alive, and its finalizer gives the buffer back to the pool on the loop's thread."""

    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, buf: PooledBuffer) -> None:
        self.__array_interface__ = {
            "shape": (buf.nbytes,),
            "typestr": "|u1",
            "data": (buf.address, False),
            "version": 3,
        }


def _lend(buf: PooledBuffer, loop: asyncio.AbstractEventLoop) -> np.ndarray:
    owner = _Lent(buf)
    weakref.finalize(owner, _give_back, loop, buf).atexit = False
    return np.asarray(owner)


def _give_back(loop: asyncio.AbstractEventLoop, buf: PooledBuffer) -> None:
    # the last view may die in a worker thread; the pool is used from its loop only
    try:
        loop.call_soon_threadsafe(buf.release)
    except RuntimeError:  # the loop is closed: so is everything using the pool
        pass


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def _run_into(fut: asyncio.Future[None], fn: Callable[..., None], args: tuple[Any, ...]) -> None:
    if fut.cancelled():
        return
    try:
        fn(*args)
    except BaseException as exc:  # the awaiting task re-raises it
        fut.set_exception(exc)
        if not isinstance(exc, Exception):
            raise
    else:
        fut.set_result(None)


def _as_bytes_view(frame: Any) -> memoryview:
    try:
        mv = memoryview(frame)
    except TypeError:
        raise DecodeError(f"device array frame of type {type(frame).__name__} is not a buffer") from None
    if mv.ndim != 1 or mv.itemsize != 1 or not mv.c_contiguous:
        mv = mv.cast("B") if mv.c_contiguous else memoryview(bytes(mv))
    return mv
