"""zmq+tcp:// and zmq+ipc:// specifics beyond the conformance suite: the control protocol,
limits, peer tracking on the ROUTER, heartbeats, and resource handling."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from aionet.config import LimitsSection
from aionet.errors import (
    ConfigError,
    ConnectionClosed,
    FrameTooLarge,
    ProtocolError,
    TooManyFrames,
    TransportError,
)
from aionet.testing.proxy import FaultProxy
from aionet.transports.base import Connection, Listener
from aionet.transports.zmq import PROTOCOL, ZMQTransport

T = 5.0


class Server:
    def __init__(self, transport: ZMQTransport) -> None:
        self.transport = transport
        self.accepted: asyncio.Queue[Connection] = asyncio.Queue()
        self.listener: Listener | None = None

    async def handler(self, conn: Connection) -> None:
        self.accepted.put_nowait(conn)

    async def start(self, url: str = "zmq+tcp://127.0.0.1:0") -> str:
        self.listener = await self.transport.listen(url, self.handler)
        return self.listener.address

    async def accept(self) -> Connection:
        async with asyncio.timeout(T):
            return await self.accepted.get()


@pytest.fixture
async def transport() -> AsyncIterator[ZMQTransport]:
    t = ZMQTransport()
    yield t
    await t.aclose()


@pytest.fixture
async def raw() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.destroy(linger=0)


def _endpoint(address: str) -> str:
    return address.split("+", 1)[1]


async def _raw_dealer(ctx: zmq.asyncio.Context, address: str, hello: bool = True) -> zmq.asyncio.Socket:
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.connect(_endpoint(address))
    if hello:
        await s.send_multipart([b"", b"H", PROTOCOL])
        async with asyncio.timeout(T):
            assert await s.recv_multipart() == [b"", b"W", PROTOCOL]
    return s


async def _expect_closed(conn: Connection) -> ConnectionClosed:
    with pytest.raises(ConnectionClosed) as info:
        async with asyncio.timeout(T):
            while True:
                await conn.recv()
    return info.value


# ------------------------------------------------------------------------------------------
# protocol
# ------------------------------------------------------------------------------------------
async def test_wire_format_is_plain_multipart(transport: ZMQTransport, raw: zmq.asyncio.Context) -> None:
    """Frames stay frames; only zero-frame / empty-frame-0 messages are escaped."""
    srv = Server(transport)
    address = await srv.start()
    d = await _raw_dealer(raw, address)
    conn = await srv.accept()
    await conn.send([b"a", b"bc"])
    await conn.send([])
    await conn.send([b"", b"x"])
    await conn.send([b"big", bytearray(b"y" * 100_000)])
    async with asyncio.timeout(T):
        assert await d.recv_multipart() == [b"a", b"bc"]
        assert await d.recv_multipart() == [b"", b"D"]
        assert await d.recv_multipart() == [b"", b"D", b"", b"x"]
        assert await d.recv_multipart() == [b"big", b"y" * 100_000]
    await d.send_multipart([b"hello", b"world"])
    await d.send_multipart([b"h", b"z" * 100_000])
    async with asyncio.timeout(T):
        assert await conn.recv() == [b"hello", b"world"]
        got = await conn.recv()
    assert got[0] == b"h" and isinstance(got[0], bytes)
    assert isinstance(got[1], memoryview) and not got[1].readonly and bytes(got[1]) == b"z" * 100_000


async def test_protocol_violation_closes_only_that_peer(transport: ZMQTransport, raw: zmq.asyncio.Context) -> None:
    srv = Server(transport)
    address = await srv.start()
    good_client = await transport.connect(address, timeout=T)
    good = await srv.accept()
    d = await _raw_dealer(raw, address)
    bad = await srv.accept()
    await d.send_multipart([b"", b"?unknown"])
    exc = await _expect_closed(bad)
    assert isinstance(exc.__cause__, ProtocolError)
    async with asyncio.timeout(T):
        assert await d.recv_multipart() == [b"", b"B", b"unexpected control frame b'?unknown'"]
    await good_client.send([b"still fine"])
    async with asyncio.timeout(T):
        assert await good.recv() == [b"still fine"]
    # After a violation the peer is forgotten: its later messages are ignored, not delivered.
    await d.send_multipart([b"late"])
    await good_client.send([b"marker"])
    async with asyncio.timeout(T):
        assert await good.recv() == [b"marker"]


async def test_listener_answers_bad_version_and_closed_listener_with_bye(
    transport: ZMQTransport, raw: zmq.asyncio.Context
) -> None:
    srv = Server(transport)
    address = await srv.start()
    keep = await transport.connect(address, timeout=T)  # keeps the ROUTER open after close()
    d = await _raw_dealer(raw, address, hello=False)
    await d.send_multipart([b"", b"H", b"aionet-zmq/999"])
    async with asyncio.timeout(T):
        assert (await d.recv_multipart())[:2] == [b"", b"B"]
    assert srv.listener is not None
    await srv.listener.close()
    with pytest.raises(TransportError, match="listener closed"):
        await transport.connect(address, timeout=T)
    await keep.close()


async def test_too_many_frames_closes_the_connection(raw: zmq.asyncio.Context) -> None:
    t = ZMQTransport(limits=LimitsSection(max_frames=8))
    try:
        srv = Server(t)
        address = await srv.start()
        d = await _raw_dealer(raw, address)
        conn = await srv.accept()
        await d.send_multipart([b"ok"] * 8)
        await d.send_multipart([b"x"] * 9)
        async with asyncio.timeout(T):
            assert await conn.recv() == [b"ok"] * 8
        exc = await _expect_closed(conn)
        assert isinstance(exc.__cause__, TooManyFrames)
    finally:
        await t.aclose()


async def test_message_size_limit_closes_the_connection(raw: zmq.asyncio.Context) -> None:
    t = ZMQTransport(limits=LimitsSection(max_message_bytes=1000))
    try:
        srv = Server(t)
        address = await srv.start()
        d = await _raw_dealer(raw, address)
        conn = await srv.accept()
        await d.send_multipart([b"a" * 600, b"b" * 600])
        exc = await _expect_closed(conn)
        assert isinstance(exc.__cause__, FrameTooLarge)
    finally:
        await t.aclose()


async def test_oversized_frame_disconnects_the_peer_not_the_listener(raw: zmq.asyncio.Context) -> None:
    """ZMQ_MAXMSGSIZE (from limits.max_frame_bytes) is per frame: libzmq drops the peer."""
    t = ZMQTransport(limits=LimitsSection(max_frame_bytes=10_000, max_header_bytes=10_000))
    try:
        srv = Server(t)
        address = await srv.start()
        other_client = await t.connect(address, timeout=T)
        other = await srv.accept()
        d = await _raw_dealer(raw, address)
        conn = await srv.accept()
        await d.send_multipart([b"h", b"x" * 20_000])
        await _expect_closed(conn)
        await other_client.send([b"alive"])
        async with asyncio.timeout(T):
            assert await other.recv() == [b"alive"]
    finally:
        await t.aclose()


# ------------------------------------------------------------------------------------------
# connecting
# ------------------------------------------------------------------------------------------
async def test_connect_to_a_non_zmq_server_fails_fast(transport: ZMQTransport) -> None:
    async def garbage(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 400 Bad Request\r\n\r\n" * 4)
        await w.drain()
        w.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(TransportError):
        await transport.connect(f"zmq+tcp://127.0.0.1:{port}", timeout=3.0)
    assert time.monotonic() - t0 < 3.5
    server.close()


async def test_connect_to_a_silent_server_times_out(transport: ZMQTransport) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)  # the kernel completes the TCP handshake; nobody ever speaks ZMTP
    try:
        t0 = time.monotonic()
        with pytest.raises(TransportError, match="no answer"):
            await transport.connect(f"zmq+tcp://127.0.0.1:{s.getsockname()[1]}", timeout=0.5)
        assert time.monotonic() - t0 < 2.0
    finally:
        s.close()


async def test_connect_to_missing_ipc_path_fails(transport: ZMQTransport, tmp_path: Path) -> None:
    with pytest.raises(TransportError):
        await transport.connect(f"zmq+ipc://{tmp_path}/nothing-here", timeout=2.0)


async def test_ipc_auto_path(transport: ZMQTransport) -> None:
    srv = Server(transport)
    address = await srv.start("zmq+ipc://")
    assert address.startswith("zmq+ipc:///") and "*" not in address
    client = await transport.connect(address, timeout=T)
    conn = await srv.accept()
    await client.send([b"x"])
    async with asyncio.timeout(T):
        assert await conn.recv() == [b"x"]


async def test_ipc_path_in_use_is_refused(transport: ZMQTransport, tmp_path: Path) -> None:
    srv = Server(transport)
    address = await srv.start(f"zmq+ipc://{tmp_path}/s")
    with pytest.raises(TransportError, match="in use"):
        await transport.listen(address, srv.handler)
    client = await transport.connect(address, timeout=T)  # the first listener still owns it
    await srv.accept()
    await client.close()


async def test_bad_urls(transport: ZMQTransport) -> None:
    with pytest.raises(TransportError):
        await transport.connect("zmq+tcp://127.0.0.1", timeout=1)
    with pytest.raises(ConfigError, match="zmq\\+ipc:///tmp/aionet-a.sock"):
        await transport.connect("zmq+ipc://", timeout=1)
    with pytest.raises(TransportError):
        await transport.listen("zmq+ipc:///" + "x" * 200, Server(transport).handler)


# ------------------------------------------------------------------------------------------
# peer tracking and liveness
# ------------------------------------------------------------------------------------------
async def test_connection_churn_tracks_peers_by_fd(transport: ZMQTransport, raw: zmq.asyncio.Context) -> None:
    """Descriptors are reused across connections; each peer's death must map to that peer."""
    srv = Server(transport)
    address = await srv.start()
    for i in range(30):
        if i % 2:
            client = await transport.connect(address, timeout=T)
            conn = await srv.accept()
            await client.send([b"%d" % i])
            async with asyncio.timeout(T):
                assert await conn.recv() == [b"%d" % i]
            await client.close()
        else:  # a peer that vanishes without a bye (linger 0 close = dropped TCP connection)
            d = await _raw_dealer(raw, address)
            conn = await srv.accept()
            d.close(linger=0)
        await _expect_closed(conn)
    listener = srv.listener
    assert listener is not None
    assert not listener._conns and not listener._by_fd  # type: ignore[attr-defined]


