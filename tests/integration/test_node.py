"""Node API over real transports in one process (tcp://127.0.0.1:0 and inproc://)."""

import asyncio
import dataclasses
import socket
import struct

import numpy as np
import pytest

import aionet
from aionet import Node
from aionet.codecs import handshake
from aionet.errors import HandshakeError, PeerUnavailable, RemoteError
from tests.conftest import listen_url, wait_for

SCHEMES = ["tcp", "inproc"]


@pytest.fixture(params=SCHEMES)
def scheme(request):
    return request.param


@pytest.fixture
async def pair(scheme):
    a = Node(name="a", listen=listen_url(scheme))
    await a.start()
    b = Node(name="b", listen=listen_url(scheme), join=[a.address])
    await b.start()
    yield a, b
    await b.stop()
    await a.stop()


async def test_request_reply_and_builtin_services(pair):
    a, b = pair

    @a.service("double")
    async def double(x):
        return x * 2

    assert await b.request("a", "double", 21) == 42
    assert await b.request("a", "aionet.echo", {"k": [1, 2, (3, 4)]}) == {"k": [1, 2, (3, 4)]}
    info = await b.request("a", "aionet.info", timeout=5)
    assert info["name"] == "a" and info["listen"] == a.addresses and info["pid"] > 0
    assert info["version"] == aionet.__version__
    # a learned b through the handshake and can call it back by name
    assert await a.request("b", "aionet.echo", "hi") == "hi"


async def test_remote_exception_is_typed(pair):
    a, b = pair

    @a.service("boom")
    def boom(x):
        raise ValueError(f"bad {x}")

    with pytest.raises(RemoteError) as ei:
        await b.request("a", "boom", 7, timeout=5)
    err = ei.value
    assert err.remote_type == "ValueError"
    assert err.remote_message == "bad 7"
    assert "raise ValueError" in err.remote_traceback
    assert err.peer == "a"
    assert isinstance(err, aionet.AionetError)


async def test_unknown_service(pair):
    _a, b = pair
    with pytest.raises(RemoteError, match="no service 'nope'"):
        await b.request("a", "nope", timeout=5)


async def test_request_timeout(pair):
    a, b = pair
    release = asyncio.Event()

    @a.service("slow")
    async def slow(_):
        await release.wait()

    with pytest.raises(asyncio.TimeoutError):
        await b.request("a", "slow", None, timeout=0.05)
    release.set()
    assert await b.request("a", "aionet.echo", 1, timeout=5) == 1


async def test_mailbox_order_per_peer(pair):
    a, b = pair
    n = 5000
    for i in range(n):
        await b.send("a", "nums", i)
    got = []
    while len(got) < n:
        got += await a.recv_batch("nums")
    assert got == list(range(n))
    await a.send("b", "back", "x")
    assert await b.recv_from("back", timeout=5) == ("a", "x")


async def test_send_to_self_and_unknown_peer(pair):
    a, _b = pair
    await a.send("a", "me", 1)
    assert await a.recv("me", timeout=1) == 1
    assert await a.request("a", "aionet.echo", 2) == 2
    with pytest.raises(PeerUnavailable, match="unknown peer 'zz'"):
        await a.send("zz", "c", 1)


async def test_large_numpy_array_roundtrip(pair):
    a, b = pair
    arr = np.arange(8 * 2**20, dtype=np.float64)  # 64 MiB
    await b.send("a", "arr", arr)
    got = await a.recv("arr", timeout=30)
    assert got.dtype == arr.dtype and got.shape == arr.shape
    assert np.array_equal(got, arr)
    got[0] = -1  # received arrays are writable
    view = np.arange(100, dtype=np.int32).reshape(10, 10)[:, ::3]  # non-contiguous
    assert np.array_equal(await b.request("a", "aionet.echo", view), view)


@dataclasses.dataclass
class Point:
    x: int
    y: float


async def test_registered_dataclass(pair):
    a, b = pair
    for n in (a, b):
        n.register_type(Point)
    assert await b.request("a", "aionet.echo", Point(1, 2.5)) == Point(1, 2.5)


async def test_three_nodes_learn_each_other(scheme):
    a = Node(name="a", listen=listen_url(scheme))
    async with (
        a,
        Node(name="b", listen=listen_url(scheme), join=[a.address]) as b,
        Node(name="c", listen=listen_url(scheme), join=[a.address]) as c,
    ):
        # b joined before c: it learns c from a's announcement, then dials c directly
        await wait_for(lambda: "c" in b.peers())
        assert await b.request("c", "aionet.echo", "via-direct", timeout=5) == "via-direct"
        assert await c.request("b", "aionet.echo", 3, timeout=5) == 3
        assert set(a.members()) == {"a", "b", "c"}


async def test_peer_stop_fails_pending_requests(scheme):
    a = Node(name="a", listen=listen_url(scheme))
    await a.start()
    b = Node(name="b", listen=listen_url(scheme), join=[a.address])
    await b.start()
    started = asyncio.Event()

    @a.service("hang")
    async def hang(_):
        started.set()
        await asyncio.Event().wait()

    fut = asyncio.ensure_future(b.request("a", "hang", None))
    await started.wait()
    await a.stop(grace=0.1)
    with pytest.raises((PeerUnavailable, RemoteError)):
        await asyncio.wait_for(fut, 10)
    with pytest.raises(PeerUnavailable):
        await b.request("a", "aionet.echo", 1, timeout=5)
    await b.stop()


