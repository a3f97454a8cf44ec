"""TCP transport (``tcp://host:port``): aionet framing over asyncio streams, tuned for both
floods of small messages and multi-GiB buffers.

The connection itself (receive and send paths) is :class:`~aionet.transports.tcp_connection.TCPConnection`,
re-exported here.

Options (``[transport] tcp = {...}``): ``nodelay`` (True), ``max_queued_bytes`` (64 MiB),
``read_batch_bytes`` (1 MiB: with a consumer waiting, reading pauses once this much is queued
so that it runs; it resumes as soon as the consumer takes the messages; in push mode, after this
much in messages with large frames, reading stops for one loop iteration so that the consumers
their delivery woke run before more large frames are read, each into its own buffer),
``write_high_water`` (4 MiB), ``flush_bytes`` (256 KiB: a batch this big is written without
waiting for the next loop iteration), ``copy_below`` (64 KiB), ``large_frame_bytes`` (64 KiB),
``staging_bytes`` (256 KiB), ``reuse_frames`` (16: large-frame buffers the receiver dropped are
reused for the next frame of the same size, freed after 2 s without large frames; beyond two,
only while they total at most 64 MiB; 16 because when big sends overlap (copying sends,
``link.big_copy_max_bytes``, or several senders) several 1 MiB frames arrive before the
consumer drops the first: with 4, over a quarter of them were fresh memory),
``rcvlowat_bytes`` (1 MiB: while a frame of at least twice this arrives, SO_RCVLOWAT asks the
kernel to wake the reader per this many bytes, never more than the frame still owes, and is 1
again once it is complete; 0: off; plain TCP only; measured about 3 % (1.5-6 %) less CPU per byte
for a 4-rank 64 MiB allreduce, no change at 2 ranks), ``close_timeout`` (5 s), ``backlog`` (1024).

Errors: connect failures raise :class:`~aionet.errors.TransportError` (the OSError is the
``__cause__``); a connect timeout raises :class:`ConnectTimeout`, which is both a
TransportError and a builtin ``TimeoutError`` (= ``asyncio.TimeoutError``).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import ConnectTimeout, TransportError, TransportUnavailable
from ..log import get_logger
from .base import Address, Connection, ConnectionHandler, Listener, Transport, map_errors
from .options import Option, boolean, integer, non_negative, number, parse_options
from .tcp_connection import MESSAGE_OVERHEAD, TCPConnection

if TYPE_CHECKING:
    import ssl

    from ..config import LimitsSection

log = get_logger("aionet.transports.tcp")

#: Option name -> default (read-only). Unknown options are a configuration error.
DEFAULT_OPTIONS: MappingProxyType[str, Any] = MappingProxyType(
    {
        "nodelay": True,
        "max_queued_bytes": 64 * 2**20,
        "read_batch_bytes": 2**20,
        "write_high_water": 4 * 2**20,
        "flush_bytes": 256 * 2**10,
        "copy_below": 64 * 2**10,
        "large_frame_bytes": 64 * 2**10,
        "staging_bytes": 256 * 2**10,
        "reuse_frames": 16,
        "rcvlowat_bytes": 2**20,
        "close_timeout": 5.0,
        "backlog": 1024,
    }
)


#: The declared schema: bools are booleans, every other option a non-negative number of its default's type.
SCHEMA: MappingProxyType[str, Option] = MappingProxyType(
    {
        key: Option(default, boolean)
        if isinstance(default, bool)
        else Option(default, integer if isinstance(default, int) else number, non_negative, "must not be negative")
        for key, default in DEFAULT_OPTIONS.items()
    }
)


def _options(raw: dict[str, Any]) -> dict[str, Any]:
    return parse_options("tcp", SCHEMA, raw)


class TCPListener(Listener):
    """A listening socket; runs ``handler(conn)`` as a task per accepted connection."""

    def __init__(self, server: asyncio.AbstractServer, url: str, tasks: set[asyncio.Task[None]]) -> None:
        self._server = server
        self._url = url
        self._tasks = tasks  # handler tasks, referenced so they are not garbage-collected
        self._closed = False

    @property
    def address(self) -> str:
        return self._url

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.close()  # listening sockets close now; accepted connections stay open

    def __repr__(self) -> str:
        return f"<TCPListener {self._url}{' closed' if self._closed else ''}>"


class TCPTransport(Transport):
    """``tcp://`` listeners and connections carrying aionet framing."""

    schemes: ClassVar[tuple[str, ...]] = ("tcp",)

    def __init__(self, options: dict[str, Any] | None = None, limits: LimitsSection | None = None):
        super().__init__(options, limits)
        self._opts = _options(self.options)

    # Hooks for a TLS subclass: an SSLContext turns this into tls:// with no other change.
    def _server_ssl(self) -> ssl.SSLContext | None:
        return None

    def _client_ssl(self, addr: Address) -> ssl.SSLContext | None:
        return None

    def _ssl_handshake_timeout(self) -> float | None:
        return None

    def _ssl_kwargs(self, ctx: ssl.SSLContext | None) -> dict[str, Any]:
        if ctx is None:
            return {}  # asyncio rejects ssl_handshake_timeout without ssl
        return {"ssl": ctx, "ssl_handshake_timeout": self._ssl_handshake_timeout()}

    def _check_url(self, url: str) -> Address:
        addr = Address.parse(url)
        if addr.scheme not in self.schemes:
            raise TransportUnavailable(f"{type(self).__name__} cannot handle {addr.scheme!r} URLs: {url!r}")
        if addr.port is None:
            raise TransportUnavailable(f"missing port in {url!r} (use :0 to pick a free one)")
        return addr

    def _connection(
        self, loop: asyncio.AbstractEventLoop, cb: Callable[[TCPConnection], None] | None = None
    ) -> TCPConnection:
        return TCPConnection(loop, self._opts, self.limits, cb)

    async def listen(self, url: str, handler: ConnectionHandler) -> Listener:
        addr = self._check_url(url)
        loop = asyncio.get_running_loop()
        host = addr.host or "0.0.0.0"
        with map_errors({OSError: lambda e: TransportError(f"cannot resolve {host!r} for {url}: {e}")}):
            # Bind exactly one address: with port 0 and a name resolving to several addresses
            # each socket would get a different port.
            infos = await loop.getaddrinfo(host, addr.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            bind_host = infos[0][4][0]
        tasks: set[asyncio.Task[None]] = set()

        def start(conn: TCPConnection) -> None:
            task = loop.create_task(_run_handler(handler, conn), name=f"aionet-tcp {conn.peer_address}")
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        with map_errors({OSError: lambda e: TransportError(f"cannot listen on {url}: {e.strerror or e}")}):
            server = await loop.create_server(
                lambda: self._connection(loop, start),
                bind_host,
                addr.port,
                backlog=self._opts["backlog"],
                **self._ssl_kwargs(self._server_ssl()),
            )
        port = server.sockets[0].getsockname()[1]
        listener = TCPListener(server, Address(addr.scheme, host, port, "").url(), tasks)
        log.debug("listening", address=listener.address)
        return listener

    async def connect(self, url: str, *, timeout: float | None = None) -> Connection:
        addr = self._check_url(url)
        loop = asyncio.get_running_loop()
        conn = self._connection(loop)
        with map_errors(
            {
                TimeoutError: lambda e: ConnectTimeout(f"connect to {url} timed out after {timeout}s"),
                OSError: lambda e: TransportError(f"cannot connect to {url}: {e.strerror or e}"),
            }
        ):
            async with asyncio.timeout(timeout):
                await loop.create_connection(
                    lambda: conn,
                    addr.host or "127.0.0.1",
                    addr.port,
                    **self._ssl_kwargs(self._client_ssl(addr)),
                )
        return conn


async def _run_handler(handler: ConnectionHandler, conn: TCPConnection) -> None:
    try:
        await handler(conn)
    except asyncio.CancelledError:
        conn.abort()
        raise
    except Exception:
        log.exception("connection handler failed; closing connection", peer=conn.peer_address)
        conn.abort()


__all__ = [
    "DEFAULT_OPTIONS",
    "MESSAGE_OVERHEAD",
    "SCHEMA",
    "ConnectTimeout",
    "TCPConnection",
    "TCPListener",
    "TCPTransport",
]