async def test_heartbeat_detects_a_hung_link() -> None:
    t = ZMQTransport({"heartbeat_interval": 0.1, "heartbeat_timeout": 0.5})
    try:
        srv = Server(t)
        address = await srv.start()
        async with FaultProxy.to(address.replace("zmq+", "")) as proxy:
            client = await t.connect("zmq+" + proxy.address, timeout=T)
            conn = await srv.accept()
            await client.send([b"x"])
            async with asyncio.timeout(T):
                assert await conn.recv() == [b"x"]
            proxy.stall()  # bytes stop flowing; no FIN, no RST
            t0 = time.monotonic()
            await _expect_closed(client)
            await _expect_closed(conn)
            assert time.monotonic() - t0 < 3.0
    finally:
        await t.aclose()


async def test_listener_close_holds_the_port_until_the_last_connection_ends(transport: ZMQTransport) -> None:
    srv = Server(transport)
    address = await srv.start()
    client = await transport.connect(address, timeout=T)
    conn = await srv.accept()
    assert srv.listener is not None
    await srv.listener.close()
    await client.send([b"after listener close"])
    async with asyncio.timeout(T):
        assert await conn.recv() == [b"after listener close"]
    await conn.close()
    await _expect_closed(client)
    t0 = time.monotonic()
    with pytest.raises(TransportError):  # the ROUTER is gone now: plain refusal
        await transport.connect(address, timeout=3.0)
    assert time.monotonic() - t0 < 1.0


