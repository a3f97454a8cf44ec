"""The buffer pool: size classes, reuse, the memory bound, back-pressure, registration."""

from __future__ import annotations

import asyncio

import pytest

from aionet.devices import BufferPool, Devices, DeviceUnavailable, PinnedAllocator

KiB = 1024


def pool(**kw):
    return BufferPool(
        size_classes=kw.pop("classes", (4 * KiB, 64 * KiB)), max_bytes=kw.pop("max_bytes", 256 * KiB), **kw
    )


async def test_size_classes_and_reuse():
    p = pool()
    b = await p.acquire(100)
    assert b.capacity == 4 * KiB and b.nbytes == 100 and len(b.view) == 100 and not b.view.readonly
    addr = b.address
    b.release()
    b2 = await p.acquire(4 * KiB)
    assert b2.address == addr  # reused, not reallocated
    big = await p.acquire(5000)
    assert big.capacity == 64 * KiB
    assert p.stats().allocations == 2
    b2.release()
    big.release()


def test_too_large_request_is_an_error():
    with pytest.raises(ValueError, match="split"):
        pool().size_class(64 * KiB + 1)


async def test_never_exceeds_bound_and_waits():
    p = pool(classes=(64 * KiB,), max_bytes=128 * KiB)
    a = await p.acquire(1)
    b = await p.acquire(1)
    assert p.try_acquire(1) is None
    waiter = asyncio.ensure_future(p.acquire(1))
    while p.stats().waiters < 1:  # parked, not failed or served
        await asyncio.sleep(0)
    assert not waiter.done()
    assert p.allocated_bytes == 128 * KiB
    a.release()
    c = await asyncio.wait_for(waiter, 1)
    assert c.address == a.address and p.allocated_bytes == 128 * KiB
    b.release()
    c.release()


async def test_waiters_are_served_fifo_and_cancellation_is_clean():
    p = pool(classes=(64 * KiB,), max_bytes=64 * KiB)
    held = await p.acquire(1)
    order = []

    async def take(i):
        buf = await p.acquire(1)
        order.append(i)
        buf.release()

    t1 = asyncio.ensure_future(take(1))
    tc = asyncio.ensure_future(p.acquire(1))
    t2 = asyncio.ensure_future(take(2))
    while p.stats().waiters < 3:  # all three queued, in order
        await asyncio.sleep(0)
    tc.cancel()
    await asyncio.sleep(0)
    held.release()
    await asyncio.wait_for(asyncio.gather(t1, t2), 1)
    assert order == [1, 2]
    assert p.in_use == 0 and p.stats().waiters == 0


async def test_idle_buffers_of_other_classes_are_evicted_to_fit():
    p = pool(classes=(4 * KiB, 64 * KiB), max_bytes=64 * KiB + 4 * KiB)
    smalls = [await p.acquire(1) for _ in range(2)]
    for s in smalls:
        s.release()
    big = await asyncio.wait_for(p.acquire(64 * KiB), 1)
    assert p.allocated_bytes <= p.max_bytes and p.stats().evictions >= 1
    big.release()


async def test_double_release_and_foreign_buffer():
    p, q = pool(), pool()
    b = await p.acquire(1)
    b.release()
    with pytest.raises(RuntimeError):
        b.release()
    c = await q.acquire(1)
    with pytest.raises(ValueError):
        p.release(c)
    c.release()


async def test_lease_context_manager():
    p = pool()
    async with p.lease(10) as b:
        b.view[:3] = b"abc"
        assert p.in_use == 1
    assert p.in_use == 0


class Registrar:
    def __init__(self):
        self.regions = {}

    def register(self, memory):
        key = int(memory.ctypes.data)
        assert key not in self.regions
        self.regions[key] = memory.nbytes
        return ("mr", key)

    def deregister(self, region):
        del self.regions[region[1]]


async def test_registration_covers_existing_and_new_buffers_and_eviction():
    p = pool(classes=(4 * KiB, 64 * KiB), max_bytes=64 * KiB + 4 * KiB)
    a = await p.acquire(1)
    r = Registrar()
    p.add_registrar(r)
    assert a.region(r) == ("mr", a.address)
    b = await p.acquire(60 * KiB)
    assert b.region(r) == ("mr", b.address) and len(r.regions) == 2
    a.release()
    b.release()
    c = await p.acquire(64 * KiB)  # reuses b
    assert c.address == b.address
    c.release()
    p.remove_registrar(r)
    assert r.regions == {}
    p.add_registrar(r)
    p.close()
    assert r.regions == {}


async def test_close_fails_waiters():
    p = pool(classes=(64 * KiB,), max_bytes=64 * KiB)
    held = await p.acquire(1)
    w = asyncio.ensure_future(p.acquire(1))
    await asyncio.sleep(0)
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        await asyncio.wait_for(w, 1)
    held.release()
    assert p.allocated_bytes == 0


def test_pinned_without_cuda_is_a_clear_error():
    if Devices(use_nvml=False).cuda_available():
        pytest.skip("CUDA present: pinned memory works here")
    with pytest.raises(DeviceUnavailable, match="no CUDA device"):
        PinnedAllocator(Devices(use_nvml=False))
    with pytest.raises(DeviceUnavailable):
        BufferPool(pinned=True)
    assert BufferPool(pinned=None).pinned is False  # auto: plain memory here


@pytest.mark.skipif(not Devices(use_nvml=False).cuda_available(), reason="no CUDA device")
async def test_pinned_pool_on_gpu():
    p = BufferPool(pinned=True, size_classes=(1 << 20,), max_bytes=4 << 20)
    b = await p.acquire(1000)
    assert p.pinned and b.array.nbytes == 1 << 20
    b.release()
