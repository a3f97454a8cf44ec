"""Reliable links: exactly-once in-order delivery across cut connections, requests across
cuts, dead peers, back-pressure, authentication. Real sockets through a fault proxy."""

import asyncio
import contextlib
import os
import signal
import socket
import time

import numpy as np
import pytest

from aionet import Node, PeerUnavailable
from aionet.config import Config
from aionet.testing import FaultProxy
from tests.conftest import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cfg(**sections):
    return Config.from_dict(sections, env={})


class _Proxies:
    """Both nodes advertise a fault proxy, so every connection between them (dials,
    redials, probes) crosses a proxy that the test can cut."""

    def __init__(self, pa: FaultProxy, pb: FaultProxy):
        self.all = (pa, pb)

    def cut(self, reset: bool = False) -> int:
        return sum(p.cut(reset=reset) for p in self.all)

    def cut_every(self, interval: float) -> None:
        for p in self.all:
            p.cut_every(interval)

    def stop_cutting(self) -> None:
        for p in self.all:
            p.stop_cutting()

    @property
    def cuts(self) -> int:
        return sum(p.stats.cuts for p in self.all)

    @property
    def bytes(self) -> int:
        return sum(p.stats.bytes_up + p.stats.bytes_down for p in self.all)


@pytest.fixture
async def proxied_pair():
    a = Node(name="a", listen="tcp://127.0.0.1:0")
    b = Node(name="b", listen="tcp://127.0.0.1:0")
    await a.start()
    await b.start()
    pa, pb = FaultProxy.to(a.addresses[0]), FaultProxy.to(b.addresses[0])
    await pa.start()
    await pb.start()
    a.config.node.advertise = pa.address
    b.config.node.advertise = pb.address
    await b.connect(pa.address)
    proxies = _Proxies(pa, pb)
    yield a, b, proxies
    proxies.stop_cutting()
    await b.stop()
    await a.stop()
    await pa.stop()
    await pb.stop()


@pytest.mark.timeout(120)
async def test_100k_messages_exactly_once_in_order_across_cuts(proxied_pair):
    a, b, proxy = proxied_pair
    n = 100_000
    proxy.cut_every(0.05)
    received: list[int] = []

    async def consume():
        while len(received) < n:
            received.extend(await a.recv_batch("seq"))

    consumer = asyncio.ensure_future(consume())
    for i in range(n):
        await b.send("a", "seq", i)
        if i % 500 == 499:
            # sends that need not wait never yield, and 100k small ones now cross in a few
            # ms: pace them so the stream is still flowing while the proxies cut
            await asyncio.sleep(0.001)
    await asyncio.wait_for(consumer, 90)
    proxy.stop_cutting()
    assert proxy.cuts >= 3, "the proxies hardly cut: the test proved little"
    # batched, an int costs its 1-5 packed bytes on the wire (3 for most of these)
    assert proxy.bytes >= n * 3, "the messages did not cross the proxies"
    assert len(received) == n
    assert received == list(range(n))  # 0 lost, 0 duplicated, 0 reordered


async def test_request_across_a_cut_gets_exactly_one_reply(proxied_pair):
    a, b, proxy = proxied_pair
    calls = 0
    started, release = asyncio.Event(), asyncio.Event()

    @a.service("once")
    async def once(x):
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
        return x + 1

    fut = asyncio.ensure_future(b.request("a", "once", 41, timeout=30))
    await started.wait()
    assert proxy.cut(reset=True) >= 1
    release.set()
    assert await fut == 42
    assert calls == 1
    # and the link still works afterwards
    assert await b.request("a", "aionet.echo", "after", timeout=10) == "after"


async def test_large_array_across_cuts(proxied_pair):
    a, b, proxy = proxied_pair
    arr = np.arange(4 * 2**20, dtype=np.int64)  # 32 MiB
    sender = asyncio.ensure_future(b.send("a", "big", arr))
    await wait_for(lambda: proxy.bytes > 1 << 20)
    proxy.cut()
    await asyncio.wait_for(sender, 30)
    got = await a.recv("big", timeout=30)
    assert np.array_equal(got, arr)


