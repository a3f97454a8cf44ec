"""In-process transport: ``inproc://name`` joins coroutines on one event loop, zero-copy.

Buffer sharing: ``send`` hands the *very same* frame objects to the receiver; nothing is
copied or serialized. The sender must not mutate a buffer after sending it, and the receiver
must treat frames it did not allocate as shared (a ``bytearray`` sent here is the sender's
``bytearray``). Frames arrive with whatever type they were sent with.

The one allowed module-level state: ``connect("inproc://a")`` has to find the listener named
``a`` without any object the two sides share, so a name table must exist outside any Node.
It is scoped to the running event loop (a ``WeakKeyDictionary`` keyed by the loop): nodes on
different loops never see each other's names, and a loop's table disappears with the loop,
so tests that each run their own loop cannot collide or leak listeners.

``inproc://`` (or ``inproc://0`` / ``inproc://*``) picks a fresh unique name, the equivalent
of TCP port 0; ``Listener.address`` reports it.

Back-pressure: each direction is a FIFO bounded by ``max_queued_bytes`` (default 64 MiB) and
``max_queued_messages`` (default 65536); ``send`` waits while the peer's queue is full. A
single message larger than the byte bound is admitted when the queue is empty, so it cannot
deadlock. Waiting senders are admitted in FIFO order.

Closing either end makes the other end's ``recv`` raise ConnectionClosed once it has drained
what was already queued; the closing end's own ``recv`` raises at once (its queue is dropped).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import weakref
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from ..errors import ConnectionClosed, TransportError
from ..log import get_logger
from ..stats import ConnectionStats
from .base import Buffer, Connection, ConnectionHandler, Listener, Message, Transport
from .options import Option, integer, parse_options, positive, size

log = get_logger("aionet.transports.inproc")

_AUTO_NAMES = ("", "0", "*")
SCHEMA: MappingProxyType[str, Option] = MappingProxyType(
    {
        "max_queued_bytes": Option(64 * 2**20, size, positive, "must be positive"),
        "max_queued_messages": Option(65536, integer, positive, "must be positive"),
    }
)


class _Namespace:
    """Listener names of one event loop."""

    def __init__(self) -> None:
        self.listeners: dict[str, InprocListener] = {}
        self._ids = itertools.count(1)

    def unique_name(self) -> str:
        while True:
            name = f"auto-{next(self._ids)}"
            if name not in self.listeners:
                return name


# Module-level by necessity (see the module docstring); keyed by loop so it is loop-scoped.
_NAMESPACES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Namespace] = weakref.WeakKeyDictionary()


def _namespace() -> _Namespace:
    loop = asyncio.get_running_loop()
    ns = _NAMESPACES.get(loop)
    if ns is None:
        ns = _NAMESPACES[loop] = _Namespace()
    return ns


def _name_of(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "inproc":
        raise TransportError(f"not an inproc:// URL: {url!r}")
    return rest.strip("/")


def _nbytes(frame: Buffer) -> int:
    if isinstance(frame, bytes | bytearray):
        return len(frame)
    return memoryview(frame).nbytes


class _Channel:
    """One direction of a connection: a bounded FIFO of whole messages."""

    __slots__ = ("closed", "max_bytes", "max_msgs", "nbytes", "queue", "reader_waiter", "send_waiters")

    def __init__(self, max_bytes: int, max_msgs: int) -> None:
        self.queue: collections.deque[tuple[Message, int]] = collections.deque()
        self.nbytes = 0
        self.max_bytes = max_bytes
        self.max_msgs = max_msgs
        self.closed = False
        self.reader_waiter: asyncio.Future[None] | None = None
        self.send_waiters: collections.deque[tuple[Message, int, asyncio.Future[None]]] = collections.deque()

    def _fits(self, size: int) -> bool:
        if not self.queue:
            return True  # an oversized message alone must still pass, or it would wait forever
        return self.nbytes + size <= self.max_bytes and len(self.queue) < self.max_msgs

    def _append(self, msg: Message, size: int) -> None:
        self.queue.append((msg, size))
        self.nbytes += size
        w = self.reader_waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def put(self, msg: Message, size: int) -> None:
        if self.closed:
            raise ConnectionClosed("inproc connection is closed")
        if not self.send_waiters and self._fits(size):
            self._append(msg, size)
            return
        fut = asyncio.get_running_loop().create_future()
        self.send_waiters.append((msg, size, fut))
        await fut  # a cancelled waiter stays queued with its future cancelled; _admit skips it

    def put_nowait(self, msg: Message, size: int) -> None:
        """Append ignoring the bound (small control messages: acks, heartbeats)."""
        if self.closed:
            raise ConnectionClosed("inproc connection is closed")
        self._append(msg, size)

    def _admit(self) -> None:
        waiters = self.send_waiters
        while waiters:
            msg, size, fut = waiters[0]
            if fut.done():
                waiters.popleft()
                continue
            if not self._fits(size):
                return
            waiters.popleft()
            self._append(msg, size)
            fut.set_result(None)

    def take(self, many: bool) -> list[Message]:
        if many:
            out = [m for m, _ in self.queue]
            self.queue.clear()
            self.nbytes = 0
        else:
            msg, size = self.queue.popleft()
            self.nbytes -= size
            out = [msg]
        if self.send_waiters:
            self._admit()
        return out

    async def wait(self) -> None:
        w = self.reader_waiter
        if w is None or w.done():
            w = self.reader_waiter = asyncio.get_running_loop().create_future()
        await w

    def close(self, *, discard: bool) -> None:
        """Close this direction; queued messages stay readable unless ``discard``."""
        self.closed = True
        if discard:
            self.queue.clear()
            self.nbytes = 0
        while self.send_waiters:
            _, _, fut = self.send_waiters.popleft()
            if not fut.done():
                fut.set_exception(ConnectionClosed("inproc connection closed while send was waiting"))
        w = self.reader_waiter
        if w is not None and not w.done():
            w.set_result(None)


class InprocConnection(Connection):
    """One end of an in-process connection. Frames are shared, not copied."""

    shares_frames = True

    def __init__(self, rx: _Channel, tx: _Channel, local: str, peer: str) -> None:
        self._rx = rx
        self._tx = tx
        self._closed = False
        self.local_address = local
        self.peer_address = peer

    async def send(self, frames: Sequence[Buffer]) -> None:
        if self._closed:
            raise ConnectionClosed("inproc connection is closed")
        msg = list(frames)
        size = 0
        for f in msg:
            size += _nbytes(f)
        await self._tx.put(msg, size)

    def send_nowait(self, frames: Sequence[Buffer]) -> None:
        if self._closed:
            raise ConnectionClosed("inproc connection is closed")
        msg = list(frames)
        self._tx.put_nowait(msg, sum(_nbytes(f) for f in msg))

    async def recv(self) -> Message:
        rx = self._rx
        while True:
            if rx.queue and not self._closed:
                return rx.take(many=False)[0]
            if rx.closed or self._closed:
                raise ConnectionClosed("inproc connection closed")
            await rx.wait()

    async def recv_many(self) -> list[Message]:
        rx = self._rx
        while True:
            if rx.queue and not self._closed:
                return rx.take(many=True)
            if rx.closed or self._closed:
                raise ConnectionClosed("inproc connection closed")
            await rx.wait()

    def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._rx.close(discard=True)  # our own recv raises now
        self._tx.close(discard=False)  # the peer drains what we sent, then sees ConnectionClosed

    async def close(self) -> None:
        self.abort()

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> ConnectionStats:
        return ConnectionStats(
            local=self.local_address,
            remote=self.peer_address,
            queued_send_bytes=self._tx.nbytes,
            queued_recv_bytes=self._rx.nbytes,
            queued_recv_messages=len(self._rx.queue),
            extra={"queued_send_messages": len(self._tx.queue)},
        )


class InprocListener(Listener):
    """A named endpoint in the running loop's namespace."""

    def __init__(self, ns: _Namespace, name: str, handler: ConnectionHandler, transport: InprocTransport):
        self._ns = ns
        self._name = name
        self._handler = handler
        self._transport = transport
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"inproc://{self._name}"

    def _accept(self, conn: InprocConnection) -> None:
        task = asyncio.get_running_loop().create_task(self._run_handler(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_handler(self, conn: InprocConnection) -> None:
        try:
            await self._handler(conn)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("inproc connection handler raised", address=self.address)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._ns.listeners.get(self._name) is self:
            del self._ns.listeners[self._name]
        self._transport._listeners.discard(self)


class InprocTransport(Transport):
    """Same-loop message passing with no copies; see the module docstring for the sharing rules."""

    schemes = ("inproc",)

    def __init__(self, options: dict[str, Any] | None = None, limits: Any = None) -> None:
        super().__init__(options, limits)
        opts = parse_options("inproc", SCHEMA, self.options)
        self._max_bytes: int = opts["max_queued_bytes"]
        self._max_msgs: int = opts["max_queued_messages"]
        self._listeners: set[InprocListener] = set()
        self._conns: weakref.WeakSet[InprocConnection] = weakref.WeakSet()

    async def listen(self, url: str, handler: ConnectionHandler) -> Listener:
        ns = _namespace()
        name = _name_of(url)
        if name in _AUTO_NAMES:
            name = ns.unique_name()
        if name in ns.listeners:
            raise TransportError(f"inproc://{name} is already in use in this event loop")
        listener = InprocListener(ns, name, handler, self)
        ns.listeners[name] = listener
        self._listeners.add(listener)
        return listener

    async def connect(self, url: str, *, timeout: float | None = None) -> Connection:
        name = _name_of(url)
        listener = _namespace().listeners.get(name)
        if listener is None:
            raise TransportError(f"no inproc listener named {name!r} in this event loop")
        a_to_b = _Channel(self._max_bytes, self._max_msgs)
        b_to_a = _Channel(self._max_bytes, self._max_msgs)
        addr = listener.address
        client = InprocConnection(rx=b_to_a, tx=a_to_b, local="inproc://", peer=addr)
        server = InprocConnection(rx=a_to_b, tx=b_to_a, local=addr, peer="inproc://")
        self._conns.add(client)
        self._conns.add(server)
        listener._accept(server)
        return client

    async def aclose(self) -> None:
        for listener in list(self._listeners):
            await listener.close()
        for conn in list(self._conns):
            conn.abort()
