"""GPU staging on the CPU: the pipeline with the simulated-device backend and test doubles
exposing ``__cuda_array_interface__`` / CUDA DLPack over host memory; the honest boundary
(no GPU here -> DeviceUnavailable naming what is missing); real-GPU tests skip."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from aionet.devices import (
    BufferPool,
    CachingAllocator,
    Devices,
    DeviceUnavailable,
    HostTarget,
    SimulatedDeviceBackend,
    Stager,
    is_device_array,
)
from aionet.errors import DecodeError, FrameTooLarge

HAS_CUDA = Devices(use_nvml=False).cuda_available()


class CAIArray:
    """A test double: host memory presented through __cuda_array_interface__."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    @property
    def __cuda_array_interface__(self):
        return {
            "shape": self.a.shape,
            "typestr": self.a.dtype.str,
            "data": (self.a.ctypes.data, False),
            "strides": None if self.a.flags.c_contiguous else self.a.strides,
            "version": 3,
        }


class DLPackCUDA:
    """A test double: a DLPack producer that claims to live on CUDA device 0."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, **kw):
        return self.a.__dlpack__()


class DLPackCPU(DLPackCUDA):
    def __dlpack_device__(self):
        return (1, 0)


def stager(chunk=4096, classes=(4096,), max_bytes=4 * 4096, **kw) -> Stager:
    return Stager(
        backend=SimulatedDeviceBackend(),
        pool=BufferPool(size_classes=classes, max_bytes=max_bytes),
        chunk_bytes=chunk,
        **kw,
    )


def test_is_device_array():
    a = np.arange(4)
    assert is_device_array(CAIArray(a)) and is_device_array(DLPackCUDA(a))
    assert not is_device_array(DLPackCPU(a))
    for x in (a, b"x", bytearray(2), memoryview(b"x"), 3, "s", None, [1], np.float32(1)):
        assert not is_device_array(x)

    class Broken:
        def __dlpack_device__(self):
            raise RuntimeError("boom")

    assert not is_device_array(Broken())


ARRAYS = {
    "f32_3d": np.arange(3 * 1000 * 7, dtype=np.float32).reshape(3, 1000, 7),
    "u8_odd": np.arange(10_001, dtype=np.uint8),
    "c128": (np.arange(999) + 1j).astype(np.complex128),
    "empty": np.zeros((0, 5), dtype=np.int16),
    "scalar": np.array(7.5),
    "fortran": np.asfortranarray(np.arange(60.0).reshape(6, 10)),
    "strided": np.arange(4000, dtype=np.int64).reshape(40, 100)[:, ::3],
    "bool": np.arange(5000) % 3 == 0,
}


@pytest.mark.parametrize("name", ARRAYS)
@pytest.mark.parametrize("wrap", [CAIArray, DLPackCUDA, lambda a: a], ids=["cai", "dlpack", "numpy"])
def test_sync_encode_decode_round_trip(name, wrap):
    a = ARRAYS[name]
    if wrap is DLPackCUDA and not (a.flags.c_contiguous or a.flags.f_contiguous):
        pass  # numpy exports strided DLPack too
    st = stager()
    meta, frames = st.encode(wrap(a))
    assert all(memoryview(f).nbytes <= 4096 for f in frames)
    assert meta["nchunks"] == len(frames)
    out = st.decode(meta, frames)
    assert isinstance(out, np.ndarray) and out.dtype == a.dtype and out.shape == a.shape
    assert np.array_equal(out, a)
    if a.flags.f_contiguous and not a.flags.c_contiguous:
        assert out.flags.f_contiguous  # layout travels


def test_encode_copies_so_sender_may_reuse_memory():
    a = np.arange(10_000, dtype=np.int32)
    st = stager()
    meta, frames = st.encode(CAIArray(a))
    a[:] = -1
    assert np.array_equal(st.decode(meta, frames), np.arange(10_000, dtype=np.int32))


@pytest.mark.parametrize("name", ARRAYS)
async def test_streaming_round_trip(name):
    a = ARRAYS[name]
    st = stager(chunk=1000, classes=(1024,), max_bytes=2048)
    meta = st.header(CAIArray(a))
    rx = st.receiver(meta)
    n = 0
    async with st.chunks(CAIArray(a)) as chunks:
        async for c in chunks:
            await rx.feed(bytearray(c))  # the "network" copy
            n += 1
    assert n == meta["nchunks"]
    out = await rx.finish()
    assert np.array_equal(out, a) and out.shape == a.shape
    assert st.pool.in_use == 0 and st.pool.allocated_bytes <= 2048
    st.close()


async def test_device_copies_run_in_the_worker_while_the_consumer_holds_the_previous_chunk():
    """Device backends (host_copies False): chunk k+1 is copied in the worker thread while the
    consumer still holds chunk k. Without overlap the waits below would time out."""
    n = 8
    started = [threading.Event() for _ in range(n)]
    names: list[str] = []

    class Device(SimulatedDeviceBackend):
        host_copies = False

        def copy_to_host(self, src, offset, dst):
            names.append(threading.current_thread().name)
            started[offset // 4096].set()
            super().copy_to_host(src, offset, dst)

    a = np.arange(n * 4096, dtype=np.uint8)
    st = Stager(backend=Device(), pool=BufferPool(size_classes=(4096,), max_bytes=2 * 4096), chunk_bytes=4096)
    out = bytearray()
    async with st.chunks(a) as chunks:
        k = 0
        async for c in chunks:
            if k + 1 < n:  # the next copy starts while we still hold this chunk
                assert await asyncio.to_thread(started[k + 1].wait, 10), f"copy of chunk {k + 1} never overlapped"
            out += c
            k += 1
    assert bytes(out) == a.tobytes()
    assert all(name.startswith("aionet-staging") for name in names)
    assert st.pool.allocated_bytes <= 2 * 4096  # double buffering, bounded
    st.close()


async def test_host_copies_run_on_the_loop_while_sends_are_in_flight():
    """Host memcpys (the simulated backend) skip the thread handoff but still overlap: the
    copy of chunk k+1 happens while the send of chunk k has not completed."""
    n = 12
    log: list[tuple[str, int]] = []
    threads: set[str] = set()

    class Recording(SimulatedDeviceBackend):
        def copy_to_host(self, src, offset, dst):
            threads.add(threading.current_thread().name)
            log.append(("copy", offset // 4096))
            super().copy_to_host(src, offset, dst)

    a = np.arange(n * 4096, dtype=np.uint8)
    st = Stager(backend=Recording(), pool=BufferPool(size_classes=(4096,), max_bytes=5 * 4096), chunk_bytes=4096)
    got = bytearray()
    sent = 0

    async def send(frames):
        nonlocal sent
        k = sent
        sent += 1
        got.extend(frames[0])
        # the "network" takes until the next chunk is staged (bounded: no overlap = failure)
        for _ in range(1000):
            if k + 1 >= n or ("copy", k + 1) in log:
                break
            await asyncio.sleep(0)
        else:
            raise AssertionError(f"chunk {k + 1} was not copied while chunk {k} was being sent")
        log.append(("sent", k))

    assert await st.send_array(a, send) == n
    assert bytes(got) == a.tobytes()
    assert threads == {threading.current_thread().name}  # no worker thread involved
    for k in range(n - 1):
        assert log.index(("copy", k + 1)) < log.index(("sent", k))
    assert st.pool.in_use == 0 and st._executor is None
    st.close()


async def test_pool_exhaustion_back_pressures_not_overallocates():
    p = BufferPool(size_classes=(4096,), max_bytes=4096)
    st = Stager(backend=SimulatedDeviceBackend(), pool=p, chunk_bytes=4096, depth=2)
    held = await p.acquire(1)  # someone else holds the only buffer
    a = np.arange(3 * 4096, dtype=np.uint8)
    it = st.chunks(a)
    nxt = asyncio.ensure_future(it.__anext__())
    for _ in range(20):  # let it run as far as it can
        await asyncio.sleep(0)
    assert not nxt.done()  # waits for a buffer instead of allocating past the bound
    held.release()
    got = bytearray(await asyncio.wait_for(nxt, 1))
    async for c in it:
        got += c
    assert bytes(got) == a.tobytes() and p.allocated_bytes == 4096


async def test_early_exit_returns_buffers():
    st = stager()
    a = np.arange(10 * 4096, dtype=np.uint8)
    async with st.chunks(a) as chunks:
        async for _c in chunks:
            break
    assert st.pool.in_use == 0


async def test_receiver_rejects_wrong_chunks():
    st = stager()
    a = np.arange(10_000, dtype=np.uint8)
    rx = st.receiver(st.header(a))
    with pytest.raises(DecodeError):
        await rx.feed(b"short")
    rx2 = st.receiver(st.header(a))
    await rx2.feed(bytes(4096))
    with pytest.raises(DecodeError, match="incomplete"):
        await rx2.finish()


@pytest.mark.parametrize(
    "patch, exc",
    [
        ({"v": 9}, DecodeError),
        ({"dtype": "O"}, DecodeError),
        ({"dtype": "not a dtype"}, DecodeError),
        ({"shape": [10, 10]}, DecodeError),
        ({"shape": [-1]}, DecodeError),
        ({"order": "X"}, DecodeError),
        ({"nchunks": 99}, DecodeError),
        ({"chunk": 0}, DecodeError),
        ({"nbytes": 1 << 50, "shape": [1 << 50], "dtype": "|u1"}, FrameTooLarge),
    ],
)
def test_hostile_headers_are_decode_errors(patch, exc):
    st = stager()
    meta, frames = st.encode(np.arange(1000, dtype=np.float64))
    meta.update(patch)
    with pytest.raises(exc):
        st.decode(meta, frames)


def test_frames_must_add_up():
    st = stager()
    meta, frames = st.encode(np.arange(1000, dtype=np.float64))
    with pytest.raises(DecodeError):
        st.decode(meta, frames[:-1])
    with pytest.raises(DecodeError):
        st.decode(meta, [*frames, b"x"])


def test_needs_staging_follows_transport_capability():
    class Plain:
        moves_device_memory = False

    class UCXCuda:
        moves_device_memory = True

    assert Stager.needs_staging(Plain()) and not Stager.needs_staging(UCXCuda())


@pytest.mark.skipif(HAS_CUDA, reason="CUDA present: the no-GPU boundary cannot be tested here")
class TestWithoutGPU:
    def test_sending_a_device_array_names_what_is_missing(self):
        st = Stager()
        with pytest.raises(DeviceUnavailable, match="no CUDA device") as ei:
            st.encode(CAIArray(np.arange(10)))
        assert "cupy" in str(ei.value)
        with pytest.raises(DeviceUnavailable):
            st.header(DLPackCUDA(np.arange(10)))

    async def test_streaming_a_device_array_fails_cleanly(self):
        st = Stager()
        with pytest.raises(DeviceUnavailable):
            async with st.chunks(CAIArray(np.arange(10))) as chunks:
                async for _ in chunks:
                    pass
        assert st.pool.in_use == 0

    def test_receiving_falls_back_to_numpy_when_allowed(self):
        meta, frames = stager().encode(CAIArray(np.arange(100.0)))
        out = Stager(host_fallback=True).decode(meta, frames)
        assert isinstance(out, np.ndarray) and np.array_equal(out, np.arange(100.0))

    async def test_receiving_without_fallback_is_a_clear_error(self):
        meta, frames = stager().encode(CAIArray(np.arange(100.0)))
        st = Stager(host_fallback=False)
        with pytest.raises(DeviceUnavailable, match="no CUDA device.*host fallback is disabled"):
            st.decode(meta, frames)
        with pytest.raises(DeviceUnavailable):
            st.receiver(meta)

    async def test_streamed_receive_into_numpy(self):
        src = stager()
        a = np.arange(20_000, dtype=np.float32)
        meta = src.header(CAIArray(a))
        rx = Stager(host_fallback=True).receiver(meta)
        async with src.chunks(CAIArray(a)) as chunks:
            async for c in chunks:
                await rx.feed(bytes(c))
        assert np.array_equal(await rx.finish(), a)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
class TestOnGPU:
    async def test_cupy_round_trip_streamed(self):
        import cupy as cp

        a = cp.arange(3_000_000, dtype=cp.float32).reshape(1000, 3000)
        st = Stager(chunk_bytes=1 << 20)
        meta = st.header(a)
        rx = st.receiver(meta)
        async with st.chunks(a) as chunks:
            async for c in chunks:
                await rx.feed(bytes(c))
        out = await rx.finish()
        assert isinstance(out, cp.ndarray) and bool((out == a).all())

    def test_cupy_sync_and_device_frames(self):
        import cupy as cp

        a = cp.asfortranarray(cp.arange(6000.0).reshape(60, 100))
        st = Stager()
        meta, frames = st.encode(a)
        assert bool((st.decode(meta, frames) == a).all())
        meta, frames = st.encode(a, device_frames=True)
        assert bool((st.decode(meta, frames) == a).all())


async def test_send_array_and_recv_array_over_a_queue():
    """The connection-layer helpers: several sends in flight, buffers freed per send."""
    st = stager(chunk=4096, classes=(4096,), max_bytes=5 * 4096)
    a = np.arange(50_000, dtype=np.float64)
    wire: asyncio.Queue = asyncio.Queue()
    in_flight = 0
    peak = 0

    async def send(frames):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001)
        await wire.put([bytes(frames[0])])  # the transport copied it
        in_flight -= 1

    meta = st.header(CAIArray(a))
    n = await st.send_array(CAIArray(a), send)
    assert n == meta["nchunks"] and peak == 2
    assert st.pool.in_use == 0 and st.pool.allocated_bytes <= 5 * 4096
    out = await Stager(backend=SimulatedDeviceBackend()).recv_array(meta, wire.get)
    assert np.array_equal(out, a)


async def test_send_array_failure_returns_buffers():
    st = stager(chunk=4096, classes=(4096,), max_bytes=5 * 4096)
    calls = 0

    async def send(frames):
        nonlocal calls
        calls += 1
        if calls == 3:
            raise ConnectionError("peer gone")
        await asyncio.sleep(0.001)

    with pytest.raises(ConnectionError):
        await st.send_array(np.arange(100_000, dtype=np.uint8), send)
    assert st.pool.in_use == 0


# ---------------------------------------------------------------------------- receiving in place
def chunks_of(a: np.ndarray, chunk: int) -> list[bytes]:
    raw = a.tobytes()
    return [raw[i : i + chunk] for i in range(0, len(raw), chunk)]


async def test_host_target_receives_straight_into_the_array():
    """No GPU: a transport that asks Receiver.alloc where to put each chunk writes it into the
    final array, and feed copies nothing."""
    a = np.arange(10_000, dtype=np.float32)
    src = stager()
    meta = src.header(a)
    st = Stager(backend=HostTarget(), pool=BufferPool(size_classes=(4096,), max_bytes=4096), chunk_bytes=4096)
    rx = st.receiver(meta)
    for c in chunks_of(a, 4096):
        buf = rx.alloc(len(c))
        memoryview(buf).cast("B")[:] = c  # the kernel writing into it
        await rx.feed(buf)
    out = await rx.finish()
    assert np.array_equal(out, a) and rx.copies == 0
    assert st.pool.stats().acquires == 0  # no staging buffer either
    assert rx.alloc(4096) is None  # nothing more expected: the transport uses its own buffer


async def test_simulated_device_never_receives_in_place():
    """The simulated device plays GPU memory: chunks land in pool buffers and the
    host-to-device copy is always done (the benchmark's bar row relies on it)."""
    a = np.arange(10_000, dtype=np.uint8)
    st = stager(max_bytes=2 * 4096)
    rx = st.receiver(st.header(a))
    for c in chunks_of(a, 4096):
        buf = rx.alloc(len(c))
        assert buf is not None and st.pool.in_use == 1
        memoryview(buf).cast("B")[:] = c
        await rx.feed(buf)
        del buf
        await asyncio.sleep(0)  # the pool gets the buffer back on the loop
        assert st.pool.in_use == 0
    assert np.array_equal(await rx.finish(), a)
    assert rx.copies == 3 and st.pool.stats().allocations == 1


async def test_alloc_declines_other_frames_and_a_full_pool():
    a = np.arange(3 * 4096, dtype=np.uint8)
    st = stager(max_bytes=4096)
    rx = st.receiver(st.header(a))
    assert rx.alloc(100) is None  # not the next chunk's size: someone else's frame
    first = rx.alloc(4096)
    assert first is not None
    assert rx.alloc(4096) is None  # pool exhausted: the transport falls back to its own buffer
    await rx.feed(first)
    await rx.feed(a[4096:8192].tobytes())
    del first
    await asyncio.sleep(0)
    assert st.pool.in_use == 0


async def test_lent_buffer_returns_to_the_pool_only_when_every_view_is_gone():
    a = np.arange(2 * 4096, dtype=np.uint8)
    st = stager(max_bytes=4096)
    rx = st.receiver(st.header(a))
    buf = rx.alloc(4096)
    view = memoryview(buf)[10:20]  # the transport still holds a view (e.g. mid-receive)
    del buf
    await rx.abort()
    await asyncio.sleep(0)
    assert st.pool.in_use == 1  # not reusable while anyone can still write into it
    del view
    await asyncio.sleep(0)
    assert st.pool.in_use == 0
    with pytest.raises(DecodeError):
        await rx.feed(bytes(4096))  # aborted


class FakeConn:
    """A transport that honours a frame allocator, as tcp's decoder would."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = frames
        self.alloc = None
        self.allocator_calls: list[object] = []

    def set_frame_allocator(self, alloc) -> None:
        self.allocator_calls.append(alloc)
        self.alloc = alloc

    async def recv(self) -> list:
        data = self.frames.pop(0)
        buf = self.alloc(len(data)) if self.alloc is not None else None
        if buf is None:
            buf = bytearray(len(data))
        memoryview(buf).cast("B")[:] = data
        return [buf]


@pytest.mark.parametrize("backend", [HostTarget, SimulatedDeviceBackend])
async def test_recv_array_installs_and_removes_the_frame_allocator(backend):
    a = np.arange(20_000, dtype=np.int16).reshape(100, 200)
    meta = stager().header(a)
    st = Stager(backend=backend(), pool=BufferPool(size_classes=(4096,), max_bytes=3 * 4096), chunk_bytes=4096)
    conn = FakeConn(chunks_of(a, 4096))
    out = await st.recv_array(meta, conn.recv, set_frame_allocator=conn.set_frame_allocator)
    assert np.array_equal(out, a)
    assert len(conn.allocator_calls) == 2 and conn.allocator_calls[-1] is None
    await asyncio.sleep(0)
    assert st.pool.in_use == 0
    st.close()


async def test_recv_array_failure_removes_the_frame_allocator():
    a = np.arange(3 * 4096, dtype=np.uint8)
    meta = stager().header(a)
    st = stager()
    conn = FakeConn([bytes(4096), b"short"])
    with pytest.raises(DecodeError):
        await st.recv_array(meta, conn.recv, set_frame_allocator=conn.set_frame_allocator)
    assert conn.allocator_calls[-1] is None


# ---------------------------------------------------------------------------- caching allocator
def test_caching_allocator_reuses_freed_blocks():
    mem = CachingAllocator(cache_bytes=1 << 20)
    x = mem.empty(10_000)
    addr = x.ctypes.data
    y = x.view(np.float64)[:5]  # views keep the block in use
    del x
    assert mem.idle_bytes == 0
    del y
    assert mem.idle_bytes >= 10_000
    z = mem.empty(10_000)
    assert z.ctypes.data == addr and mem.hits == 1 and mem.idle_bytes == 0
    w = mem.empty(20_000)  # another size: a fresh block
    assert w.ctypes.data != addr and mem.misses == 2


def test_caching_allocator_is_bounded_and_trims():
    mem = CachingAllocator(cache_bytes=8192)
    blocks = [mem.empty(4096) for _ in range(3)]
    del blocks
    assert mem.idle_bytes == 8192  # the third block was freed, not cached
    mem.trim()
    assert mem.idle_bytes == 0


def test_caching_allocator_takes_blocks_back_from_other_threads():
    mem = CachingAllocator()
    box = [mem.empty(4096)]
    t = threading.Thread(target=box.clear)
    t.start()
    t.join()
    assert mem.idle_bytes == 4096


async def test_receivers_reuse_the_destination_memory():
    a = np.arange(3 * 4096, dtype=np.uint8)
    src = stager()
    st = Stager(backend=SimulatedDeviceBackend(), pool=BufferPool(size_classes=(4096,), max_bytes=4096))
    addrs = []
    for _ in range(2):
        out = await st.recv_array(src.header(a), FakeConn(chunks_of(a, 4096)).recv)
        assert np.array_equal(out, a)
        addrs.append(out.ctypes.data)
        del out
    assert addrs[0] == addrs[1] and st.backend.memory.hits == 1
    st.close()
    assert st.backend.memory.idle_bytes == 0


async def test_alloc_declines_chunks_larger_than_the_pool_buffers():
    a = np.arange(3 * 8192, dtype=np.uint8)
    meta = stager(chunk=8192, classes=(8192,), max_bytes=8192).header(a)
    st = stager()  # 4 KiB buffers: the sender's 8 KiB chunks do not fit
    rx = st.receiver(meta)
    assert rx.alloc(8192) is None
    for c in chunks_of(a, 8192):
        await rx.feed(c)
    assert np.array_equal(await rx.finish(), a)