async def test_stalled_link_backpressures_sender_with_bounded_memory():
    cfg_b = _cfg(link={"max_inflight_bytes": 1 << 20})
    cfg_a = _cfg(link={"mailbox_size": 4})
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0", config=cfg_a) as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address], config=cfg_b) as b,
    ):
        payload = np.zeros(64 * 1024, dtype=np.uint8)
        sent = 0

        async def flood():
            nonlocal sent
            while True:
                await b.send("a", "sink", payload)  # a never reads this mailbox
                sent += 1

        task = asyncio.ensure_future(flood())
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), 2.0)
        peer = b.info()["peers"]["a"]
        link = peer["link"]
        # bounded by the in-flight limit (+ at most one message per concurrent sender)
        assert link["inflight_bytes"] <= (1 << 20) + payload.nbytes + 4096
        assert peer["inflight_bytes"] == link["inflight_bytes"] > 0  # what info() shows per peer
        assert 0 <= peer["queued_send_bytes"] <= peer["inflight_bytes"]
        # the receiver: its mailbox holds exactly its bound, its transport no more than b still
        # has in flight (reading paused), so every message sent is in one of those two places
        assert a.router.mailbox("sink").qsize() == 4
        assert a.info()["peers"]["b"]["queued_recv_bytes"] <= link["inflight_bytes"]
        assert sent <= 4 + link["inflight_bytes"] // payload.nbytes
        task.cancel()
        # the receiver drains; the sender continues
        for _ in range(4):
            await a.recv("sink", timeout=5)


async def test_peer_sigkill_fails_pending_requests(spawn):
    proc, ready = spawn(
        "--name", "victim", "--listen", "tcp://127.0.0.1:0", "--app", "tests.apps:setup", env={"PYTHONPATH": REPO}
    )
    cfg = _cfg(link={"give_up_after": 1.0})
    async with Node(name="client", listen="tcp://127.0.0.1:0", join=ready["addresses"], config=cfg) as c:
        assert await c.request("victim", "test.pid", timeout=5) == proc.pid
        pending = asyncio.ensure_future(c.request("victim", "test.hang"))
        await asyncio.sleep(0)  # let the request go out
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        with pytest.raises(PeerUnavailable):
            await asyncio.wait_for(pending, 10)
        assert time.monotonic() - t0 < 5
        with pytest.raises(PeerUnavailable):
            await c.request("victim", "aionet.echo", 1, timeout=5)


# ---------------------------------------------------------------- authentication
def _token_cfg(token):
    return _cfg(security={"token": token} if token else {})


async def test_matching_tokens_connect():
    async with (
        Node(name="a", config=_token_cfg("s3cret")) as a,
        Node(name="b", join=[a.address], config=_token_cfg("s3cret")) as b,
    ):
        assert await b.request("a", "aionet.echo", 1, timeout=5) == 1


@pytest.mark.parametrize("a_token,b_token", [("right", "wrong"), ("right", None), (None, "right")])
async def test_wrong_or_missing_token_is_rejected(a_token, b_token):
    async with Node(name="a", config=_token_cfg(a_token)) as a:
        b = Node(name="b", join=[a.address], config=_token_cfg(b_token))
        with pytest.raises(PeerUnavailable, match="token|rejected|authentic"):
            await b.start()
        await b.stop()
        async with Node(name="c", join=[a.address], config=_token_cfg(a_token)) as c:
            assert await c.request("a", "aionet.echo", "ok", timeout=5) == "ok"


async def test_slowloris_handshake_is_cut_off():
    cfg = _cfg(link={"handshake_timeout": 0.3})
    async with Node(name="a", config=cfg) as a:
        host, port = a.address.removeprefix("tcp://").rsplit(":", 1)

        def slow_client():
            s = socket.create_connection((host, int(port)))
            s.sendall(b"AN")  # then nothing more
            s.settimeout(5)
            t0 = time.monotonic()
            try:
                data = s.recv(100)
            except ConnectionResetError:
                data = b""
            s.close()
            return data, time.monotonic() - t0

        data, waited = await asyncio.to_thread(slow_client)
        assert data == b""  # closed by the node
        assert waited < 4
        async with Node(name="b", join=[a.address]) as b:
            assert await b.request("a", "aionet.echo", 1, timeout=5) == 1


def test_local_peer_detection():
    from aionet.security import is_local_address

    assert is_local_address("tcp://127.0.0.1:5")
    assert is_local_address("tcp://127.8.9.1:5")
    assert is_local_address("inproc://x")
    assert not is_local_address("tcp://10.1.2.3:5")
    assert not is_local_address("garbage")


