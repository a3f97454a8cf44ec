"""rdma:// on this machine: the event-driven driver against an in-memory verbs double, and
the honest boundary (no RDMA device here -> TransportUnavailable naming what is missing).

The double behaves like an RC QP pair where it matters to the driver: a SEND lands in the
peer's oldest posted receive buffer, completions arrive on both sides and are signalled
through a real file descriptor (so the driver's ``add_reader`` path runs), and a SEND with no
receive posted is a fatal RNR error, which the credit scheme must make impossible.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import deque

import numpy as np
import pytest

from aionet.devices import BufferPool, PooledBuffer
from aionet.errors import ConnectionClosed, TransportUnavailable
from aionet.transports.rdma import Completion, RDMAConnection, RDMATransport
from aionet.transports.rdma.protocol import RdmaProtocol


class Registrar:
    def __init__(self):
        self.live = 0

    def register(self, memory):
        self.live += 1
        return type("MR", (), {"lkey": 1, "rkey": 2, "addr": int(memory.ctypes.data)})()

    def deregister(self, region):
        self.live -= 1


class FakeQP:
    """One side of an in-memory RC connection."""

    def __init__(self, use_fd: bool = True):
        self.peer: FakeQP | None = None
        self.posted: deque[tuple[int, PooledBuffer]] = deque()
        self.cq: deque[Completion] = deque()
        self.rnr = 0
        self.closed = False
        self.rfd, self.wfd = os.pipe() if use_fd else (None, None)
        if self.rfd is not None:
            os.set_blocking(self.rfd, False)
        self.armed = False
        self.max_outstanding_recv = 0

    def _signal(self):
        if self.wfd is not None and self.armed:
            self.armed = False
            os.write(self.wfd, b"x")

    def post_recv(self, wr_id, buf):
        assert not self.closed
        self.posted.append((wr_id, buf))
        self.max_outstanding_recv = max(self.max_outstanding_recv, len(self.posted))

    def post_send(self, wr_id, buf, nbytes):
        assert not self.closed
        peer = self.peer
        data = bytes(memoryview(buf.array)[:nbytes])
        if peer is None or peer.closed:
            self.cq.append(Completion(wr_id, False, False, 0, "remote gone"))
        elif not peer.posted:
            self.rnr += 1
            self.cq.append(Completion(wr_id, False, False, 0, "RNR retry exceeded"))
        else:
            rwr, rbuf = peer.posted.popleft()
            memoryview(rbuf.array)[:nbytes] = data
            peer.cq.append(Completion(rwr, True, True, nbytes))
            peer._signal()
            self.cq.append(Completion(wr_id, False, True, nbytes))
        self._signal()

    def poll(self, n):
        out = []
        while self.cq and len(out) < n:
            out.append(self.cq.popleft())
        return out

    def arm(self):
        self.armed = True
        if self.cq:
            self._signal()

    def fileno(self):
        return self.rfd

    def ack_event(self):
        try:
            os.read(self.rfd, 4096)
        except BlockingIOError:
            pass

    def close(self):
        if not self.closed:
            self.closed = True
            self.posted.clear()
            if self.rfd is not None:
                os.close(self.rfd)
                os.close(self.wfd)


async def make_pair(n=4, seg=256, use_fd=True, recv_queue_bytes=1 << 20, pool_bytes=None, side=True):
    reg = Registrar()
    pool = BufferPool(size_classes=(seg,), max_bytes=pool_bytes or seg * 64)
    pool.add_registrar(reg)
    qa, qb = FakeQP(use_fd), FakeQP(use_fd)
    qa.peer, qb.peer = qb, qa
    sides = [None, None]
    if side:  # a socketpair plays the TCP side channel
        import socket

        s1, s2 = socket.socketpair()
        sides = [await asyncio.open_connection(sock=s1), await asyncio.open_connection(sock=s2)]

    def proto():
        return RdmaProtocol(recv_buffers=n, peer_recv_buffers=n, segment_bytes=seg, recv_queue_bytes=recv_queue_bytes)

    a = RDMAConnection(qa, pool, proto(), side_channel=sides[0], max_send_wr=8)
    b = RDMAConnection(qb, pool, proto(), side_channel=sides[1], max_send_wr=8)
    await a.start()
    await b.start()
    return a, b, qa, qb, pool, reg


@pytest.mark.parametrize("use_fd", [True, False], ids=["event-fd", "poll-fallback"])
async def test_messages_round_trip_in_order(use_fd):
    a, b, qa, qb, _pool, _ = await make_pair(use_fd=use_fd)
    rng = random.Random(3)
    msgs = [[rng.randbytes(rng.randint(0, 3000)) for _ in range(rng.randint(0, 4))] for _ in range(100)]

    async def sender():
        for m in msgs:
            await a.send(m)

    async def receiver():
        return [[bytes(f) for f in await b.recv()] for _ in msgs]

    _, got = await asyncio.wait_for(asyncio.gather(sender(), receiver()), 20)
    assert got == msgs
    assert qa.rnr == 0 and qb.rnr == 0
    assert qb.max_outstanding_recv <= 4
    await a.close()
    await b.close()


async def test_bidirectional_and_large_messages():
    a, b, qa, qb, _, _ = await make_pair(n=3, seg=128)
    big = np.random.default_rng(0).integers(0, 255, 200_000, dtype=np.uint8)

    async def ping(c, tag):
        for i in range(20):
            await c.send([tag, big.data if i % 5 == 0 else b"small"])

    async def drain(c):
        return [await c.recv() for _ in range(20)]

    _, _, ra, rb = await asyncio.wait_for(asyncio.gather(ping(a, b"a"), ping(b, b"b"), drain(a), drain(b)), 30)
    assert all(bytes(m[0]) == b"b" for m in ra) and all(bytes(m[0]) == b"a" for m in rb)
    assert bytes(rb[0][1]) == big.tobytes() and bytes(rb[1][1]) == b"small"
    assert qa.rnr == qb.rnr == 0
    await a.close()
    await b.close()


async def test_slow_reader_back_pressures_sender():
    a, b, qa, _qb, _, _ = await make_pair(n=4, seg=256, recv_queue_bytes=1000)
    sent = 0

    async def sender():
        nonlocal sent
        for _ in range(200):
            await a.send([b"x" * 200])
            sent += 1

    t = asyncio.ensure_future(sender())
    await asyncio.sleep(0.2)
    assert sent < 30  # the unread queue is bounded, so the sender waits
    for _ in range(200):
        await asyncio.wait_for(b.recv(), 5)
    await asyncio.wait_for(t, 5)
    assert qa.rnr == 0
    await a.close()
    await b.close()


async def test_close_delivers_then_raises_connection_closed():
    a, b, *_ = await make_pair()
    await a.send([b"one"])
    await a.send([b"two"])
    await a.close()
    assert [bytes(f) for f in await b.recv()] == [b"one"]
    assert [bytes(f) for f in await b.recv()] == [b"two"]
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(b.recv(), 5)
    with pytest.raises(ConnectionClosed):
        await a.send([b"late"])
    await b.close()


async def test_peer_death_via_side_channel_fails_pending_recv():
    a, b, qa, *_ = await make_pair()
    pending = asyncio.ensure_future(b.recv())
    await asyncio.sleep(0.05)
    # the peer process dies: its QP vanishes and its side channel closes, no FIN
    a._side[1].transport.abort()
    qa.closed = True
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(pending, 5)
    assert b.closed


async def test_buffers_return_to_pool_and_stay_registered():
    a, b, _qa, _qb, pool, reg = await make_pair(n=4)
    for _ in range(10):
        await a.send([b"z" * 1000])
        await b.recv()
    await a.close()
    await b.close()
    assert pool.in_use == 0
    assert reg.live == pool.stats().idle  # every pooled buffer is registered exactly once
    pool.close()
    assert reg.live == 0


async def test_idle_connection_does_not_spin():
    import resource

    a, b, *_ = await make_pair()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t = asyncio.ensure_future(b.recv())
    await asyncio.sleep(0.5)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    assert cpu < 0.2, f"idle connection burned {cpu:.2f}s CPU in 0.5s"
    t.cancel()
    await a.close()
    await b.close()


def test_no_rdma_device_is_a_clear_typed_error():
    with pytest.raises(TransportUnavailable) as ei:
        RDMATransport.check_available()
    msg = str(ei.value)
    assert "no RDMA" in msg
    print(msg)


async def test_listen_and_connect_without_device_raise_transport_unavailable():
    t = RDMATransport()

    async def handler(conn):
        pass

    with pytest.raises(TransportUnavailable, match="no RDMA"):
        await asyncio.wait_for(t.listen("rdma://127.0.0.1:0", handler), 5)
    with pytest.raises(TransportUnavailable, match="no RDMA"):
        await asyncio.wait_for(t.connect("rdma://127.0.0.1:1", timeout=1), 5)
    await t.aclose()


@pytest.mark.skipif(
    os.path.exists("/sys/class/infiniband") is False, reason="no RDMA device: /sys/class/infiniband absent"
)
async def test_real_device_round_trip():
    t = RDMATransport()
    got = asyncio.Queue()

    async def handler(conn):
        await got.put(await conn.recv())
        await conn.close()

    lst = await t.listen("rdma://127.0.0.1:0", handler)
    c = await t.connect(lst.address, timeout=5)
    await c.send([b"hello", b"x" * 1_000_000])
    m = await asyncio.wait_for(got.get(), 10)
    assert bytes(m[0]) == b"hello" and len(m[1]) == 1_000_000
    await c.close()
    await lst.close()
    await t.aclose()


def test_transport_registers_and_uses_a_shared_pool(monkeypatch):
    """use_pool: the node's staging pool becomes the RDMA pool and gets registered with the
    device, so one set of (pinned) buffers serves staging and RDMA."""
    import aionet.transports.rdma.transport as rdma

    class FakeDevice:
        def __init__(self, name, port_num, gid_index):
            self.registrar = Registrar()

    monkeypatch.setattr(rdma, "list_rdma_devices", lambda: ["fake0"])
    monkeypatch.setattr(rdma, "_Device", FakeDevice)
    shared = BufferPool(size_classes=(65536, 1 << 20), max_bytes=8 << 20, pinned=False)
    t = RDMATransport({"segment_bytes": 65536})
    t.use_pool(shared)
    t.use_pool(shared)  # idempotent
    dev, pool = t._ensure_device()
    assert pool is shared and shared.stats().registered_with == 1
    buf = shared.try_acquire(65536)
    assert buf is not None and buf.region(dev.registrar) is not None  # registered on creation
    buf.release()
    with pytest.raises(RuntimeError, match="before the device"):
        t.use_pool(BufferPool(size_classes=(65536,), max_bytes=1 << 20, pinned=False))
    from aionet.errors import ConfigError

    with pytest.raises(ConfigError, match="segment_bytes"):
        RDMATransport({"segment_bytes": 4096}).use_pool(shared)


async def test_node_hands_its_staging_pool_to_the_rdma_transport(monkeypatch):
    from aionet import Node

    monkeypatch.setattr(RDMATransport, "check_available", classmethod(lambda cls: None))
    node = Node(name="n")
    t = node._connector.transport("rdma://127.0.0.1:1")
    assert t._shared_pool is node._device.pool is not None
