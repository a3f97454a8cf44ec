"""ucx:// specifics (the contract itself is aionet.testing.transports): idle
connections do not spin, the process-wide ucxx context is shared and reset between event
loops, the FIN makes close orderly, and missing pieces are clear errors."""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import os
import resource
import socket
import subprocess
import sys

import numpy as np
import pytest

from aionet.devices import Devices
from aionet.errors import ConnectionClosed, ProtocolError, TransportError, TransportUnavailable
from tests.conftest import wait_for

ucxx = pytest.importorskip("ucxx", reason="ucx: ucxx is not installed (pip install 'aionet[ucx]')")

from aionet.transports.ucx import UCXTransport  # noqa: E402

# ucxx keeps one context per process; after the conformance suite has used it in this
# process, these tests have been seen to time out and the idle check to read ~0.8 s/s of
# CPU. They pass in a fresh process, which is how tests/system/test_ucx_isolated.py runs them.
# The interaction is a known weakness (issue 7 note), not hidden: that wrapper must pass.
pytestmark = pytest.mark.skipif(
    os.environ.get("AIONET_UCX_ISOLATED") != "1",
    reason="runs in a fresh process via tests/system/test_ucx_isolated.py",
)


async def pair(t: UCXTransport):
    accepted: asyncio.Queue = asyncio.Queue()
    stop = asyncio.Event()

    async def handler(conn):
        await accepted.put(conn)
        await stop.wait()

    lst = await t.listen("ucx://127.0.0.1:0", handler)
    c = await t.connect(lst.address, timeout=10)
    s = await asyncio.wait_for(accepted.get(), 10)
    return c, s, lst, stop


async def test_idle_connection_does_not_burn_cpu():
    t = UCXTransport({"tls": "tcp"})
    c, s, lst, stop = await pair(t)
    pending = asyncio.ensure_future(s.recv())
    await asyncio.sleep(0.2)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.sleep(1.0)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    # a busy poll burns ~1.0 s per second; leave room for other threads of the test process
    assert cpu < 0.8, f"an idle ucx connection used {cpu:.2f}s of CPU per second"
    await c.send([b"wake"])
    assert [bytes(f) for f in await asyncio.wait_for(pending, 5)] == [b"wake"]
    stop.set()
    await c.close()
    await s.close()
    await lst.close()
    await t.aclose()


async def test_two_transports_share_the_context_and_numpy_frames_travel():
    t1, t2 = UCXTransport(), UCXTransport()
    accepted: asyncio.Queue = asyncio.Queue()

    async def handler(conn):
        await accepted.put(conn)

    lst = await t1.listen("ucx://127.0.0.1:0", handler)
    c = await t2.connect(lst.address, timeout=10)
    s = await asyncio.wait_for(accepted.get(), 10)
    a = np.arange(1_000_000, dtype=np.float64)
    await c.send([b"arr", a])
    m = await asyncio.wait_for(s.recv(), 10)
    got = np.frombuffer(m[1], dtype=np.float64)
    assert np.array_equal(got, a) and not memoryview(m[1]).readonly
    assert c.moves_device_memory is False or Devices(use_nvml=False).cuda_available()
    await c.close()
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(s.recv(), 5)
    await lst.close()
    await t2.aclose()
    await t1.aclose()


def test_context_is_reset_between_event_loops():
    async def once(i: int) -> None:
        t = UCXTransport()
        c, s, lst, stop = await pair(t)
        await c.send([b"%d" % i])
        assert bytes((await asyncio.wait_for(s.recv(), 5))[0]) == b"%d" % i
        stop.set()
        await c.close()
        await lst.close()
        await t.aclose()

    for i in range(2):
        asyncio.run(once(i))


async def test_connect_refused_is_fast_transport_error():
    t = UCXTransport()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TransportError):
        await t.connect("ucx://127.0.0.1:1", timeout=5)
    assert loop.time() - t0 < 2
    with pytest.raises(TransportError):
        await t.connect("ucx://127.0.0.1", timeout=1)
    await t.aclose()


