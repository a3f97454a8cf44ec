"""The listener side: one ROUTER socket, one PeerConnection per routing id."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import os
import socket as _socket
from typing import Any

import zmq

from ...errors import ConnectionClosed, ProtocolError, TransportError
from ...log import get_logger
from ...stats import ConnectionStats
from ..base import ConnectionHandler, Listener
from . import wire
from .connection import ZConnection
from .endpoint import IpcFile
from .pump import EVENT_NAMES, MON_EVENTS, MORE, NOBLOCK, PROTOCOL_ERRORS, Monitor, Pump, bsend, zmq_error
from .wire import BYE, EMPTY, HELLO, MALFORMED

log = get_logger("aionet.transports.zmq")


# ======================================================================================
# Listener side: one ROUTER socket, one PeerConnection per routing id
# ======================================================================================
class PeerConnection(ZConnection):
    """The listener's view of one dialer, multiplexed on the ROUTER by routing id."""

    def __init__(self, listener: RouterListener, rid: bytes, fd: int, peer: str) -> None:
        super().__init__(listener, listener._loop, listener._opts)
        self._listener = listener
        self._transport = listener._transport
        self._rid = rid
        self._fd = fd
        self.local_address = listener.address
        self.peer_address = peer

    def _send_one(self, frame: bytes) -> None:
        sock = self._bsock
        bsend(sock, self._rid, MORE)
        bsend(sock, frame, NOBLOCK)

    def _try_send(self, parts: list[Any], large: bool) -> list[asyncio.Future[None]] | None:
        try:
            waits = self._send_parts(parts, large, self._rid)
        except zmq.ZMQError as exc:
            err = zmq_error(exc, f"send to {self.peer_address}")
            if isinstance(err, ConnectionClosed):
                self._remote_end(err)
            raise err from exc
        if waits is None:
            self._listener._blocked[self] = None
        return waits

    def _remote_end(self, exc: ConnectionClosed) -> None:
        if self._eof is None and not self._closed:
            self._eof = exc
            self._fail_sends(exc)
            self._wake()
        self._listener._forget(self)

    def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._eof is None:
            self._listener._send_bye(self._rid)
        self._fail_sends(ConnectionClosed("connection closed"))
        self._drop_queue()
        self._wake()
        self._listener._forget(self)

    async def close(self) -> None:
        self.abort()

    def stats(self) -> ConnectionStats:
        st = super().stats()
        extra = {
            **st.extra,
            "socket": "ROUTER",
            "routing_id": self._rid.hex(),
            "curve": self._listener._transport.curve,
        }
        return dataclasses.replace(st, extra=extra)