# ------------------------------------------------------------------------------------------
# sending
# ------------------------------------------------------------------------------------------
async def test_send_nowait_keeps_order_with_send(transport: ZMQTransport) -> None:
    srv = Server(transport)
    address = await srv.start()
    client = await transport.connect(address, timeout=T)
    conn = await srv.accept()
    big = bytearray(b"q" * 200_000)
    client.send_nowait([b"1"])
    await client.send([b"2"])
    client.send_nowait([b"3", big])  # a mutable large frame is copied: nobody waits for release
    big[:] = b"\0" * len(big)
    got = []
    async with asyncio.timeout(T):
        while len(got) < 3:
            got.extend(await conn.recv_many())
    assert [bytes(m[0]) for m in got] == [b"1", b"2", b"3"]
    assert bytes(got[2][1]) == b"q" * 200_000


async def test_listener_side_blocked_sender_resumes(transport: ZMQTransport) -> None:
    """ROUTER back-pressure is per peer (EAGAIN via ROUTER_MANDATORY), retried until room."""
    t = ZMQTransport({"hwm": 10, "max_queued_messages": 10})
    try:
        srv = Server(t)
        address = await srv.start()
        # Sequential connects: each handler starts before its welcome, so accept order holds.
        slow_client = await t.connect(address, timeout=T)
        slow = await srv.accept()
        fast_client = await t.connect(address, timeout=T)
        fast = await srv.accept()
        n = 0
        while True:
            try:
                await asyncio.wait_for(slow.send([b"%d" % n, b"p" * 100_000]), 0.5)
            except TimeoutError:
                break
            n += 1
        # The other peer on the same ROUTER is not blocked by the slow one.
        await fast.send([b"fast"])
        async with asyncio.timeout(T):
            assert await fast_client.recv() == [b"fast"]
        received = 0
        async with asyncio.timeout(T):
            while received < n:
                msg = await slow_client.recv()
                assert bytes(msg[0]) == b"%d" % received
                received += 1
    finally:
        await t.aclose()