def test_missing_ucxx_is_transport_unavailable():
    code = (
        "import sys; sys.modules['ucxx'] = None\n"
        "from aionet.transports.ucx import UCXTransport\n"
        "from aionet.errors import TransportUnavailable\n"
        "try:\n    UCXTransport.check_available()\n"
        "except TransportUnavailable as e:\n    print('OK', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("OK ucx: ucxx is not installed"), out.stderr
    assert TransportUnavailable  # the type the registry and the suite rely on


@pytest.mark.skipif(not Devices(use_nvml=False).cuda_available(), reason="no CUDA device")
async def test_cupy_frames_over_ucx():
    """Device frames go out of line (a tagged send each, into a buffer the receiver sized):
    small and large ones, between host frames, in order."""
    import cupy as cp

    t = UCXTransport()
    c, s, lst, stop = await pair(t)
    a = cp.arange(1000, dtype=cp.float32)
    big = cp.arange(16 << 20, dtype=cp.float32)  # 64 MiB
    await c.send([b"gpu", a])
    await c.send([b"big", big, b"tail", a])
    for want in ([a], [big, a]):
        m = await asyncio.wait_for(s.recv(), 30)
        dev = m[1::2] if len(want) > 1 else m[1:]
        assert len(dev) == len(want)
        for got, arr in zip(dev, want, strict=True):
            if c.moves_device_memory:  # UCX with its CUDA transports: device memory arrives as such
                assert hasattr(got, "__cuda_array_interface__"), type(got)
                assert bool((cp.asarray(got).view(cp.float32) == arr).all())
            else:
                assert bytes(memoryview(got)) == arr.get().tobytes()
    assert bytes(m[0]) == b"big" and bytes(m[2]) == b"tail"
    stop.set()
    await c.close()
    await lst.close()
    await t.aclose()


async def test_nodes_without_a_token_talk_over_loopback_ucx():
    """A node with no token accepts local peers only: the ucx listener labels each peer with
    the address UCX reports for it, loopback here, so the nodes talk."""
    from aionet import Node
    from aionet.config import Config

    cfg = Config.from_dict({"transport": {"ucx": {"tls": "tcp"}}}, env={})
    async with (
        Node(name="a", listen="ucx://127.0.0.1:0", config=cfg) as a,
        Node(name="b", listen="ucx://127.0.0.1:0", join=[a.address], config=cfg) as b,
    ):
        assert await b.request("a", "aionet.echo", "hi", timeout=10) == "hi"
        await a.send("b", "ch", np.arange(5))
        assert np.array_equal(await b.recv("ch", timeout=10), np.arange(5))


async def test_queued_small_messages_are_batched_in_order_and_copied():
    """write_nowait queues small messages (copied: the caller may reuse its buffer at once)
    and the sender ships what is queued together; order and contents hold, and a large
    message in between returns an awaitable and arrives intact."""
    t = UCXTransport({"tls": "tcp"})
    c, s, lst, stop = await pair(t)
    buf = bytearray(8)
    big = np.arange(1 << 18, dtype=np.uint32)
    for i in range(3000):
        buf[:] = i.to_bytes(8, "little")
        assert c.write_nowait([buf]) is None  # small and far below the high-water mark
        buf[:] = b"\xff" * 8  # mutate after queueing: must not affect what is sent
        if i == 1500:
            aw = c.write_nowait([memoryview(big)])
            assert aw is not None
            await aw
    got: list = []
    while len(got) < 3001:
        got.extend(await asyncio.wait_for(s.recv_many(), 10))
    small = [int.from_bytes(bytes(m[0]), "little") for m in got if len(bytes(m[0])) == 8]
    assert small == list(range(3000))
    bigs = [m for m in got if len(m[0]) != 8]
    assert len(bigs) == 1 and np.array_equal(np.frombuffer(bigs[0][0], dtype=np.uint32), big)
    assert next(i for i, m in enumerate(got) if m is bigs[0]) == 1501
    stop.set()
    await c.close()
    await s.close()
    await lst.close()
    await t.aclose()


async def test_queue_above_high_water_asks_the_writer_to_wait():
    """Small messages are queued without waiting until the queue holds more than its
    high-water mark; then write_nowait returns an awaitable that completes once it drained."""
    from aionet.transports import ucx as ucx_mod

    t = UCXTransport({"tls": "tcp"})
    c, s, lst, stop = await pair(t)
    chunk = b"z" * (ucx_mod._SMALL - 1)
    waits = []
    for _ in range(2 * ucx_mod._HIGH_WATER // len(chunk)):  # synchronously: the sender cannot run
        aw = c.write_nowait([chunk])
        if aw is not None:
            waits.append(aw)
    assert waits, "the queue went past its high-water mark without asking the writer to wait"
    first_wait = 2 * ucx_mod._HIGH_WATER // len(chunk) - len(waits)
    assert first_wait * len(chunk) <= ucx_mod._HIGH_WATER + len(chunk)
    await asyncio.wait_for(asyncio.gather(*waits), 20)  # drained: the waits complete
    n = 0
    while n < 2 * ucx_mod._HIGH_WATER // len(chunk):
        n += len(await asyncio.wait_for(s.recv_many(), 10))
    stop.set()
    await c.close()
    await s.close()
    await lst.close()
    await t.aclose()


def _listening(pid: int | None = None) -> list[tuple[str, int]]:
    import psutil

    me = pid or os.getpid()
    return sorted(
        (c.laddr.ip, c.laddr.port)
        for c in psutil.net_connections(kind="tcp")
        if c.pid == me and c.status == psutil.CONN_LISTEN
    )


def _routable_ipv4() -> str | None:
    """A non-loopback IPv4 address of this host (to reach a listener the way a remote host
    would reach it), or None where the host has none."""
    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback:
                return a.address
    return None


async def test_loopback_listener_serves_loopback_only():
    """Issue 11 item 14: a ucx://127.0.0.1 listener used to accept on every interface and
    label every peer loopback, and UCX's TCP transport listened on every device too. Now
    nothing but the listener's own port listens off loopback (ucxx 0.52 cannot bind that one
    to a host), and a connection arriving there on a routable address is refused before the
    handler sees it."""
    other = _routable_ipv4()
    if other is None:
        pytest.skip("this host has no non-loopback IPv4 address to connect through")
    t = UCXTransport({"tls": "tcp"})
    accepted: list = []

    async def handler(conn):
        accepted.append(conn.peer_address)
        await conn.close()

    gc.collect()  # listeners of earlier tests in this process go once unreferenced
    before = set(_listening())
    lst = await t.listen("ucx://127.0.0.1:0", handler)
    port = int(lst.address.rsplit(":", 1)[1])
    new = set(_listening()) - before
    off_loopback = [(ip, p) for ip, p in new if not ipaddress.ip_address(ip).is_loopback]
    assert all(p == port for _, p in off_loopback), f"UCX listens on routable addresses: {off_loopback}"

    try:
        c = await t.connect(f"ucx://{other}:{port}", timeout=5)
    except TransportError:
        c = None  # refused during UCX's own handshake: as good
    if c is not None:
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(c.recv(), 10)  # the listener aborted the endpoint
        c.abort()
    # the same listener still serves loopback, and labels that peer with its real address
    c2 = await t.connect(lst.address, timeout=5)
    await wait_for(lambda: accepted, 10)
    assert accepted[0].startswith("ucx://127.0.0.1:") and not accepted[0].endswith(":0")
    assert len(accepted) == 1, "a connection on a routable address reached the handler"
    c2.abort()
    await lst.close()
    await t.aclose()


async def test_wildcard_listener_labels_peers_by_their_proven_address():
    """A peer is labelled local only when UCX reports a loopback address for it: through a
    routable address it is not local, so a node without a token refuses it."""
    from aionet.security import is_local_address as _is_local

    other = _routable_ipv4()
    if other is None:
        pytest.skip("this host has no non-loopback IPv4 address to connect through")
    t = UCXTransport({"tls": "tcp"})
    accepted: asyncio.Queue = asyncio.Queue()

    async def handler(conn):
        await accepted.put(conn)

    lst = await t.listen("ucx://0.0.0.0:0", handler)
    port = int(lst.address.rsplit(":", 1)[1])
    conns = []
    for host, local in (("127.0.0.1", True), (other, False)):
        conns.append(await t.connect(f"ucx://{host}:{port}", timeout=5))
        s = await asyncio.wait_for(accepted.get(), 10)
        assert s.peer_address.startswith(f"ucx://{host}:"), s.peer_address
        assert _is_local(s.peer_address) is local
        s.abort()
    for c in conns:
        c.abort()
    await lst.close()
    await t.aclose()


async def test_port_can_be_taken_again_at_once_after_a_clean_stop():
    """Item 14: when the listening side closed an accepted connection first, its port stayed
    in TIME_WAIT and a restarted listener could not bind it for about a minute."""
    t, tc = UCXTransport({"tls": "tcp"}), UCXTransport({"tls": "tcp"})
    got = asyncio.Event()

    async def handler(conn):
        await conn.recv()
        got.set()
        await conn.close()  # the server side closes first

    lst = await t.listen("ucx://127.0.0.1:0", handler)
    c = await tc.connect(lst.address, timeout=5)
    await c.send([b"x"])
    await asyncio.wait_for(got.wait(), 10)
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(c.recv(), 10)  # FIN received: the server has closed its side
    await lst.close()
    await t.aclose()
    c.abort()
    await tc.aclose()
    t2 = UCXTransport({"tls": "tcp"})
    lst2 = await t2.listen(lst.address, handler)  # same port, at once
    assert lst2.address == lst.address
    await lst2.close()
    await t2.aclose()


async def test_a_failing_connection_handler_leaves_no_unretrieved_task():
    """Item 16: the handler task of an accepted connection is owned; its failure is consumed
    and logged (the suite's loop-error guard fails this test otherwise)."""
    t = UCXTransport({"tls": "tcp"})
    failed = asyncio.Event()

    async def handler(conn):
        failed.set()
        conn.abort()
        raise RuntimeError("handler failed")

    lst = await t.listen("ucx://127.0.0.1:0", handler)
    c = await t.connect(lst.address, timeout=5)
    await asyncio.wait_for(failed.wait(), 10)
    await wait_for(lambda: not t._tasks, 10)
    c.abort()
    await lst.close()
    await t.aclose()


async def test_large_host_frames_out_of_line_arrive_whole_and_in_order(monkeypatch):
    """``tagged_frame_bytes``: host frames that large travel as their own tagged sends (the path
    device frames always take); messages around them, batched small ones included, keep their
    order and contents."""
    from aionet.transports import ucx as ucx_mod

    tagged = []
    real_split = ucx_mod.UCXConnection._split
    monkeypatch.setattr(
        ucx_mod.UCXConnection, "_split", lambda self, fr: tagged.append(len(fr)) or real_split(self, fr)
    )
    t = UCXTransport({"tls": "tcp", "tagged_frame_bytes": "1MiB"})
    c, s, lst, stop = await pair(t)
    big = np.random.default_rng(1).integers(0, 255, 3 << 20, dtype=np.uint8)
    mid = np.arange(200_000, dtype=np.uint8)  # below the threshold: stays inline
    sent = [
        [b"a"],
        [b"b", big, mid, big[: 1 << 20]],
        [b"c"],
        [big],  # no inline frame at all
        [b"d", b""],
    ]
    waits = [c.write_nowait(m) for m in sent]
    await asyncio.gather(*(w for w in waits if w is not None))
    got = []
    while len(got) < len(sent):
        got.extend(await asyncio.wait_for(s.recv_many(), 20))
    for g, m in zip(got, sent, strict=True):
        assert [bytes(memoryview(f)) for f in g] == [bytes(memoryview(f)) for f in m]
    assert tagged == [4, 1]  # the two messages with frames of 1 MiB or more went out of line
    assert s.stats().queued_recv_bytes == 0
    stop.set()
    await c.close()
    await lst.close()
    await t.aclose()


async def test_a_split_layout_beyond_the_limits_closes_the_connection_before_allocating(caplog):
    """Bad input: an out-of-line frame announced above ``limits.max_frame_bytes`` ends the
    connection with FrameTooLarge and one warning; nothing of that size is allocated or received."""
    from aionet.config import LimitsSection
    from aionet.errors import FrameTooLarge
    from aionet.transports import ucx as ucx_mod

    t = UCXTransport({"tls": "tcp"}, LimitsSection(max_frame_bytes=1 << 20))
    c, s, lst, stop = await pair(t)
    layout = ucx_mod._LAYOUT.pack(ucx_mod._OOL_HOST, 1 << 40)  # a terabyte
    await c._ep.send_multi([ucx_mod.KIND_SPLIT, layout])
    with pytest.raises(ConnectionClosed) as err:
        await asyncio.wait_for(s.recv(), 10)
    assert isinstance(err.value.__cause__, FrameTooLarge), repr(err.value.__cause__)
    assert "limits.max_frame_bytes" in str(err.value.__cause__)
    bad = [r for r in caplog.records if "bad message from peer" in r.getMessage()]
    assert len(bad) == 1 and bad[0].levelname == "WARNING", [r.getMessage() for r in caplog.records]
    stop.set()
    c.abort()
    await lst.close()
    await t.aclose()


async def test_a_split_layout_that_does_not_match_its_frames_closes_the_connection():
    from aionet.transports import ucx as ucx_mod

    t = UCXTransport({"tls": "tcp"})
    c, s, lst, stop = await pair(t)
    layout = ucx_mod._LAYOUT.pack(ucx_mod._INLINE, 1) * 2  # two inline frames announced, one sent
    await c._ep.send_multi([ucx_mod.KIND_SPLIT, layout, b"x"])
    with pytest.raises(ConnectionClosed) as err:
        await asyncio.wait_for(s.recv(), 10)
    assert isinstance(err.value.__cause__, ProtocolError), repr(err.value.__cause__)
    stop.set()
    c.abort()
    await lst.close()
    await t.aclose()