@pytest.mark.timeout(30)
async def test_false_death_neither_duplicates_nor_loses_messages():
    """A declares B dead right after delivering messages it has not acknowledged yet. B is
    alive and keeps its stream: it reconnects and replays them. A must drop what it already
    delivered (no duplicates) and B's later messages must still arrive (no silent loss)."""
    n = 2000
    cfg = _cfg(link={"give_up_after": 10})
    async with Node(name="a", config=cfg) as a, Node(name="b", join=[a.address], config=cfg) as b:
        got: list = []
        first = asyncio.Event()

        async def consume():
            while True:
                batch = await a.recv_batch("ch")
                if not first.is_set():
                    a.declare_dead("b", "test: false suspicion")  # before any ack went out
                    first.set()
                got.extend(batch)
                if batch[-1] == "end":
                    return

        task = asyncio.create_task(consume())
        for i in range(n):
            await b.send("a", "ch", i)
        await first.wait()
        await b.send("a", "ch", "end")
        await asyncio.wait_for(task, 20)
        nums = [x for x in got if x != "end"]
        assert len(nums) == len(set(nums)), f"{len(nums) - len(set(nums))} duplicates"
        assert nums == list(range(n))


@pytest.mark.timeout(30)
async def test_unread_mailbox_holds_bounded_bytes_then_backpressures():
    """Large messages to a mailbox nobody reads: the receiver keeps at most link.mailbox_bytes
    (plus one message) queued, then stops reading, and the sender blocks in its window."""
    cfg_a = _cfg(link={"mailbox_bytes": "4MiB"})
    cfg_b = _cfg(link={"max_inflight_bytes": "4MiB"})
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0", config=cfg_a) as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address], config=cfg_b) as b,
    ):
        payload = np.zeros(256 * 1024, dtype=np.uint8)
        sent = 0

        async def flood():
            nonlocal sent
            while True:
                await b.send("a", "sink", payload)
                sent += 1

        task = asyncio.ensure_future(flood())
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), 2.0)
        queued = a.info()["router"]["mailbox_bytes"]["sink"]
        assert 3 << 20 <= queued <= (4 << 20) + payload.nbytes + 4096
        assert a.info()["router"]["mailboxes"]["sink"] < 20  # the byte bound, not the 65536-message one
        # sender: window + what sits in socket buffers; far from the 2 s of unbounded sending
        assert sent * payload.nbytes < 64 << 20
        task.cancel()
        for _ in range(4):  # the receiver drains; it resumes reading
            await a.recv("sink", timeout=5)


@pytest.mark.timeout(60)
async def test_peer_naming_many_channels_is_bounded_over_all_mailboxes():
    """Peers choose channel names: a peer spreading messages over thousands of channels nobody
    reads must still be held to link.peer_mailbox_bytes in total (then back-pressured), not
    mailbox_bytes per channel; reading some lets it go on."""
    cfg_a = _cfg(link={"mailbox_bytes": "4MiB", "peer_mailbox_bytes": "4MiB"})
    cfg_b = _cfg(link={"max_inflight_bytes": "4MiB"})
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0", config=cfg_a) as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address], config=cfg_b) as b,
    ):
        payload = np.zeros(64 * 1024, dtype=np.uint8)
        sent = 0

        async def flood():
            nonlocal sent
            while True:
                await b.send("a", f"ch{sent}", payload)
                sent += 1

        task = asyncio.ensure_future(flood())
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), 2.0)
        held = sum(a.info()["router"]["mailbox_bytes"].values())
        assert held <= (4 << 20) + payload.nbytes + 4096  # one budget for all channels together
        assert sent < 200  # 2 s unbounded would be thousands of channels
        before = sent
        for i in range(8):  # the application takes some: the peer is read again
            await a.recv(f"ch{i}", timeout=5)
        await wait_for(lambda: sent > before + 4, timeout=10)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_idle_mailboxes_are_forgotten():
    """A mailbox per channel name ever used would grow without bound; drained, unwatched
    ones are dropped once there are many, and the channels keep working."""
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0") as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b,
    ):
        for i in range(5000):
            await b.send("a", f"once-{i}", i)
            assert await a.recv(f"once-{i}", timeout=5) == i
        assert len(a.info()["router"]["mailboxes"]) < 2100
        await b.send("a", "once-7", "again")
        assert await a.recv("once-7", timeout=5) == "again"
