"""ZMQTransport: one zmq Context per instance, ROUTER listeners and DEALER connections."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import zmq

from ...errors import TransportError, TransportUnavailable
from ...log import get_logger
from ..base import Connection, ConnectionHandler, Listener, Transport, map_errors
from .connection import DealerConnection
from .curve import ZAP_DOMAIN, ZapHandler
from .endpoint import IpcFile, ipc_in_use, zmq_endpoint
from .listener import RouterListener
from .options import Options
from .pump import zmq_error

log = get_logger("aionet.transports.zmq")


# ======================================================================================
class ZMQTransport(Transport):
    """ZeroMQ transport (ROUTER listener, DEALER per connection); see the module docstring."""

    schemes = ("zmq+tcp", "zmq+ipc")

    def __init__(self, options: dict[str, Any] | None = None, limits: Any = None) -> None:
        super().__init__(options, limits)
        self._opts = Options(self.options)
        self._ctx: zmq.Context | None = None
        self._zap: ZapHandler | None = None
        self._listeners: set[RouterListener] = set()
        self._dialers: set[DealerConnection] = set()
        self._tasks: set[asyncio.Task[Any]] = set()  # handler and push-mode tasks; ended in aclose
        self._closed = False

    @classmethod
    def check_available(cls) -> None:
        if zmq.zmq_version_info() < (4, 3, 2):
            raise TransportUnavailable(
                f"zmq transport needs libzmq >= 4.3.2 (reconnect disable, heartbeats); have {zmq.zmq_version()}"
            )

    def _context(self) -> zmq.Context:
        if self._closed:
            raise TransportError("zmq transport is closed")
        if self._ctx is None:
            ctx = zmq.Context(io_threads=self._opts.io_threads)
            ctx.setsockopt(zmq.MAX_SOCKETS, self._opts.max_sockets)
            if self._opts.curve is not None:
                try:  # before any socket exists, so no handshake can happen without it
                    self._zap = ZapHandler(ctx, asyncio.get_running_loop(), self._opts.curve.allowed)
                except BaseException:
                    ctx.destroy(linger=0)
                    raise
            self._ctx = ctx
        return self._ctx

    @property
    def curve(self) -> bool:
        """True when every socket of this transport speaks CurveZMQ."""
        return self._opts.curve is not None

    def _socket(self, kind: int, *, ipv6: bool, server: bool) -> zmq.Socket:
        o = self._opts
        sock = self._context().socket(kind)
        keys = o.curve
        if keys is not None:
            if server:  # refuses NULL (plaintext) peers; the ZAP handler checks client keys
                sock.setsockopt(zmq.CURVE_SERVER, 1)
                sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
                sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
                with contextlib.suppress(zmq.ZMQError, AttributeError):  # draft option in some builds
                    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
            else:
                sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server)
                sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
                sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
        sock.copy_threshold = 0  # copy-or-not is decided per frame here
        sock.setsockopt(zmq.LINGER, o.linger_ms)
        sock.setsockopt(zmq.SNDHWM, o.sndhwm)
        sock.setsockopt(zmq.RCVHWM, o.rcvhwm)
        sock.setsockopt(zmq.MAXMSGSIZE, max(self.limits.max_frame_bytes, self.limits.max_header_bytes))
        sock.setsockopt(zmq.HANDSHAKE_IVL, int(max(o.connect_timeout, 1.0) * 1000))
        if o.hb_ivl_ms > 0:
            sock.setsockopt(zmq.HEARTBEAT_IVL, o.hb_ivl_ms)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, o.hb_timeout_ms)
            sock.setsockopt(zmq.HEARTBEAT_TTL, o.hb_timeout_ms)
        if ipv6:
            sock.setsockopt(zmq.IPV6, 1)
        return sock

    async def listen(self, url: str, handler: ConnectionHandler) -> Listener:
        endpoint = zmq_endpoint(url, bind=True)
        if endpoint.startswith("ipc://") and ipc_in_use(endpoint[6:]):
            # libzmq would unlink the file and silently take the path from the live listener
            raise TransportError(f"cannot listen on {url}: address in use")
        sock = self._socket(zmq.ROUTER, ipv6=endpoint.startswith("tcp://["), server=True)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            with map_errors({zmq.ZMQError: lambda e: zmq_error(e, f"cannot listen on {url}")}):
                sock.bind(endpoint)
                bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except TransportError:
            sock.close(0)
            raise
        address = f"zmq+{bound}"
        listener = RouterListener(self, sock, address, handler, asyncio.get_running_loop())
        if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
            listener._ipc_file = IpcFile.created(endpoint[6:])
        self._listeners.add(listener)
        log.debug("zmq listening", address=address)
        return listener

    async def connect(self, url: str, *, timeout: float | None = None) -> Connection:
        endpoint = zmq_endpoint(url, bind=False)
        timeout = self._opts.connect_timeout if timeout is None else timeout
        sock = self._socket(zmq.DEALER, ipv6=endpoint.startswith("tcp://["), server=False)
        sock.setsockopt(zmq.RECONNECT_IVL, -1)  # a dropped link is ConnectionClosed, never re-dialled
        sock.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing towards a link that is not up
        sock.setsockopt(zmq.CONNECT_TIMEOUT, max(1, int(timeout * 1000)))
        conn = DealerConnection(self, sock, url, asyncio.get_running_loop())
        self._dialers.add(conn)
        try:
            with map_errors({zmq.ZMQError: lambda e: zmq_error(e, f"cannot connect to {url}")}):
                sock.connect(endpoint)
        except TransportError:
            conn.abort()
            raise
        await conn._connect(timeout)
        return conn

    def _own(self, task: asyncio.Task[Any]) -> None:
        """Keep a task this transport started until it ends; aclose waits for it."""
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("zmq transport task failed", task=task.get_name(), error=repr(exc), exc_info=exc)

    async def aclose(self) -> None:
        if self._closed:
            return
        for conn in list(self._dialers):
            conn.abort()
        for listener in list(self._listeners):
            listener._shutdown(None)
        self._closed = True
        if self._tasks:
            # Every connection has ended, so handlers reading them finish by themselves; a
            # handler still busy after a moment is cancelled, and each is awaited.
            me = asyncio.current_task()
            tasks = [t for t in self._tasks if t is not me]
            pending: set[asyncio.Task[Any]] = set()
            if tasks:
                _done, pending = await asyncio.wait(tasks, timeout=1.0)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        if self._zap is not None:
            self._zap.close()
            self._zap = None
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            # term() waits for lingering sockets to flush (bounded by `linger`): not on the loop.
            await asyncio.get_running_loop().run_in_executor(None, ctx.term)
