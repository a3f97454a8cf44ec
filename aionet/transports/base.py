"""The transport contract: move *messages*, each a list of frames, between two endpoints.

A transport knows frames, never envelopes, peers or services. Every transport implements
the three classes below and passes the conformance suite ``aionet.testing.transports``.

Buffer ownership: ``await Connection.send(frames)`` returns once the transport no longer
needs the caller's buffers (they were copied or written to the kernel), except for
zero-copy in-process transports, which hand the very same buffer objects to the receiver
(document such sharing in the transport's docstring). Received frames are ``bytes``,
``bytearray`` or ``memoryview``; large ones are writable and owned by the receiver.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from ..errors import AionetError, TransportUnavailable
from ..stats import ConnectionStats

if TYPE_CHECKING:
    from ..config import LimitsSection

Buffer = bytes | bytearray | memoryview
Message = list[Buffer]
ConnectionHandler = Callable[["Connection"], Awaitable[None]]
#: library exception type(s) -> a function building aionet's error from the caught one
ErrorMapping = Mapping[type[Exception] | tuple[type[Exception], ...], Callable[[Any], BaseException]]


@contextlib.contextmanager
def map_errors(mapping: ErrorMapping) -> Iterator[None]:
    """Translate library exceptions (``OSError``, ``zmq.ZMQError``, ucxx errors...) into
    aionet's error types at the transport boundary, so callers catch only aionet errors.

    The first key (a type or a tuple of types) that the exception is an instance of wins, so
    list subclasses before their bases (``TimeoutError`` before ``OSError``). Its value gets
    the exception and returns the error to raise, chained with ``from``; an exception no key
    matches, and any aionet error, passes through untouched::

        with map_errors({OSError: lambda e: TransportError(f"cannot connect to {url}: {e}")}):
            await loop.create_connection(...)
    """
    try:
        yield
    except AionetError:
        raise  # already ours (TransportError is a ConnectionError: an OSError key would re-wrap it)
    except Exception as exc:
        for kinds, make in mapping.items():
            if isinstance(exc, kinds):
                raise make(exc) from exc
        raise


@dataclass(frozen=True)
class Address:
    """A parsed transport URL: ``scheme://host:port`` or ``scheme://name`` or ``scheme:///path``."""

    scheme: str
    host: str
    port: int | None
    path: str

    @classmethod
    def parse(cls, url: str) -> Address:
        if "://" not in url:
            raise TransportUnavailable(f"not a transport URL (expected scheme://...): {url!r}")
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        try:
            port = parts.port
        except ValueError:
            raise TransportUnavailable(f"bad port in {url!r}") from None
        host = parts.hostname or ""
        if parts.netloc.startswith("[") and host:  # keep IPv6 literals bracket-free
            host = host.strip("[]")
        return cls(scheme=scheme, host=host, port=port, path=parts.path)

    def url(self) -> str:
        if self.port is not None:
            host = f"[{self.host}]" if ":" in self.host else self.host
            return f"{self.scheme}://{host}:{self.port}{self.path}"
        return f"{self.scheme}://{self.host}{self.path}"