class RouterListener(Pump, Listener):
    """A bound ROUTER socket; peers become Connections after a hello."""

    def __init__(
        self,
        transport: Any,
        sock: zmq.Socket,
        address: str,
        handler: ConnectionHandler,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._transport = transport
        self._address = address
        self._scheme = address.split("://", 1)[0]
        self._handler = handler
        self._conns: dict[bytes, PeerConnection] = {}
        self._by_fd: dict[int, PeerConnection] = {}
        self._live_fds: set[int] = set()
        self._blocked: dict[PeerConnection, None] = {}
        self._byes: collections.deque[bytes] = collections.deque()
        self._accepting = True
        self._shut = False
        self._retry: asyncio.TimerHandle | None = None
        self._retry_delay = 0.001
        self._ipc_file: IpcFile | None = None  # removed when the listener stops accepting
        Pump.__init__(self, sock, loop, transport._opts, transport.limits)
        self._monitor = Monitor(transport._context(), sock, loop, self._on_event, MON_EVENTS)

    @property
    def address(self) -> str:
        return self._address

    # --- receive ----------------------------------------------------------------------------
    def _drain(self, budget: int, force: bool = False) -> bool:
        recv = self._sock.recv
        conns = self._conns
        zc = self._opts.zc_min
        max_b = 1 << 62 if force else self._opts.max_queued_bytes
        max_m = 1 << 62 if force else self._opts.max_queued_msgs
        if self._stopped or (self._paused and not force):
            return False
        qb, qm = self._queued_bytes, self._queued_msgs  # kept in locals on the hot path
        n = 0
        try:
            while n < budget:
                if qb > max_b or qm > max_m:
                    self._paused = True
                    return False
                try:
                    rid = recv(NOBLOCK)
                except zmq.Again:
                    self._again = True
                    return False
                n += 1
                fr = recv(0, copy=False)
                conn = conns.get(rid)
                if conn is not None:
                    size = len(fr)
                    if size and not fr.more:  # the common case, inlined: one non-empty frame
                        conn._rq.append([fr.bytes if size < zc else fr.buffer])
                        conn._rq_bytes += size
                        qb += size
                        qm += 1
                        if conn._on_messages is not None:
                            self._marked[conn] = None
                        else:
                            w = conn._rx_waiter
                            if w is not None and not w.done():
                                w.set_result(None)
                        continue
                self._queued_bytes, self._queued_msgs = qb, qm
                try:
                    self._slow_message(rid, fr, conn)
                finally:
                    qb, qm = self._queued_bytes, self._queued_msgs
                if self._stopped or (self._paused and not force):
                    return False
            return True
        finally:
            self._queued_bytes, self._queued_msgs = qb, qm

    def _slow_message(self, rid: bytes, fr: zmq.Frame, conn: PeerConnection | None) -> None:
        if conn is None:
            self._stranger(rid, fr)
            return
        ctl, frames, size = self._rx.body(fr)
        if ctl is None:
            conn._deliver(frames, size)
        else:
            self._control(conn, ctl, frames)

    def _control(self, conn: PeerConnection, ctl: bytes, args: list[Any]) -> None:
        if ctl == BYE:
            conn._remote_end(ConnectionClosed(f"peer {conn.peer_address} closed the connection"))
            return
        if ctl == MALFORMED and args and isinstance(args[0], ProtocolError):
            err: ProtocolError = args[0]
        else:
            err = ProtocolError(f"unexpected control frame {ctl[:16]!r}")
        log.warning(
            "zmq peer violated the protocol; closing its connection",
            peer=conn.peer_address,
            listener=self._address,
            error=str(err),
        )
        closed = ConnectionClosed(f"protocol violation by {conn.peer_address}: {err}")
        closed.__cause__ = err
        self._send_bye(conn._rid, str(err).encode()[:200])
        conn._remote_end(closed)

    def _stranger(self, rid: bytes, fr: zmq.Frame) -> None:
        """First message from an unknown routing id: only a valid hello creates a Connection."""
        try:
            fd = fr.get(zmq.SRCFD)
        except zmq.ZMQError:  # e.g. a ZMTP 1.0 peer: no descriptor, so its death is unobservable
            fd = -1
        ctl, args, _ = self._rx.body(fr)
        if ctl != HELLO:
            if ctl != BYE:  # a bye from a peer we already forgot is normal
                log.debug("zmq message from unknown peer ignored", listener=self._address, control=ctl)
            return
        if not wire.version_ok(args):
            log.warning(
                "zmq hello with unsupported version rejected",
                listener=self._address,
                version=bytes(args[0][:32]) if args else None,
            )
            self._send_bye(rid, b"unsupported protocol version")
            return
        if not self._accepting:
            self._send_bye(rid, b"listener closed")
            return
        if fd < 0:
            self._send_bye(rid, b"connection cannot be tracked (ZMTP 3 required)")
            return
        self._monitor.poll()  # bring fd liveness up to date before trusting SRCFD
        if fd not in self._live_fds:
            log.debug("zmq hello from an already disconnected peer ignored", listener=self._address)
            return
        old = self._by_fd.get(fd)
        if old is not None:  # fd reused: its previous owner is certainly gone
            old._remote_end(ConnectionClosed(f"peer {old.peer_address} disconnected"))
        try:
            self._sock.send_multipart([rid, *wire.welcome()], NOBLOCK)
        except zmq.ZMQError:
            return
        conn = PeerConnection(self, rid, fd, self._peer_name(fd))
        self._conns[rid] = conn
        self._by_fd[fd] = conn
        self._transport._own(self._loop.create_task(self._run_handler(conn), name=f"aionet-zmq {conn.peer_address}"))

    def _peer_name(self, fd: int) -> str:
        if self._scheme == "zmq+ipc":
            return f"zmq+ipc://{self._address.split('://', 1)[1]}#fd{fd}"
        try:
            with _socket.socket(fileno=os.dup(fd)) as s:
                host, port = s.getpeername()[:2]
        except OSError:
            return f"zmq+tcp://?#fd{fd}"
        host = f"[{host}]" if ":" in host else host
        return f"zmq+tcp://{host}:{port}"

    async def _run_handler(self, conn: PeerConnection) -> None:
        try:
            await self._handler(conn)
        except asyncio.CancelledError:
            conn.abort()
            raise
        except ConnectionClosed as exc:  # the stream ended under the handler: not a bug
            log.debug("zmq connection ended in its handler", peer=conn.peer_address, reason=str(exc))
            conn.abort()
        except Exception:
            log.exception("zmq connection handler raised; closing", listener=self._address, peer=conn.peer_address)
            conn.abort()

    def _on_event(self, event: int, value: int) -> None:
        if event == zmq.EVENT_ACCEPTED:
            self._live_fds.add(value)
        elif event == zmq.EVENT_DISCONNECTED:
            self._live_fds.discard(value)
            conn = self._by_fd.get(value)
            if conn is not None:
                # Everything the peer sent before dying is already queued in zmq: take it first.
                self._drain_all()
                conn._remote_end(ConnectionClosed(f"peer {conn.peer_address} disconnected"))
                self.kick()
        elif event & (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
            detail = PROTOCOL_ERRORS.get(value) if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL else None
            if self._transport.curve:  # refused before any message got through; worth a warning
                log.warning(
                    "zmq handshake with an incoming peer failed: CurveZMQ is required here; the peer "
                    "is plaintext or dialed with another server key (curve_server_key_file)",
                    listener=self._address,
                    zmq_event=EVENT_NAMES.get(event, event),
                    detail=detail,
                )
            else:
                log.info(
                    "zmq handshake with an incoming peer failed",
                    listener=self._address,
                    zmq_event=EVENT_NAMES.get(event, event),
                    detail=detail,
                )

    def _drain_all(self) -> None:
        with contextlib.suppress(zmq.ZMQError):  # bounded by what zmq holds: rcvhwm per peer
            self._drain(self._opts.rcvhwm * (len(self._conns) + 1) + 1024, force=True)
        if self._over_bound():
            self._paused = True

    # --- send -------------------------------------------------------------------------------
    def _send_bye(self, rid: bytes, reason: bytes = b"") -> None:
        if self._shut:
            return
        try:
            self._sock.send_multipart([rid, EMPTY, BYE, reason], NOBLOCK)
        except zmq.Again:
            self._byes.append(rid)  # the peer's queue is full; retried with other blocked sends
            self._arm_retry()
        except zmq.ZMQError:
            pass  # peer already gone
        self.kick()

    def _has_pending(self) -> bool:
        return bool(self._blocked or self._byes)

    def _flush(self) -> bool:
        progress = False
        for _ in range(len(self._byes)):
            rid = self._byes.popleft()
            try:
                self._sock.send_multipart([rid, EMPTY, BYE, b""], NOBLOCK)
                progress = True
            except zmq.Again:
                self._byes.append(rid)
            except zmq.ZMQError:
                progress = True
        for conn in list(self._blocked):
            del self._blocked[conn]
            if conn._flush_queue():
                progress = True
            if conn._sendq and not conn._closed and conn._eof is None:
                self._blocked.setdefault(conn, None)
        return progress

    def _idle(self) -> None:
        if self._blocked or self._byes:
            self._arm_retry()
        else:
            self._retry_delay = 0.001

    def _arm_retry(self) -> None:
        # ROUTER's POLLOUT means "some peer has room", so a single full peer is re-tried on a
        # short backoff timer as well as on every wake-up of the socket.
        if self._retry is None and not self._shut:
            self._retry = self._loop.call_later(self._retry_delay, self._retry_now)
            self._retry_delay = min(self._retry_delay * 2, 0.02)

    def _retry_now(self) -> None:
        self._retry = None
        if self._flush():
            self._retry_delay = 0.001
        self._service()

    def _fatal(self, exc: zmq.ZMQError) -> None:
        log.error("zmq listener socket failed", listener=self._address, error=str(exc))
        self._shutdown(zmq_error(exc, "listener socket failed"))

    # --- lifecycle --------------------------------------------------------------------------
    def _forget(self, conn: PeerConnection) -> None:
        if self._conns.get(conn._rid) is conn:
            del self._conns[conn._rid]
        if self._by_fd.get(conn._fd) is conn:
            del self._by_fd[conn._fd]
        self._blocked.pop(conn, None)
        if not self._accepting and not self._conns:
            self._shutdown(None)

    async def close(self) -> None:
        """Stop accepting. The socket (and port) stays open until its last Connection closes,
        because closing a ROUTER would cut every established peer."""
        if not self._accepting:
            return
        self._accepting = False
        self._remove_ipc_file()  # established peers keep their connections; new dials fail fast
        if not self._conns:
            self._shutdown(None)

    def _remove_ipc_file(self) -> None:
        f, self._ipc_file = self._ipc_file, None
        if f is not None:
            f.remove()

    def _shutdown(self, exc: TransportError | None) -> None:
        if self._shut:
            return
        self._accepting = False
        err = ConnectionClosed("listener shut down")
        if exc is not None:
            err.__cause__ = exc
        for conn in list(self._conns.values()):
            conn._remote_end(err)
        for rid in self._byes:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.send_multipart([rid, EMPTY, BYE, b""], NOBLOCK)
        self._shut = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._stop()
        self._monitor.close()
        self._sock.close(linger=self._opts.linger_ms)
        self._remove_ipc_file()
        self._transport._listeners.discard(self)