async def test_duplicate_name_rejected(scheme):
    async with Node(name="same", listen=listen_url(scheme)) as a:
        other = Node(name="same", listen=listen_url(scheme), join=[a.address])
        with pytest.raises(PeerUnavailable, match="unique"):
            await other.start()


async def test_handshake_version_mismatch_gives_clear_error():
    async with Node(name="a", listen="tcp://127.0.0.1:0") as a:
        transport = a.transports.get(a.address)
        conn = await transport.connect(a.address, timeout=5)
        hello = handshake.Hello(99, "old", "id", [], {}, {})
        await conn.send([hello.encode()])
        reply = await asyncio.wait_for(conn.recv(), 5)
        with pytest.raises(HandshakeError, match="version 99"):
            handshake.parse(reply)
        await conn.close()
        async with Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b:
            assert await b.request("a", "aionet.echo", 1, timeout=5) == 1


def _raw_send(addr: str, data: bytes, close: bool = True) -> socket.socket:
    host, port = addr.removeprefix("tcp://").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(data)
    if close:
        s.close()
    return s


BAD_INPUTS = {
    "random": bytes(range(256)) * 4,
    "wrong_magic": b"XX\x01\x00\x01\x00\x00\x00" + struct.pack("<Q", 3) + b"abc",
    "truncated": b"AN\x01\x00\x01\x00\x00\x00" + struct.pack("<Q", 100) + b"abc",
    "huge": b"AN\x01\x00\x01\x00\x00\x00" + struct.pack("<Q", 2**40),
    "bad_msgpack_hello": b"AN\x01\x00\x01\x00\x00\x00" + struct.pack("<Q", 3) + b"\xc1\xc1\xc1",
}


@pytest.mark.parametrize("kind", sorted(BAD_INPUTS))
async def test_bad_input_closes_only_that_connection(kind):
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0") as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b,
    ):
        s = await asyncio.to_thread(_raw_send, a.address, BAD_INPUTS[kind], False)

        # the node closes the offending socket (recv returns b"" or a reset)
        def closed_by_peer():
            s.settimeout(10)
            try:
                while s.recv(65536):  # a REJECT may come first; then the close
                    pass
            except ConnectionResetError:
                pass
            return True

        assert await asyncio.to_thread(closed_by_peer)
        s.close()
        assert await b.request("a", "aionet.echo", kind, timeout=5) == kind


async def test_bad_messages_after_handshake_close_connection_not_node():
    """A handshaken peer sending a header that references missing buffers, then garbage."""
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0") as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b,
    ):
        transport = a.transports.get(a.address)
        conn = await transport.connect(a.address, timeout=5)
        hello = handshake.Hello(handshake.PROTOCOL_VERSION, "evil", "id", [], {}, {})
        await conn.send([hello.encode()])
        handshake.parse(await asyncio.wait_for(conn.recv(), 5))
        await conn.send([handshake.Confirm(b"").encode()])
        handshake.parse_state(await asyncio.wait_for(conn.recv(), 5), handshake.WELCOME)
        await conn.send([handshake.State(handshake.RESUME).encode()])
        good = a.serializer.dumps([2, 1, "aionet.echo", np.arange(10_000)])
        await conn.send(good[:1])  # header refers to a buffer that is not there
        with pytest.raises(aionet.ConnectionClosed):
            while True:
                await asyncio.wait_for(conn.recv(), 5)
        assert await b.request("a", "aionet.echo", "still here", timeout=5) == "still here"


async def test_large_reply_from_sync_handler_does_not_stall_the_connection(pair):
    """A >= 1 MiB reply must not make the reader wait for an ack that only it can read."""
    a, b = pair
    a.add_service("big", lambda n: np.arange(n, dtype=np.float64))
    got = await asyncio.wait_for(b.request("a", "big", 200_000), 20)
    assert got.shape == (200_000,) and got[-1] == 199_999
    await b.send("a", "after", 1)
    assert await a.recv("after", timeout=10) == 1
    await a.send("b", "back", 2)
    assert await b.recv("back", timeout=10) == 2


async def test_mailbox_byte_bound_unit():
    from aionet.core.router import Mailbox

    mb = Mailbox(maxsize=100, maxbytes=1000)
    assert mb.put_nowait(("a", 1), 600)
    assert not mb.put_nowait(("a", 2), 600)  # would exceed the byte bound
    assert mb.put_nowait(("a", 3), 400) and mb.nbytes == 1000
    assert await mb.get() == ("a", 1) and mb.nbytes == 400
    assert mb.put_nowait(("a", 2), 600)
    assert [x[1] for x in await mb.get_batch(1)] == [3] and mb.nbytes == 600
    assert [x[1] for x in await mb.get_batch(10)] == [2] and mb.nbytes == 0
    assert mb.put_nowait(("a", 4), 5000)  # one oversized message fits an empty mailbox
    assert not mb.put_nowait(("a", 5), 1)


def test_aionet_run_uses_uvloop():
    import uvloop

    async def which():
        return type(asyncio.get_running_loop())

    assert aionet.run(which()) is uvloop.Loop