class Connection(abc.ABC):
    """One bidirectional, ordered, reliable message stream (while it lives)."""

    #: True when frames may be device (GPU) buffers that this transport moves natively.
    moves_device_memory: ClassVar[bool] = False
    #: True when the receiver gets the very frame objects sent (no copy on the way), so a
    #: sender must not hand it memory its caller may change afterwards (inproc://).
    shares_frames: ClassVar[bool] = False
    #: True when the event loop itself reads this connection's socket, so a process waiting
    #: for its next message pays an operating-system wake-up that busy polling saves
    #: (``node.busy_poll_us``). False where bytes move without one (inproc://) or in threads
    #: of their own that need the core the polling would take (libzmq's I/O threads).
    busy_polls: ClassVar[bool] = False

    local_address: str = ""
    peer_address: str = ""

    @abc.abstractmethod
    async def send(self, frames: Sequence[Buffer]) -> None:
        """Send one message (a list of 0..N frames). Waits while the peer is slow
        (back-pressure). Raises :class:`~aionet.errors.ConnectionClosed` if closed."""

    @abc.abstractmethod
    async def recv(self) -> Message:
        """Receive one message. Raises ConnectionClosed at the end of the stream or when
        the connection failed (the exception's ``__cause__`` says why)."""

    def write_nowait(self, frames: Sequence[Buffer]) -> Awaitable[None] | None:
        """Enqueue one message now and return None, or an awaitable to await before sending
        more (back-pressure, or the transport still references the caller's buffers).

        Unlike ``send``, the message's place in the stream is fixed by this call, so a caller
        may enqueue from a synchronous callback. Default: a task running ``send`` (tasks
        start in creation order, so order holds for transports whose ``send`` enqueues
        before its first await); transports override it with a real synchronous enqueue.
        The task never leaves a "Task exception was never retrieved": a caller that drops it
        (a sender cancelled before awaiting what the link handed it) learns of a closed
        connection from the connection itself. What the caller gets is shielded: a caller
        cancelled while it waits does not cancel the send, which would take the message out of
        a stream whose later messages are already numbered after it (the peer would see a
        gap), and keep its buffers alive in the cancelled task's traceback."""
        import asyncio

        task = asyncio.ensure_future(self.send(frames))
        task.add_done_callback(_consume_exception)
        outer = asyncio.shield(task)
        outer.add_done_callback(_consume_exception)
        return outer

    def send_nowait(self, frames: Sequence[Buffer]) -> None:
        """Queue a small control message without waiting (ignores back-pressure; for acks
        and heartbeats). Raises ConnectionClosed if closed. Default: a task running send()."""
        import asyncio

        if self.closed:
            from ..errors import ConnectionClosed

            raise ConnectionClosed("connection is closed")
        task = asyncio.get_running_loop().create_task(self.send(list(frames)))
        task.add_done_callback(_consume_exception)

    def more_inbound(self) -> bool:
        """Whether bytes of a further message are already waiting to be read (a hint: the
        link acknowledges a stream of big messages once per few instead of once each).
        Default False: acknowledge at once."""
        return False

    async def recv_many(self) -> list[Message]:
        """Receive at least one message, plus whatever else is already buffered.

        Transports override this to drain without one await per message."""
        return [await self.recv()]

    def start_receiving(
        self,
        on_messages: Callable[[list[Message]], Awaitable[None] | None],
        on_closed: Callable[[BaseException], None],
    ) -> None:
        """Push mode: deliver every batch of received messages to ``on_messages``, in order.

        If ``on_messages`` returns an awaitable (the consumer must block, e.g. a full
        mailbox), no further batch is delivered until it completes (the transport stops
        reading, which back-pressures the peer). When the connection ends, ``on_closed`` gets
        the ConnectionClosed (or the consumer's exception). Transports override this to
        dispatch straight from their read callback, saving a task wake-up per batch; the
        default pumps ``recv_many`` from a task. Use either push mode or ``recv``, not both.
        """
        import asyncio

        async def pump() -> None:
            try:
                while True:
                    batch = await self.recv_many()
                    pending = on_messages(batch)
                    if pending is not None:
                        await pending
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                on_closed(exc)

        self._pump_task = asyncio.get_running_loop().create_task(pump())

    @abc.abstractmethod
    async def close(self) -> None:
        """Close both directions; idempotent. Pending ``recv`` calls raise ConnectionClosed."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool: ...

    def abort(self) -> None:
        """Close immediately without flushing (used on protocol violations). Default: schedule close."""
        import asyncio

        asyncio.get_running_loop().create_task(self.close())

    def stats(self) -> ConnectionStats:
        """Bytes and messages this connection holds queued, for ``node.stats()``; transports
        override it (transport-only details go in ``extra``)."""
        return ConnectionStats(local=self.local_address, remote=self.peer_address)


def _consume_exception(task: Any) -> None:
    if not task.cancelled():
        task.exception()


class Listener(abc.ABC):
    """A bound endpoint accepting connections; reports the address it really bound."""

    @property
    @abc.abstractmethod
    def address(self) -> str:
        """The bound URL (port 0 replaced by the actual port)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop accepting; idempotent. Established connections are not closed by this."""


class Transport(abc.ABC):
    """Factory for listeners and connections of one URL scheme (or family of schemes)."""

    schemes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: dict[str, Any] | None = None, limits: LimitsSection | None = None):
        from ..config import LimitsSection

        self.options: dict[str, Any] = dict(options or {})
        self.limits: LimitsSection = limits or LimitsSection()

    @classmethod  # noqa: B027 - optional hook, empty on purpose
    def check_available(cls) -> None:
        """Raise TransportUnavailable naming what is missing if this cannot run here."""

    @abc.abstractmethod
    async def listen(self, url: str, handler: ConnectionHandler) -> Listener:
        """Bind ``url`` and call ``handler(conn)`` (as a task) for each accepted connection."""

    @abc.abstractmethod
    async def connect(self, url: str, *, timeout: float | None = None) -> Connection:
        """Open a connection to a listener at ``url``. Raises TransportError on failure."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release transport-wide resources (contexts, workers). Idempotent."""