# ------------------------------------------------------------------------------------------
# resources and options
# ------------------------------------------------------------------------------------------
async def test_aclose_is_prompt_and_final() -> None:
    t = ZMQTransport()
    srv = Server(t)
    address = await srv.start()
    clients = [await t.connect(address, timeout=T) for _ in range(5)]
    conns = [await srv.accept() for _ in range(5)]
    t0 = time.monotonic()
    await t.aclose()
    assert time.monotonic() - t0 < 2.0
    assert all(c.closed for c in clients)
    for conn in conns:
        await _expect_closed(conn)
    with pytest.raises(TransportError):
        await t.connect(address, timeout=1)
    await t.aclose()  # idempotent


def test_uvloop_smoke() -> None:
    uvloop = pytest.importorskip("uvloop")

    async def main() -> None:
        t = ZMQTransport()
        try:
            srv = Server(t)
            address = await srv.start()
            client = await t.connect(address, timeout=T)
            conn = await srv.accept()
            for i in range(1000):
                await client.send([b"%d" % i])
            got = 0
            async with asyncio.timeout(T):
                while got < 1000:
                    got += len(await conn.recv_many())
            await client.close()
            await _expect_closed(conn)
        finally:
            await t.aclose()

    with contextlib.closing(uvloop.new_event_loop()) as loop:
        loop.run_until_complete(main())


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="hmw"):
        ZMQTransport({"hmw": 10})
    with pytest.raises(ConfigError):
        ZMQTransport({"max_queued_bytes": 0})
    assert ZMQTransport({"zero_copy_min_bytes": "1MiB"})._opts.zc_min == 2**20


async def test_peer_address_is_the_dialers_real_address(transport: ZMQTransport) -> None:
    srv = Server(transport)
    address = await srv.start()
    await transport.connect(address, timeout=T)
    conn = await srv.accept()
    host, port = conn.peer_address.split("://", 1)[1].rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
