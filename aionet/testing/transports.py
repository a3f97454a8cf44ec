"""The transport conformance suite, shipped: a third-party transport proves itself with one call.

The contract is :mod:`aionet.transports.base`: order, no silent loss, back-pressure instead of
unbounded buffering, buffers free after ``await send``, a clean ``ConnectionClosed`` however a
connection ends, listeners that survive garbage. Every built-in transport runs these checks
(``tests/conformance/test_transports.py``); yours can too, in the style of trio's
``check_two_way_stream``::

    from aionet.testing.transports import check_transport

    async def test_my_transport(tmp_path):
        await check_transport(lambda: MyTransport({}, LimitsSection()), "mine://127.0.0.1:0",
                              tmp_path=tmp_path)

or one pytest test per check (clearer failures, one timeout each)::

    from aionet.testing.transports import CHECKS, CheckSkipped, TransportSpec, run_check

    @pytest.mark.parametrize("check", CHECKS, ids=str)
    async def test_conformance(check, tmp_path):
        try:
            await run_check(check, TransportSpec(make=..., listen="mine://127.0.0.1:0"), tmp_path)
        except CheckSkipped as exc:
            pytest.skip(str(exc))

Rules the checks keep: every wait is bounded (``asyncio.timeout``), addresses are the ones the
spec gives (use port 0 or fresh paths under the directory passed in), checks wait on events
rather than sleeping, and the only processes killed are the peers this module started, by PID.
This module does not import pytest (the test kit works without it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConnectionClosed, TransportError, TransportUnavailable
from ..transports.base import Address, Connection, Listener, Transport

PEER_SCRIPT = Path(__file__).with_name("_transport_peer.py")


class CheckSkipped(Exception):
    """A check does not apply to this transport (the message says why)."""


@dataclass(frozen=True)
class TransportSpec:
    """How the suite exercises one transport."""

    #: a fresh transport instance (may raise TransportUnavailable: every check is then skipped)
    make: Callable[[], Transport]
    #: listen URL for a fresh listener: a string (port 0 / a unique name) or a function of a
    #: fresh directory (path-based schemes)
    listen: str | Callable[[Path], str]
    #: "stream": raw TCP/unix garbage can be written at the listener; "zmq": a raw zmq peer
    #: too; None: the transport has no wire (the bad-input check is skipped)
    wire: str | None = "stream"
    #: True when another process can reach the listener and the scheme is in the registry
    #: (its entry point installed): the SIGKILL check starts peers with ``peer_options``
    processes: bool = False
    peer_options: Mapping[str, Any] = field(default_factory=dict)
    #: True when send() hands the very objects to the receiver (documented zero-copy sharing)
    shares_buffers: bool = False
    #: the scheme listener addresses report (default: the listen URL's)
    scheme: str = ""
    #: bound for any single wait (seconds)
    timeout: float = 10.0


class Harness:
    """One transport instance plus bookkeeping, so every check cleans up the same way."""

    def __init__(self, spec: TransportSpec, tmp_path: Path, transport: Transport) -> None:
        self.spec = spec
        self.tmp_path = tmp_path
        self.transport = transport
        self.T = spec.timeout
        self.accepted: asyncio.Queue[Connection] = asyncio.Queue()
        self.stop = asyncio.Event()
        self.conns: list[Connection] = []
        self.listeners: list[Listener] = []
        self._n = 0
        self.scheme = spec.scheme or self.listen_url().split("://", 1)[0]

    def listen_url(self) -> str:
        if isinstance(self.spec.listen, str):
            return self.spec.listen
        self._n += 1
        where = self.tmp_path / f"l{self._n}"  # a fresh directory for path-based schemes
        where.mkdir(parents=True, exist_ok=True)
        return self.spec.listen(where)

    async def _handler(self, conn: Connection) -> None:
        # Hold the handler open, so transports that close a connection when its handler
        # returns behave the same as those that do not.
        self.conns.append(conn)
        self.accepted.put_nowait(conn)
        await self.stop.wait()

    async def listen(self) -> Listener:
        listener = await self.transport.listen(self.listen_url(), self._handler)
        self.listeners.append(listener)
        return listener

    async def connect(self, url: str) -> Connection:
        conn = await self.transport.connect(url, timeout=self.T)
        self.conns.append(conn)
        return conn

    async def accept(self) -> Connection:
        async with asyncio.timeout(self.T):
            return await self.accepted.get()

    async def pair(self, listener: Listener | None = None) -> tuple[Connection, Connection]:
        listener = listener or await self.listen()
        client = await self.connect(listener.address)
        return client, await self.accept()

    async def within(self, aw: Awaitable[Any], seconds: float | None = None) -> Any:
        async with asyncio.timeout(self.T if seconds is None else seconds):
            return await aw


@contextlib.asynccontextmanager
async def harness(spec: TransportSpec, tmp_path: Path) -> AsyncIterator[Harness]:
    """A :class:`Harness` whose connections, listeners and transport are closed on exit."""
    try:
        transport = spec.make()
    except TransportUnavailable as exc:
        raise CheckSkipped(f"transport unavailable: {exc}") from exc
    h = Harness(spec, tmp_path, transport)
    try:
        yield h
    finally:
        h.stop.set()
        async with asyncio.timeout(spec.timeout):
            for c in h.conns:
                c.abort()
            for listener in h.listeners:
                await listener.close()
            await transport.aclose()


@contextlib.contextmanager
def _raises(exc_type: type[BaseException]) -> Iterator[None]:
    try:
        yield
    except exc_type:
        return
    raise AssertionError(f"{exc_type.__name__} was not raised")


def _b(frames: list[Any]) -> list[bytes]:
    return [bytes(f) for f in frames]


# ------------------------------------------------------------------------------------------
# ordering and message shapes
# ------------------------------------------------------------------------------------------
async def check_ordering_both_directions(h: Harness, n: int = 10_000) -> None:
    client, server = await h.pair()

    async def pump(src: Connection) -> None:
        for i in range(n):
            await src.send([struct.pack("!I", i)])

    async def check(dst: Connection) -> None:
        expect = 0
        while expect < n:
            for msg in await dst.recv_many():
                assert struct.unpack("!I", bytes(msg[0]))[0] == expect
                expect += 1

    await h.within(asyncio.gather(pump(client), pump(server), check(server), check(client)), 60)


SHAPES: dict[str, Callable[[], list[bytes]]] = {
    "zero_frames": lambda: [],
    "one_empty_frame": lambda: [b""],
    "empty_first_frame": lambda: [b"", b"x", b""],
    "256_frames": lambda: [bytes([i]) * i for i in range(256)],
    "mixed_large_small": lambda: [b"hdr", os.urandom(1 << 20), b"", b"s", os.urandom(70_000), b"tail"],
}


async def check_message_shape(h: Harness, shape: str) -> None:
    frames = SHAPES[shape]()
    client, server = await h.pair()
    for a, b in ((client, server), (server, client)):
        await h.within(a.send(frames))
        await h.within(a.send([b"after"]))  # the boundary after an odd message stays intact
        got = await h.within(b.recv())
        assert len(got) == len(frames)
        assert _b(got) == frames
        assert _b(await h.within(b.recv())) == [b"after"]


async def check_256mib_frame(h: Harness) -> None:
    import numpy as np

    n = 256 * 2**20
    src = np.arange(n // 8, dtype=np.uint64)
    client, server = await h.pair()
    await h.within(client.send([b"big", memoryview(src).cast("B")]), 60)
    msg = await h.within(server.recv(), 60)
    assert len(msg) == 2 and bytes(msg[0]) == b"big"
    view = memoryview(msg[1])
    assert view.nbytes == n
    got = np.frombuffer(view, dtype=np.uint64)
    for off in (0, 1, 12345, n // 16, n // 8 - 1):
        assert got[off] == off
    assert np.array_equal(got, src)
    if not h.spec.shares_buffers:  # the contract: large received frames are the receiver's own
        assert not view.readonly


async def check_send_returns_only_when_buffers_are_free(h: Harness) -> None:
    """After ``await send`` the caller may overwrite its buffers (except documented sharing)."""
    if h.spec.shares_buffers:
        raise CheckSkipped(f"{h.scheme} shares buffers with the receiver by design (documented)")
    client, server = await h.pair()
    buf = bytearray(1 << 20)
    digests = []
    for i in range(20):
        buf[:] = bytes([i]) * len(buf)
        digests.append(hashlib.sha1(buf).digest())
        await h.within(client.send([b"h", buf, memoryview(buf)[:100_000]]))
        buf[:] = b"\xff" * len(buf)  # reuse right away
    for i in range(20):
        msg = await h.within(server.recv())
        assert hashlib.sha1(msg[1]).digest() == digests[i], f"message {i} was corrupted by buffer reuse"
        assert bytes(msg[2]) == bytes([i]) * 100_000


async def check_concurrent_senders_do_not_interleave(h: Harness) -> None:
    client, server = await h.pair()
    senders, per = 8, 300

    def message(s: int, i: int) -> list[bytes]:
        tag = f"{s}:{i}".encode()
        size = 70_000 if i % 50 == 0 else (i * 7) % 300  # some cross the zero-copy threshold
        return [tag, bytes([s]) * size, tag]

    async def sender(s: int) -> None:
        for i in range(per):
            await client.send(message(s, i))
            if i % 16 == 0:
                await asyncio.sleep(0)  # let the senders really interleave

    async def receiver() -> None:
        nxt = [0] * senders
        for _ in range(senders * per):
            msg = _b(await server.recv())
            s, i = map(int, msg[0].split(b":"))
            assert i == nxt[s], f"sender {s}: got {i}, expected {nxt[s]}"
            assert msg == message(s, i)
            nxt[s] += 1

    await h.within(asyncio.gather(receiver(), *(sender(s) for s in range(senders))), 60)


async def check_recv_many_returns_everything_buffered(h: Harness) -> None:
    client, server = await h.pair()
    n = 2000
    for i in range(n):
        await h.within(client.send([struct.pack("!I", i)]))
    got: list[int] = []
    calls = 0
    while len(got) < n:
        batch = await h.within(server.recv_many())
        calls += 1
        assert batch, "recv_many returned nothing"
        got.extend(struct.unpack("!I", bytes(m[0]))[0] for m in batch)
    assert got == list(range(n))
    assert calls <= n // 10, f"recv_many needed {calls} calls for {n} buffered messages"


# ------------------------------------------------------------------------------------------
# back-pressure: a full peer blocks the sender, nothing is dropped
# ------------------------------------------------------------------------------------------
async def check_backpressure_blocks_and_drops_nothing(h: Harness, direction: str) -> None:
    client, server = await h.pair()
    src, dst = (client, server) if direction == "dialer_to_listener" else (server, client)
    payload = b"p" * (64 << 10)
    cap = 20_000  # 1.25 GiB: far above any sane bound
    sent = 0
    blocked = False
    while sent < cap:
        try:
            await asyncio.wait_for(src.send([struct.pack("!I", sent), payload]), 1.0)
        except TimeoutError:
            blocked = True
            break
        sent += 1
    assert blocked, f"{sent} x 64 KiB sent to a peer that reads nothing: sender never back-pressured"

    # The timed-out send may or may not have gone out; everything before it must arrive in order.
    expect, _ = await h.within(asyncio.gather(_drain_numbered(dst, payload), src.send([b"end", b""])), 60)
    assert expect in (sent, sent + 1), f"sent {sent}, received {expect}: messages were dropped"


async def _drain_numbered(dst: Connection, payload: bytes) -> int:
    """Receive ``[n, payload]`` messages until ``[b"end", ...]``, checking that ``n`` counts
    0, 1, 2, ... with none missing; returns how many came."""
    expect = 0
    while True:
        msg = await dst.recv()
        if bytes(msg[0]) == b"end":
            return expect
        got = struct.unpack("!I", bytes(msg[0]))[0]
        assert got == expect, f"message {expect} is missing (next came {got})"
        assert bytes(msg[1]) == payload
        expect += 1


async def check_write_nowait_keeps_its_place_when_its_waiter_is_cancelled(h: Harness) -> None:
    """``write_nowait`` fixes a message's place in the stream (the link numbers the messages
    after it at once): a caller cancelled while it awaits what ``write_nowait`` returned (the
    back-pressure wait) must not take the message out of the stream."""
    client, server = await h.pair()
    payload = b"p" * (64 << 10)
    cap = 8_000  # 512 MiB: far above any sane bound
    cancelled = n = 0
    while n < cap and cancelled < 3:
        w = client.write_nowait([struct.pack("!I", n), payload])
        n += 1
        if w is None:
            continue
        waiter = asyncio.ensure_future(w)
        await asyncio.sleep(0)
        if waiter.done():
            continue
        waiter.cancel()  # the caller gives up its wait, not its message
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        cancelled += 1
    assert cancelled, f"{n} x 64 KiB written to a peer that reads nothing: write_nowait never asked to wait"
    expect, _ = await h.within(asyncio.gather(_drain_numbered(server, payload), client.send([b"end", b""])), 60)
    assert expect == n, f"wrote {n}, received {expect}: a cancelled wait took its message out"


# ------------------------------------------------------------------------------------------
# closing
# ------------------------------------------------------------------------------------------
async def check_close_from_either_side(h: Harness, closer: str) -> None:
    client, server = await h.pair()
    a, b = (client, server) if closer == "dialer" else (server, client)
    for i in range(3):
        await h.within(a.send([b"m%d" % i]))
    await h.within(a.close())
    assert a.closed
    await h.within(a.close())  # idempotent
    for i in range(3):  # what was sent before close is delivered, then the end
        assert _b(await h.within(b.recv())) == [b"m%d" % i]
    with _raises(ConnectionClosed):
        await h.within(b.recv())
    with _raises(ConnectionClosed):
        await h.within(b.recv())  # stays closed
    with _raises(ConnectionClosed):
        await h.within(a.recv())
    with _raises(ConnectionClosed):
        await h.within(a.send([b"late"]))
    await h.within(b.close())
    await h.within(b.close())
    assert b.closed
    with _raises(ConnectionClosed):
        await h.within(b.send([b"late"]))


async def check_pending_recv_raises_on_local_and_remote_close(h: Harness) -> None:
    client, server = await h.pair()
    local = asyncio.ensure_future(client.recv())
    remote = asyncio.ensure_future(server.recv())
    await asyncio.sleep(0)  # both are now parked in recv
    await h.within(client.close())
    with _raises(ConnectionClosed):
        await h.within(local)
    with _raises(ConnectionClosed):
        await h.within(remote)


async def check_listener_close_keeps_established_connections(h: Harness) -> None:
    listener = await h.listen()
    client, server = await h.pair(listener)
    await h.within(listener.close())
    await h.within(listener.close())  # idempotent
    t0 = time.monotonic()
    with _raises(TransportError):
        await h.transport.connect(listener.address, timeout=3.0)
    assert time.monotonic() - t0 < 3.5
    await h.within(client.send([b"still here"]))
    assert _b(await h.within(server.recv())) == [b"still here"]
    await h.within(server.send([b"and back"]))
    assert _b(await h.within(client.recv())) == [b"and back"]


async def check_connect_to_closed_address_fails_fast(h: Harness) -> None:
    listener = await h.listen()
    address = listener.address
    await listener.close()
    t0 = time.monotonic()
    with _raises(TransportError):
        await h.transport.connect(address, timeout=3.0)
    assert time.monotonic() - t0 < 3.5


# ------------------------------------------------------------------------------------------
# addresses
# ------------------------------------------------------------------------------------------
async def check_listen_port_zero_reports_real_address(h: Harness) -> None:
    l1 = await h.listen()
    l2 = await h.listen()
    assert l1.address != l2.address
    for listener in (l1, l2):
        addr = Address.parse(listener.address)
        assert addr.scheme == h.scheme
        if addr.port is not None:
            assert addr.port > 0
        else:
            rest = listener.address.split("://", 1)[1]
            assert rest not in ("", "0", "*")
        client, server = await h.pair(listener)
        await h.within(client.send([b"ping"]))
        assert _b(await h.within(server.recv())) == [b"ping"]


# ------------------------------------------------------------------------------------------
# a peer process killed with SIGKILL
# ------------------------------------------------------------------------------------------
class _Peer:
    def __init__(self, proc: asyncio.subprocess.Process, line: str) -> None:
        self.proc = proc
        self.line = line

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # already exited and reaped
                self.proc.send_signal(signal.SIGKILL)


@contextlib.asynccontextmanager
async def _peer_processes(h: Harness) -> AsyncIterator[Callable[[str, str], Awaitable[_Peer]]]:
    """Start echo peers (``_transport_peer.py``) in their own processes; kill and reap exactly
    those on exit."""
    started: list[asyncio.subprocess.Process] = []

    async def start(role: str, url: str) -> _Peer:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(PEER_SCRIPT),
            role,
            url,
            json.dumps(dict(h.spec.peer_options)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        started.append(proc)
        assert proc.stdout is not None and proc.stderr is not None
        line = ""
        async with asyncio.timeout(30):
            while not line.startswith("ready"):
                raw = await proc.stdout.readline()
                if not raw:
                    break
                line = raw.decode().strip()
        if not line.startswith("ready"):
            err = (await h.within(proc.stderr.read(), 5)).decode()[-2000:]
            raise AssertionError(f"peer did not start: {line!r}\n{err}")
        return _Peer(proc, line)

    try:
        yield start
    finally:
        for proc in started:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
            await h.within(proc.wait())


async def check_peer_sigkill_gives_clean_connection_closed(h: Harness, peer_role: str) -> None:
    if not h.spec.processes:
        raise CheckSkipped(f"{h.scheme} has no other processes to kill")
    async with _peer_processes(h) as start:
        if peer_role == "connect":
            listener = await h.listen()
            peer = await start("connect", listener.address)
            conn = await h.accept()
            assert _b(await h.within(conn.recv())) == [b"hello"]
        else:
            peer = await start("listen", h.listen_url())
            conn = await h.connect(peer.line.split(" ", 1)[1])
        await h.within(conn.send([b"echo"]))
        assert _b(await h.within(conn.recv())) == [b"echo"]
        pending = asyncio.ensure_future(conn.recv())
        await asyncio.sleep(0)
        peer.kill()
        t0 = time.monotonic()
        with _raises(ConnectionClosed):
            await h.within(pending)
        assert time.monotonic() - t0 < 5.0
        with _raises(ConnectionClosed):
            await h.within(conn.send([b"after death"]))


# ------------------------------------------------------------------------------------------
# garbage on the wire does not hurt the listener
# ------------------------------------------------------------------------------------------
GARBAGE = [
    b"\x00" * 64,
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\xff" * 16 + struct.pack("!Q", 2**62) + os.urandom(256),
    os.urandom(4096),
]


def _raw_stream(address: str, timeout: float) -> socket.socket:
    addr = Address.parse(address)
    if addr.port is not None:
        return socket.create_connection((addr.host, addr.port), timeout=timeout)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(address.split("://", 1)[1])
    return s


async def _raw_stream_garbage(address: str, timeout: float) -> None:
    def spray() -> None:
        for junk in GARBAGE:
            s = _raw_stream(address, timeout)
            try:
                s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
                s.settimeout(1.0)  # give the listener a moment to react (hang up or answer)
                s.recv(1 << 16)
            except OSError:
                pass
            finally:
                s.close()

    await asyncio.get_running_loop().run_in_executor(None, spray)


async def _raw_zmq_garbage(h: Harness, address: str) -> None:
    import zmq
    import zmq.asyncio

    endpoint = address.split("+", 1)[1].replace(":0/", "/")
    ctx = zmq.asyncio.Context()
    try:
        for msg in (
            [b"junk"],
            [b""],
            [b"", b"X"],
            [b"", b"H", b"not-a-version"],
            [b"", b"W", b"aionet-zmq/1"],
            [b"", b"D", os.urandom(100_000)],
            [b"", b"B"],
        ):
            s = ctx.socket(zmq.DEALER)
            s.linger = 0
            s.connect(endpoint)
            await s.send_multipart(msg)
            if msg[:2] == [b"", b"H"]:  # a bad hello is answered with a bye
                reply = await h.within(s.recv_multipart())
                assert reply[:2] == [b"", b"B"]
            s.close()
    finally:
        ctx.destroy(linger=0)


async def check_bad_input_on_the_wire_does_not_kill_the_listener(h: Harness) -> None:
    if h.spec.wire is None:
        raise CheckSkipped(f"{h.scheme} has no wire to write garbage on")
    listener = await h.listen()
    client, server = await h.pair(listener)  # an established connection must survive
    await h.within(_raw_stream_garbage(listener.address, h.T), 30)
    if h.spec.wire == "zmq":
        await h.within(_raw_zmq_garbage(h, listener.address), 30)
    await h.within(client.send([b"ok?"]))
    assert _b(await h.within(server.recv())) == [b"ok?"]
    await h.within(server.send([b"ok"]))
    assert _b(await h.within(client.recv())) == [b"ok"]
    # New connections are still accepted. Garbage connections may have reached the handler
    # too (a stream transport may accept before validating); those end in ConnectionClosed.
    c2 = await h.connect(listener.address)
    await h.within(c2.send([b"new"]))
    while True:
        s2 = await h.accept()
        try:
            got = await h.within(s2.recv())
        except ConnectionClosed:
            continue
        assert _b(got) == [b"new"]
        break


# ------------------------------------------------------------------------------------------
# the list of checks and the runners
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    """One conformance check: ``fn(harness, **kwargs)`` on a fresh transport."""

    name: str
    fn: Callable[..., Awaitable[None]]
    kwargs: tuple[tuple[str, Any], ...] = ()

    def __str__(self) -> str:
        return self.name


def _variants(name: str, fn: Callable[..., Awaitable[None]], arg: str, values: list[str]) -> list[Check]:
    return [Check(f"{name}[{v}]", fn, ((arg, v),)) for v in values]


CHECKS: tuple[Check, ...] = (
    Check("ordering_10000_both_directions", check_ordering_both_directions),
    *_variants("message_shapes", check_message_shape, "shape", list(SHAPES)),
    Check("256mib_frame", check_256mib_frame),
    Check("send_returns_only_when_buffers_are_free", check_send_returns_only_when_buffers_are_free),
    Check("concurrent_senders_do_not_interleave", check_concurrent_senders_do_not_interleave),
    Check("recv_many_returns_everything_buffered", check_recv_many_returns_everything_buffered),
    *_variants(
        "backpressure_blocks_and_drops_nothing",
        check_backpressure_blocks_and_drops_nothing,
        "direction",
        ["dialer_to_listener", "listener_to_dialer"],
    ),
    Check(
        "write_nowait_keeps_its_place_when_its_waiter_is_cancelled",
        check_write_nowait_keeps_its_place_when_its_waiter_is_cancelled,
    ),
    *_variants("close_from_either_side", check_close_from_either_side, "closer", ["dialer", "listener"]),
    Check("pending_recv_raises_on_local_and_remote_close", check_pending_recv_raises_on_local_and_remote_close),
    Check("listener_close_keeps_established_connections", check_listener_close_keeps_established_connections),
    Check("connect_to_closed_address_fails_fast", check_connect_to_closed_address_fails_fast),
    Check("listen_port_zero_reports_real_address", check_listen_port_zero_reports_real_address),
    *_variants(
        "peer_sigkill_gives_clean_connection_closed",
        check_peer_sigkill_gives_clean_connection_closed,
        "peer_role",
        ["connect", "listen"],
    ),
    Check("bad_input_on_the_wire_does_not_kill_the_listener", check_bad_input_on_the_wire_does_not_kill_the_listener),
)


async def run_check(check: Check, spec: TransportSpec, tmp_path: Path) -> None:
    """Run one check on a fresh transport from ``spec``; raises AssertionError (or the
    transport's error) on a violation, :class:`CheckSkipped` when it does not apply."""
    async with harness(spec, tmp_path) as h:
        await check.fn(h, **dict(check.kwargs))


async def check_transport(
    make: Callable[[], Transport],
    listen: str | Callable[[Path], str],
    *,
    tmp_path: Path | None = None,
    skip: tuple[str, ...] = (),
    **spec_options: Any,
) -> dict[str, str]:
    """Run every check (but those named in ``skip``) against transports from ``make``,
    listening at ``listen``; ``spec_options`` are further :class:`TransportSpec` fields.
    Returns check name -> "passed" or "skipped: why"; the first violation raises, with the
    check's name in the message."""
    spec = TransportSpec(make=make, listen=listen, **spec_options)
    results: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        base = tmp_path or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="aionet-conformance-")))
        for i, check in enumerate(CHECKS):
            if check.name in skip:
                results[check.name] = "skipped: asked to"
                continue
            where = base / f"check{i}"
            where.mkdir(parents=True, exist_ok=True)
            try:
                await run_check(check, spec, where)
            except CheckSkipped as exc:
                results[check.name] = f"skipped: {exc}"
            except Exception as exc:
                raise AssertionError(f"conformance check {check.name} failed: {exc!r}") from exc
            else:
                results[check.name] = "passed"
    return results


__all__ = [
    "CHECKS",
    "Check",
    "CheckSkipped",
    "Harness",
    "TransportSpec",
    "check_transport",
    "harness",
    "run_check",
]
