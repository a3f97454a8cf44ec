"""TCP transport: shapes, order, concurrency, big frames, bad input, close, back-pressure.

The key tests run on both the stdlib loop and uvloop (``run`` fixture); every wait is bounded
and synchronisation is by events, never by sleeping.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import hashlib
import itertools
import socket
import struct
import termios
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from aionet.codecs.framing import MAGIC, VERSION, encode
from aionet.config import LimitsSection
from aionet.errors import (
    ConfigError,
    ConnectionClosed,
    FrameTooLarge,
    ProtocolError,
    SerializationError,
    TooManyFrames,
    TransportError,
)
from aionet.transports.base import Connection
from aionet.transports.registry import TransportRegistry
from aionet.transports.tcp import ConnectTimeout, TCPConnection, TCPTransport
from tests.conftest import wait_for
from tests.push_consumer import GatedConsumer

LOOPS = ["asyncio", "uvloop"]


@pytest.fixture(params=LOOPS)
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """Run a coroutine to completion on a fresh loop of the parametrized kind (bounded)."""
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    else:
        factory = asyncio.new_event_loop

    def runner(coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        async def bounded() -> Any:
            async with asyncio.timeout(timeout):
                return await coro

        with asyncio.Runner(loop_factory=factory) as r:
            return r.run(bounded())

    return runner


@dataclass
class Pair:
    transport: TCPTransport
    listener: Any
    client: TCPConnection
    server: TCPConnection
    accepted: asyncio.Queue[TCPConnection]


@asynccontextmanager
async def pair(options: dict[str, Any] | None = None, limits: LimitsSection | None = None) -> AsyncIterator[Pair]:
    t = TCPTransport(options, limits)
    accepted: asyncio.Queue[TCPConnection] = asyncio.Queue()

    async def handler(conn: Connection) -> None:
        assert isinstance(conn, TCPConnection)
        await accepted.put(conn)

    listener = await t.listen("tcp://127.0.0.1:0", handler)
    client = await t.connect(listener.address, timeout=10)
    assert isinstance(client, TCPConnection)
    server = await accepted.get()
    try:
        yield Pair(t, listener, client, server, accepted)
    finally:
        client.abort()
        server.abort()
        while not accepted.empty():
            accepted.get_nowait().abort()
        await listener.close()
        await t.aclose()


def as_bytes(msg: list[Any]) -> list[bytes]:
    return [bytes(f) for f in msg]


SHAPES: list[list[Any]] = [
    [],
    [b""],
    [b"x"],
    [b"hello", b"world"],
    [b"h" * 100, b"x" * 70000, bytearray(b"y" * 70000), b""],
    [memoryview(bytearray(b"z" * 200000))],
    [np.arange(50000, dtype=np.float64)],
    [b"k" * 65535],  # just below copy_below
    [b"k" * 65536],  # exactly copy_below: by reference
    [bytearray(b"m" * 65536)],
    [b"\x00"] * 300,
]


# ------------------------------------------------------------------------- basics
def test_round_trip_shapes(run: Callable[..., Any]) -> None:
    async def main() -> None:
        async with pair() as p:
            for msg in SHAPES:
                await p.client.send(msg)
                got = await p.server.recv()
                assert as_bytes(got) == as_bytes(msg)
                await p.server.send(got)  # and back, received buffers are sendable
                assert as_bytes(await p.client.recv()) == as_bytes(msg)

    run(main())


def test_ten_thousand_messages_in_order(run: Callable[..., Any]) -> None:
    n = 10_000

    async def main() -> None:
        async with pair() as p:

            async def produce() -> None:
                for i in range(n):
                    await p.client.send([i.to_bytes(4, "little") * (1 + i % 7)])

            task = asyncio.ensure_future(produce())
            got: list[int] = []
            while len(got) < n:
                for msg in await p.server.recv_many():
                    (frame,) = msg
                    got.append(int.from_bytes(frame[:4], "little"))
                    assert len(frame) == 4 * (1 + got[-1] % 7)
            await task
            assert got == list(range(n))

    run(main())


def test_concurrent_senders_do_not_interleave(run: Callable[..., Any]) -> None:
    senders, per_sender = 8, 300

    def message(s: int, i: int) -> list[Any]:
        head = struct.pack("<II", s, i)
        if i % 10 == 0:  # now and then a large frame (by reference) between small ones
            return [head, bytearray(bytes([s]) * 80000), bytes([i % 256]) * (i % 50)]
        return [head, bytes([s]) * (i % 300)]

    async def main() -> None:
        async with pair() as p:

            async def sender(s: int) -> None:
                for i in range(per_sender):
                    await p.client.send(message(s, i))
                    if i % 17 == 0:
                        await asyncio.sleep(0)  # let the senders interleave

            tasks = [asyncio.ensure_future(sender(s)) for s in range(senders)]
            nxt = [0] * senders
            for _ in range(senders * per_sender):
                got = await p.server.recv()
                s, i = struct.unpack("<II", got[0])
                assert i == nxt[s], "per-sender order broken"
                nxt[s] += 1
                assert as_bytes(got) == as_bytes(message(s, i))
            await asyncio.gather(*tasks)

    run(main())


def test_64mib_frame_arrives_intact(run: Callable[..., Any]) -> None:
    big = np.random.default_rng(1).integers(0, 256, 64 * 2**20, dtype=np.uint8)
    digest = hashlib.sha256(big).hexdigest()

    async def main() -> None:
        async with pair() as p:
            send = asyncio.ensure_future(p.client.send([b"meta", big]))
            got = await p.server.recv()
            await send
            assert got[0] == b"meta"
            assert len(got[1]) == big.nbytes
            assert hashlib.sha256(got[1]).hexdigest() == digest
            assert not memoryview(got[1]).readonly

    run(main(), timeout=120)


def test_mutable_frame_may_be_reused_after_send(run: Callable[..., Any]) -> None:
    async def main() -> None:
        async with pair() as p:
            big = bytearray(b"A" * (4 * 2**20))
            small = bytearray(b"a" * 1000)
            await p.client.send([small, big])
            big[:] = b"B" * len(big)  # send returned: the kernel has the bytes
            small[:] = b"b" * len(small)
            got = await p.server.recv()
            assert bytes(got[0]) == b"a" * 1000
            assert bytes(got[1]) == b"A" * len(big)

    run(main())


# ------------------------------------------------------------------------- bad input
def _raw_inputs() -> dict[str, bytes]:
    rnd = np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    return {
        "random": b"\xff" + rnd,
        "wrong-magic": b"XY" + bytes([VERSION, 0]) + struct.pack("<I", 1) + struct.pack("<Q", 3) + b"abc",
        "wrong-version": MAGIC + bytes([VERSION + 1, 0]) + struct.pack("<I", 1),
        "truncated": b"".join(encode([b"h" * 100, b"p" * 5000]))[:3000],
        "2**40-announcement": MAGIC + bytes([VERSION, 0]) + struct.pack("<IQ", 1, 2**40),
        "too-many-frames": MAGIC + bytes([VERSION, 0]) + struct.pack("<I", 10**6),
    }


@pytest.mark.parametrize("kind", list(_raw_inputs()))
def test_bad_input_closes_only_that_connection(run: Callable[..., Any], kind: str) -> None:
    data = _raw_inputs()[kind]

    async def main() -> None:
        async with pair() as p:
            loop = asyncio.get_running_loop()
            host, port = p.listener.address.removeprefix("tcp://").rsplit(":", 1)
            raw = socket.create_connection((host, int(port)))
            raw.setblocking(False)
            bad = await p.accepted.get()
            with capture_logs() as logs:
                await loop.sock_sendall(raw, data)
                if kind == "truncated":
                    raw.shutdown(socket.SHUT_WR)
                with pytest.raises(ConnectionClosed) as info:
                    await bad.recv()
            assert isinstance(info.value.__cause__, ProtocolError), repr(info.value.__cause__)
            warnings = [e for e in logs if e["log_level"] == "warning"]
            assert warnings and warnings[0]["peer"] == bad.peer_address
            # the raw peer sees the connection go away
            while True:
                try:
                    if not await loop.sock_recv(raw, 65536):
                        break
                except ConnectionResetError:
                    break
            raw.close()
            with pytest.raises(ConnectionClosed):
                await bad.send([b"x"])
            # the other connection and the listener are unaffected
            await p.client.send([b"still", b"here"])
            assert await p.server.recv() == [b"still", b"here"]
            again = await p.transport.connect(p.listener.address, timeout=10)
            other = await p.accepted.get()
            await again.send([b"new"])
            assert await other.recv() == [b"new"]
            await again.close()

    run(main())


# ------------------------------------------------------------------------- close
def test_peer_close_gives_connection_closed(run: Callable[..., Any]) -> None:
    async def main() -> None:
        async with pair() as p:
            for i in range(100):
                await p.client.send([bytes([i]) * 100])
            await p.client.close()  # flushes first
            assert p.client.closed
            got = []
            with pytest.raises(ConnectionClosed) as info:
                while True:
                    got.extend(await p.server.recv_many())
            assert len(got) == 100
            assert info.value.__cause__ is None  # an orderly close
            with pytest.raises(ConnectionClosed):
                await p.server.send([b"late"])
            with pytest.raises(ConnectionClosed):
                await p.client.send([b"late"])
            with pytest.raises(ConnectionClosed):
                await p.client.recv()

    run(main())


async def test_pending_recv_raises_on_local_close() -> None:
    async with pair() as p:
        waiting = asyncio.ensure_future(p.server.recv())
        await asyncio.sleep(0)
        await asyncio.gather(p.server.close(), p.server.close())  # idempotent, concurrent
        with pytest.raises(ConnectionClosed):
            await waiting
        await p.server.close()


async def test_peer_abort_gives_connection_closed() -> None:
    async with pair() as p:
        waiting = asyncio.ensure_future(p.server.recv())
        p.client.abort()
        with pytest.raises(ConnectionClosed):
            await waiting


async def test_close_flushes_pending_writes() -> None:
    async with pair() as p:
        for i in range(2000):
            p.client.send_nowait([i.to_bytes(4, "little")])
        await p.client.close()
        got = []
        with pytest.raises(ConnectionClosed):
            while True:
                got.extend(await p.server.recv_many())
        assert [int.from_bytes(m[0], "little") for m in got] == list(range(2000))


# ------------------------------------------------------------------------- back-pressure
def test_backpressure_blocks_sender_and_bounds_memory(run: Callable[..., Any]) -> None:
    high = 256 * 1024
    max_queued = 1 * 2**20
    chunk = bytes(256 * 1024)

    async def main() -> None:
        async with pair({"write_high_water": high, "max_queued_bytes": max_queued}) as p:
            sent = 0
            blocked = None
            for _ in range(2000):  # at most 500 MiB: the kernel buffers far less than that
                task = asyncio.ensure_future(p.client.send([chunk]))
                try:
                    await asyncio.wait_for(asyncio.shield(task), timeout=1.0)
                except TimeoutError:
                    blocked = task
                    break
                sent += 1
            assert blocked is not None, "send never blocked although the receiver does not read"
            st = p.client.stats()
            assert st.write_paused
            # what the sender holds: its write buffer plus the batch not yet written
            assert st.queued_send_bytes == st.extra["write_buffer_size"] + st.extra["pending_write_bytes"]
            assert st.queued_send_bytes <= high + 2 * len(chunk)
            assert p.server.stats().queued_recv_bytes <= max_queued + 512 * 1024
            assert p.server.stats().read_paused
            # drain: the blocked send completes and everything arrives
            received = 0
            while received < sent + 1:
                received += len(await p.server.recv_many())
            await blocked
            assert received == sent + 1

    run(main())


def test_more_inbound_says_whether_a_further_message_is_already_here(run: Callable[..., Any]) -> None:
    """The hint the link acknowledges streams of big messages by: true while bytes of a
    message not yet delivered wait (here held back by a receiver that does not read), false
    once everything sent was taken."""

    async def main() -> None:
        async with pair({"max_queued_bytes": 1}) as p:
            assert not p.server.more_inbound()
            for i in range(3):
                await p.client.send([bytes([i]) * 256 * 1024])
            await wait_for(lambda: p.server.stats().read_paused)  # one queued; the rest waits unread
            assert p.server.more_inbound()
            got = []
            while len(got) < 3:
                got.extend(await p.server.recv_many())
            assert [m[0][:1] for m in got] == [b"\x00", b"\x01", b"\x02"]
            assert not p.server.more_inbound()

    run(main())


async def test_write_nowait_and_send_nowait_keep_order() -> None:
    async with pair({"write_high_water": 64 * 1024}) as p:
        big = bytearray(b"1" * 48 * 2**20)  # more than loopback socket buffers take at once
        p.client.send_nowait([b"a"])
        waiter = p.client.write_nowait([b"b", big])
        assert waiter is not None  # the transport still references (or holds a copy of) `big`
        p.client.send_nowait([b"c", bytearray(b"2" * 2**20)])  # copied: no waiting needed
        await p.client.send([b"d"])
        got = []
        while len(got) < 4:
            got.extend(await p.server.recv_many())
        await waiter
        big[:] = b"x" * len(big)
        assert [m[0] for m in got] == [b"a", b"b", b"c", b"d"]
        assert bytes(got[1][1]) == b"1" * 48 * 2**20
        assert bytes(got[2][1]) == b"2" * 2**20


async def test_push_mode() -> None:
    async with pair() as p:
        c = GatedConsumer()
        p.server.start_receiving(c.on_messages, c.on_closed)
        await p.client.send([b"0"])
        await c.first.wait()
        for i in range(1, 50):
            await p.client.send([str(i).encode()])
        assert len(c.batches) == 1
        c.gate.set()
        await p.client.close()
        exc = await c.closed
        assert isinstance(exc, ConnectionClosed)
        assert c.payloads() == [str(i).encode() for i in range(50)]


class WriteLog:
    """Wraps a connection's asyncio transport and records each write call's bytes."""

    def __init__(self, transport: Any) -> None:
        self._t = transport
        self.writes: list[bytes] = []

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))
        self._t.write(data)

    def writelines(self, bufs: list[Any]) -> None:
        self.writes.append(b"".join(bytes(b) for b in bufs))
        self._t.writelines(bufs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


async def test_replies_written_while_a_batch_is_delivered_leave_in_one_write_per_batch_in_order() -> None:
    """What a push consumer writes while it handles a read (a node's replies) is sent when
    it returns, one write per batch, without waiting for the event loop to turn."""
    async with pair() as p:
        log = WriteLog(p.server._transport)
        p.server._transport = log  # type: ignore[assignment]
        batches = 0
        written_in_callback: list[int] = []
        written_next_turn: list[int] = []
        loop = asyncio.get_running_loop()

        def on_messages(batch: list[Any]) -> None:
            nonlocal batches
            batches += 1
            # runs before anything this callback schedules: sees whether the replies had to wait
            loop.call_soon(lambda: written_next_turn.append(len(log.writes)))
            for m in batch:
                p.server.write_nowait([m[0] + b"!"])  # small: copied into the batch
                p.server.write_nowait([b"big", bytes(1000)])  # two frames: the general path
            written_in_callback.append(len(log.writes))

        closed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        p.server.start_receiving(on_messages, closed.set_result)
        n = 40
        for i in range(n):
            p.client.write_nowait([str(i).encode()])
        got = [await p.client.recv() for _ in range(2 * n)]
        assert [m[0] for m in got[::2]] == [f"{i}!".encode() for i in range(n)]
        assert all(m[0] == b"big" and len(m[1]) == 1000 for m in got[1::2])
        # each batch's replies went out as it was handled: nothing was left for a later turn
        assert len(log.writes) == batches == len(written_in_callback)
        assert written_in_callback == list(range(batches))  # (counted before its own write)
        assert written_next_turn == list(range(1, batches + 1))


async def test_after_a_read_of_one_message_the_next_write_leaves_at_once_and_order_holds() -> None:
    """A request/reply exchange: the first small write after two one-message reads in a row
    goes to the socket at once (no loop iteration later); what follows in the same turn is
    batched behind it, in order. A lone message among batches does not enable it."""
    async with pair() as p:
        log = WriteLog(p.server._transport)
        p.server._transport = log  # type: ignore[assignment]
        got: asyncio.Queue[list[Any]] = asyncio.Queue()
        closed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        p.server.start_receiving(got.put_nowait, closed.set_result)
        await p.client.send([b"request"])
        assert await got.get() == [[b"request"]]
        p.server.write_nowait([b"reply"])
        assert len(log.writes) == 0  # one lone message is not yet an exchange: batched
        assert await p.client.recv() == [b"reply"]
        await p.client.send([b"request 2"])
        assert await got.get() == [[b"request 2"]]
        log.writes.clear()
        assert p.server.write_nowait([b"a"]) is None
        assert len(log.writes) == 1  # already written, before any await
        p.server.write_nowait([b"b"])
        p.server.write_nowait([b"c"])
        assert len(log.writes) == 1  # batched for the end of this loop iteration
        assert [await p.client.recv() for _ in range(3)] == [[b"a"], [b"b"], [b"c"]]
        assert len(log.writes) == 2
        # a read of several messages does not enable it: those are a stream, batched
        p.client.write_nowait([b"x"])
        p.client.write_nowait([b"y"])  # (one write: read at once on loopback)
        assert await got.get() == [[b"x"], [b"y"]]
        before = len(log.writes)
        p.server.write_nowait([b"z"])
        assert len(log.writes) == before
        assert await p.client.recv() == [b"z"]
        # nor does one lone message right after that batch
        await p.client.send([b"lone"])
        assert await got.get() == [[b"lone"]]
        before = len(log.writes)
        p.server.write_nowait([b"batched"])
        assert len(log.writes) == before
        assert await p.client.recv() == [b"batched"]


# ------------------------------------------------------------------------- limits
async def test_sender_checks_limits_and_stays_usable() -> None:
    limits = LimitsSection(max_frames=4, max_header_bytes=100, max_frame_bytes=1000, max_message_bytes=1500)
    async with pair(limits=limits) as p:
        with pytest.raises(TooManyFrames):
            await p.client.send([b"x"] * 5)
        with pytest.raises(FrameTooLarge):
            await p.client.send([b"x" * 101])
        with pytest.raises(FrameTooLarge, match="header frame has 101 bytes"):
            await p.client.send([b"x" * 101, b"y"])
        with pytest.raises(FrameTooLarge, match="frame 2 has 1001 bytes"):
            await p.client.send([b"h", b"x", b"x" * 1001])
        with pytest.raises(FrameTooLarge, match="message has 2001 bytes"):
            await p.client.send([b"h", b"x" * 1000, b"y" * 1000])
        await p.client.send([b"ok"])
        assert await p.server.recv() == [b"ok"]


async def test_sender_takes_any_bytes_like_frame_by_its_bytes() -> None:
    """Frames that are not 1-D byte views (wider items, several dimensions) go out as their
    bytes; a strided one is refused before anything is written, and the connection goes on."""
    words = array.array("I", range(20_000))  # 4-byte items, above the copy threshold
    grid = np.arange(12, dtype=np.uint16).reshape(3, 4)
    async with pair() as p:
        await p.client.send([b"h", memoryview(words), memoryview(grid), bytearray(b"z" * 70_000)])
        got = await p.server.recv()
        assert [bytes(f) for f in got] == [b"h", words.tobytes(), grid.tobytes(), b"z" * 70_000]
        with pytest.raises(SerializationError, match="C-contiguous"):
            await p.client.send([b"h", grid[:, ::2]])
        await p.client.send([b"ok"])
        assert await p.server.recv() == [b"ok"]


# ------------------------------------------------------------------------- addresses, errors
async def test_listen_port_zero_reports_real_port() -> None:
    t = TCPTransport()

    async def handler(conn: Connection) -> None:
        await conn.close()

    a = await t.listen("tcp://127.0.0.1:0", handler)
    b = await t.listen("tcp://127.0.0.1:0", handler)
    assert a.address.startswith("tcp://127.0.0.1:") and not a.address.endswith(":0")
    assert a.address != b.address
    await a.close()
    await a.close()
    with pytest.raises(TransportError):
        await t.connect(a.address, timeout=5)
    await b.close()


async def test_listener_close_keeps_established_connections() -> None:
    async with pair() as p:
        await p.listener.close()
        await p.client.send([b"x"])
        assert await p.server.recv() == [b"x"]


async def test_connect_refused_is_transport_error() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(TransportError) as info:
        await TCPTransport().connect(f"tcp://127.0.0.1:{port}", timeout=5)
    assert isinstance(info.value.__cause__, OSError)


async def test_connect_timeout_is_both_transport_error_and_timeout() -> None:
    t = TCPTransport()
    listener = await t.listen("tcp://127.0.0.1:0", lambda conn: conn.close())
    with pytest.raises(ConnectTimeout) as info:
        await t.connect(listener.address, timeout=0)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, TransportError)
    # the timed-out attempt may still reach the listener's accept queue; asyncio leaks a socket
    # accepted while its server closes. A second connection, served (closed by the handler)
    # before the listener closes, is accepted after it, so nothing is in flight by then.
    probe = await t.connect(listener.address, timeout=5)
    with pytest.raises(ConnectionClosed):
        await probe.recv()
    await listener.close()


async def test_handler_failure_closes_only_that_connection() -> None:
    t = TCPTransport()
    calls = 0

    async def handler(conn: Connection) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        await conn.send(await conn.recv())

    listener = await t.listen("tcp://127.0.0.1:0", handler)
    first = await t.connect(listener.address, timeout=5)
    with pytest.raises(ConnectionClosed):
        await first.recv()
    second = await t.connect(listener.address, timeout=5)
    await second.send([b"echo"])
    assert await second.recv() == [b"echo"]
    await second.close()
    await listener.close()


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="nodelayy"):
        TCPTransport({"nodelayy": False})
    with pytest.raises(ConfigError):
        TCPTransport({"write_high_water": "lots"})
    t = TCPTransport({"nodelay": "false", "write_high_water": 1024})
    assert t._opts["nodelay"] is False and t._opts["write_high_water"] == 1024


async def test_nodelay_option_applied() -> None:
    for nodelay in (True, False):
        async with pair({"nodelay": nodelay}) as p:
            assert p.client._transport is not None
            sock = p.client._transport.get_extra_info("socket")
            assert bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)) is nodelay


async def test_registry_and_connection_stats() -> None:
    reg = TransportRegistry(use_entry_points=False)
    t = reg.get("tcp://127.0.0.1:0")
    assert isinstance(t, TCPTransport)
    async with pair() as p:
        st = p.client.stats()
        assert st.queued_send_bytes == 0 and st.queued_recv_bytes == 0 and "write_buffer_size" in st.extra
        assert st.remote == p.server.local_address and st.local == p.client.local_address
        assert repr(p.client).startswith("<TCPConnection tcp://127.0.0.1:")


async def test_large_buffers_are_reused_and_trimmed() -> None:
    async with pair() as p:
        payload = bytes(2**20)
        for _ in range(4):
            await p.client.send([b"h", payload])
            msg = await p.server.recv()
            assert len(msg[1]) == 2**20
            del msg
        dec = p.server._decoder
        assert dec.large_allocs == 4 and 0 < dec.spare_bytes <= 2 * 2**20
        p.server._trim_seen = dec.large_allocs  # as if the trim timer found no new large frames
        p.server._trim()
        assert dec.spare_bytes == 0


async def test_consumer_gets_batches_while_a_flood_arrives() -> None:
    """With a consumer waiting, reading pauses every ``read_batch_bytes`` so it runs."""
    async with pair({"read_batch_bytes": 64 * 1024}) as p:
        n = 50_000
        for i in range(n):
            p.client.send_nowait([i.to_bytes(8, "little")])
        got = 0
        batches = 0
        while got < n:
            batch = await p.server.recv_many()
            assert int.from_bytes(batch[0][0], "little") == got
            got += len(batch)
            batches += 1
        assert batches > 1
        assert not p.server.stats().read_paused


def test_a_push_consumer_runs_between_big_frames_read_in_one_wake_up(run: Callable[..., Any]) -> None:
    """With several large messages already in the socket, the consumer that each delivery wakes
    runs before the next one is read (uvloop would otherwise read up to 32 times in one
    wake-up, each large frame into its own buffer), and every message still arrives once, in order."""

    async def main() -> None:
        async with pair({"read_batch_bytes": 64 * 1024}) as p:
            n, size = 12, 128 * 1024
            runs = [0]
            seen: list[int] = []  # consumer runs so far, at each delivery
            got: list[int] = []
            woken = asyncio.Event()
            closed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

            def on_messages(batch: list[Any]) -> None:
                for m in batch:
                    seen.append(runs[0])
                    got.append(m[1][0])
                woken.set()

            async def consumer() -> None:
                while True:
                    await woken.wait()
                    woken.clear()
                    runs[0] += 1

            sock = socket.socket(fileno=p.server._fd)
            try:  # room for several frames in the kernel (capped at net.core.rmem_max)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 2**20)
            finally:
                sock.detach()
            p.server._pause_reading()  # let the messages pile up in the kernel first
            for i in range(n):
                p.client.send_nowait([b"h", bytes([i]) * size])
            queued = bytearray(4)

            def backlog() -> int:
                fcntl.ioctl(p.server._fd, termios.FIONREAD, queued, True)
                return int.from_bytes(queued, "little")

            await wait_for(lambda: backlog() > 2 * size + 64)
            task = asyncio.get_running_loop().create_task(consumer())
            try:
                p.server.start_receiving(on_messages, closed.set_result)
                p.server._maybe_resume_reading()
                await wait_for(lambda: len(got) == n)
            finally:
                task.cancel()
            assert got == list(range(n))
            assert all(b > a for a, b in itertools.pairwise(seen)), seen

    run(main())
