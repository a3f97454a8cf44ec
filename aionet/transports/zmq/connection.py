"""Connections: the receive and send queues both ends share, and the dialer's DEALER connection."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from ...errors import ConnectionClosed, HandshakeError, ProtocolError, TransportError
from ...log import get_logger
from ...stats import ConnectionStats
from ..base import Buffer, Connection, Message
from ..push_delivery import PushDelivery
from . import wire
from .pump import DIAL_FAIL_EVENTS, EVENT_NAMES, MORE, NOBLOCK, Monitor, Pump, bsend, zmq_error
from .wire import BYE, DATA, EMPTY, MALFORMED, WELCOME

if TYPE_CHECKING:
    from .options import Options

log = get_logger("aionet.transports.zmq")


def _nbytes(frame: Any) -> int:
    if type(frame) is bytes or type(frame) is bytearray:
        return len(frame)
    return memoryview(frame).nbytes


def _immutable(frame: Any) -> bool:
    """True when nobody can change the bytes after send, so zmq may keep a reference."""
    if type(frame) is bytes:
        return True
    return type(frame) is memoryview and frame.readonly and type(frame.obj) is bytes


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _released(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[None]) -> None:
    # Runs in pyzmq's garbage-collector thread once libzmq has freed the zero-copy frame.
    with contextlib.suppress(RuntimeError):  # loop already closed: nobody is waiting
        loop.call_soon_threadsafe(_set_done, fut)


def _consume_exception(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def _closed_error(exc: TransportError) -> ConnectionClosed:
    if isinstance(exc, ConnectionClosed):
        return exc
    err = ConnectionClosed(str(exc))
    err.__cause__ = exc
    return err


def _all_done(loop: asyncio.AbstractEventLoop, waits: list[asyncio.Future[None]]) -> asyncio.Future[None]:
    """One future for several zero-copy release futures (which only ever get a result)."""
    done = loop.create_future()
    left = [len(waits)]

    def one(_fut: asyncio.Future[None]) -> None:
        left[0] -= 1
        if not left[0]:
            _set_done(done)

    for w in waits:
        w.add_done_callback(one)
    return done


def _chain_send(loop: asyncio.AbstractEventLoop, done: asyncio.Future[None], item: asyncio.Future[Any]) -> None:
    """A queued write_nowait message left the queue: finish ``done`` like ``item``."""
    if done.done():
        return
    if item.cancelled():
        done.cancel()
    elif (exc := item.exception()) is not None:
        done.set_exception(exc)
    elif item.result():
        _all_done(loop, item.result()).add_done_callback(lambda _f: _set_done(done))
    else:
        done.set_result(None)


class PendingSend:
    __slots__ = ("fut", "large", "parts")

    def __init__(self, parts: list[Any], large: bool, fut: asyncio.Future[Any]) -> None:
        self.parts = parts
        self.large = large
        self.fut = fut


class ZConnection(PushDelivery, Connection):
    """Receive queue, send queue and close state shared by both ends."""

    _log = log  # PushDelivery's warning about a failed consumer

    def __init__(self, pump: Pump, loop: asyncio.AbstractEventLoop, opts: Options) -> None:
        self._pump = pump
        self._loop = loop
        self._zc_min = opts.zc_min
        self._rq: collections.deque[Message] = collections.deque()
        self._rq_bytes = 0
        self._rx_waiter: asyncio.Future[None] | None = None
        self._sendq: collections.deque[PendingSend] = collections.deque()
        self._closed = False  # closed locally
        self._eof: ConnectionClosed | None = None  # remote side ended (recv drains, then raises)
        self._bsock = pump._sock
        self._sent_gen = -1  # the pump's service count when a message last went straight out
        # push mode (start_receiving): batches go to the consumer from the pump's service pass
        self._init_push()  # PushDelivery's state
        self._end_scheduled = False

    # --- receive ----------------------------------------------------------------------------
    def _deliver(self, frames: Message, nbytes: int) -> None:
        """Queue a message (the drain loops inline this for the common case)."""
        self._rq.append(frames)
        self._rq_bytes += nbytes
        pump = self._pump
        pump._queued_bytes += nbytes
        pump._queued_msgs += 1
        if self._on_messages is not None:
            pump._marked[self] = None
            return
        w = self._rx_waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _wake(self) -> None:
        """The stream ended (or was closed): wake a reader, or report the end to a push-mode
        consumer after what is queued (on a later callback: never inside the caller's close)."""
        w = self._rx_waiter
        if w is not None and not w.done():
            w.set_result(None)
        if self._on_closed is not None and not self._end_scheduled:
            self._end_scheduled = True
            self._loop.call_soon(self._push)

    def _drop_queue(self) -> None:
        self._pump._count_out(self._rq_bytes, len(self._rq))
        self._rq.clear()
        self._rq_bytes = 0

    def _end_error(self) -> ConnectionClosed:
        if self._closed:
            return ConnectionClosed("connection closed")
        assert self._eof is not None
        err = ConnectionClosed(str(self._eof))
        err.__cause__ = self._eof.__cause__ or self._eof
        return err

    async def _wait(self) -> None:
        w = self._rx_waiter
        if w is None or w.done():
            w = self._rx_waiter = self._loop.create_future()
        await w

    async def recv(self) -> Message:
        while True:
            if self._rq and not self._closed:
                frames = self._rq.popleft()
                n = sum(map(len, frames))
                self._rq_bytes -= n
                self._pump._count_out(n, 1)
                return frames
            if self._closed or self._eof is not None:
                raise self._end_error()
            await self._wait()

    async def recv_many(self) -> list[Message]:
        while True:
            if self._rq and not self._closed:
                out = list(self._rq)
                self._rq.clear()
                n, self._rq_bytes = self._rq_bytes, 0
                self._pump._count_out(n, len(out))
                return out
            if self._closed or self._eof is not None:
                raise self._end_error()
            await self._wait()

    # --- send -------------------------------------------------------------------------------
    def _encode(self, frames: Sequence[Buffer]) -> tuple[list[Any], bool]:
        """-> (zmq parts, whether some frame is large enough for zero copy)."""
        zc = self._zc_min
        large = False
        for f in frames:
            if (len(f) if type(f) is bytes else _nbytes(f)) >= zc:
                large = True
                break
        if not frames or not _nbytes(frames[0]):
            return [EMPTY, DATA, *frames], large
        return list(frames), large

    def _send_one(self, frame: bytes) -> None:
        """Send a one-frame message, raising zmq.Again when it would block."""
        raise NotImplementedError

    def _send_parts(self, parts: list[Any], large: bool, prefix: bytes | None) -> list[asyncio.Future[None]] | None:
        """Send one multipart message without blocking.

        Returns None if zmq would block (nothing was sent), else the futures that complete
        when libzmq releases zero-copy mutable buffers (usually an empty list).
        """
        sock = self._bsock
        try:
            if prefix is not None:
                bsend(sock, prefix, MORE)
            last = len(parts) - 1
            if not large:
                for i in range(last):
                    bsend(sock, parts[i], MORE)
                bsend(sock, parts[last], NOBLOCK)
                return []
            waits: list[asyncio.Future[None]] = []
            zc = self._zc_min
            for i, p in enumerate(parts):
                flags = NOBLOCK if i == last else MORE
                if _nbytes(p) < zc:
                    bsend(sock, p, flags)
                elif _immutable(p):
                    bsend(sock, p, flags, copy=False)
                else:
                    try:
                        view = np.frombuffer(p, dtype=np.uint8)
                    except (ValueError, TypeError):  # not contiguous: copy it
                        bsend(sock, memoryview(p).tobytes(), flags)
                        continue
                    fut = self._loop.create_future()
                    weakref.finalize(view, _released, self._loop, fut).atexit = False
                    bsend(sock, view, flags, copy=False)
                    del view  # libzmq (via pyzmq's gc thread) now holds the last reference
                    waits.append(fut)
            return waits
        except zmq.Again:
            # Only the first frame can meet a full queue; a DEALER whose pipe died mid-message
            # rolls the message back, so retrying later is correct in both cases.
            return None

    def _try_send(self, parts: list[Any], large: bool) -> list[asyncio.Future[None]] | None:
        raise NotImplementedError

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectionClosed("connection closed")
        if self._eof is not None:
            raise self._end_error()

    async def send(self, frames: Sequence[Buffer]) -> None:
        # Hot path: one small bytes frame, nothing queued ahead, zmq has room.
        if len(frames) == 1 and not self._sendq and not self._closed and self._eof is None:
            f = frames[0]
            if type(f) is bytes and 0 < len(f) < self._zc_min:
                try:
                    self._send_one(f)
                except zmq.ZMQError:
                    pass  # would block, or failed: the general path queues or reports it
                else:
                    pump = self._pump
                    self._sent_gen = pump._gen
                    pump._sent()
                    return
        await self._send_general(frames)

    async def _send_general(self, frames: Sequence[Buffer]) -> None:
        self._check_open()
        parts, large = self._encode(frames)
        if not self._sendq:
            waits = self._try_send(parts, large)
            if waits is not None:
                self._sent_gen = self._pump._gen
                self._pump._sent()
                for w in waits:
                    await w
                return
        await self._send_queued(parts, large)

    def write_nowait(self, frames: Sequence[Buffer]) -> Awaitable[None] | None:
        """Fix the message's place in the stream now (no task, unlike the default): sent at
        once, or queued behind earlier waiters. Returns a future to await when zmq would block
        or still references mutable zero-copy buffers; its failure is also consumed, so a
        caller that drops it leaves no "exception was never retrieved"."""
        if len(frames) == 1 and not self._sendq and not self._closed and self._eof is None:
            f = frames[0]  # hot path, as in send(): one small bytes frame and zmq has room
            if type(f) is bytes and 0 < len(f) < self._zc_min:
                try:
                    self._send_one(f)
                except zmq.ZMQError:
                    pass  # would block, or failed: the general path queues or reports it
                else:
                    pump = self._pump
                    self._sent_gen = pump._gen
                    pump._sent()
                    return None
        self._check_open()
        parts, large = self._encode(frames)
        if not self._sendq:
            try:
                waits = self._try_send(parts, large)
            except TransportError as exc:
                raise _closed_error(exc) from exc
            if waits is not None:
                self._sent_gen = self._pump._gen
                self._pump._sent()
                return _all_done(self._loop, waits) if waits else None
        item = PendingSend(parts, large, self._loop.create_future())
        self._sendq.append(item)
        self._pump.kick()
        done = self._loop.create_future()
        done.add_done_callback(_consume_exception)
        item.fut.add_done_callback(functools.partial(_chain_send, self._loop, done))
        return done

    # --- push mode ----------------------------------------------------------------------------
    def start_receiving(
        self,
        on_messages: Callable[[list[Message]], Awaitable[None] | None],
        on_closed: Callable[[BaseException], None],
    ) -> None:
        """Push mode: batches go to ``on_messages`` from the pump's service pass, right after
        the receive, so a reply it sends leaves in the same pass (no task wake-up per batch).

        An awaitable returned by ``on_messages`` holds further batches until it is done;
        meanwhile messages queue up to ``max_queued_*``, then the socket stops being read,
        as with ``recv``. ``on_closed`` is called once, after the last batch, with
        ConnectionClosed (also after a local close) or with what ``on_messages`` raised (the
        connection is then aborted)."""
        self._on_messages = on_messages
        self._on_closed = on_closed
        if self._rq or self._closed or self._eof is not None:
            self._end_scheduled = True
            self._loop.call_soon(self._push)

    def _push_batch(self) -> None:
        """Deliver everything queued, in order, until the consumer asks to wait."""
        rq = self._rq
        while rq and self._push_pending is None and self._on_messages is not None and not self._closed:
            batch = list(rq)
            rq.clear()
            n, self._rq_bytes = self._rq_bytes, 0
            self._pump._count_out(n, len(batch))
            try:
                pending = self._on_messages(batch)
            except Exception as exc:
                self._push_failed(exc)
                return
            if pending is not None and self._pushed(pending):
                return

    def _push(self) -> None:
        """Deliver what is queued; once the stream has ended and all is delivered, report it."""
        self._end_scheduled = False
        self._push_batch()
        if (
            (self._closed or self._eof is not None)
            and not (self._rq and not self._closed)
            and self._push_pending is None
            and self._on_closed is not None
        ):
            cb, self._on_closed = self._on_closed, None
            self._on_messages = None
            cb(self._end_error())

    def send_nowait(self, frames: Sequence[Buffer]) -> None:
        """Send now, or queue behind earlier waiters without waiting (acks, heartbeats)."""
        self._check_open()
        parts, large = self._encode(frames)
        if large:  # nobody waits for libzmq to release buffers here: copy the mutable ones
            zc = self._zc_min
            parts = [p if _immutable(p) or _nbytes(p) < zc else memoryview(p).tobytes() for p in parts]
        if not self._sendq and self._try_send(parts, large) is not None:
            self._pump._sent()
            return
        item = PendingSend(parts, large, self._loop.create_future())
        item.fut.add_done_callback(_consume_exception)
        self._sendq.append(item)
        self._pump.kick()

    async def _send_queued(self, parts: list[Any], large: bool) -> None:
        """Wait for writability behind earlier waiters (FIFO), then send."""
        item = PendingSend(parts, large, self._loop.create_future())
        self._sendq.append(item)
        self._pump.kick()
        try:
            waits = await item.fut
        except asyncio.CancelledError:
            with contextlib.suppress(ValueError):
                self._sendq.remove(item)
            raise
        for w in waits:
            await w

    def _flush_queue(self) -> bool:
        """Send what the queue holds until zmq would block; True if anything was sent."""
        q = self._sendq
        progress = False
        while q:
            item = q[0]
            if item.fut.done():
                q.popleft()
                continue
            try:
                waits = self._try_send(item.parts, item.large)
            except TransportError as exc:
                self._fail_sends(exc)
                return True
            if waits is None:
                return progress
            q.popleft()
            item.fut.set_result(waits)
            progress = True
        return progress

    def _fail_sends(self, exc: TransportError) -> None:
        while self._sendq:
            item = self._sendq.popleft()
            if not item.fut.done():
                err = ConnectionClosed(str(exc))
                err.__cause__ = exc
                item.fut.set_exception(err)

    @property
    def flush_pending(self) -> bool:
        """A message went out since the socket was last serviced, or one waits in the queue:
        the link batches what follows (sealed at the next iteration) instead of sending each
        alone; a lone request or reply goes straight to zmq (see ``Link._push_rpc``)."""
        return self._sent_gen == self._pump._gen or bool(self._sendq)

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> ConnectionStats:
        return ConnectionStats(
            local=self.local_address,
            remote=self.peer_address,
            queued_recv_bytes=self._rq_bytes,
            queued_recv_messages=len(self._rq),
            extra={"queued_send_waiters": len(self._sendq), "eof": str(self._eof) if self._eof else None},
        )


# ======================================================================================
# Dialer side: one DEALER socket per Connection
# ======================================================================================
class DealerConnection(Pump, ZConnection):
    """A dialed connection: its own DEALER socket, never reconnecting."""

    def __init__(self, transport: Any, sock: zmq.Socket, url: str, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._handshake: asyncio.Future[None] = loop.create_future()
        Pump.__init__(self, sock, loop, transport._opts, transport.limits)
        ZConnection.__init__(self, self, loop, transport._opts)
        self.peer_address = url
        self.local_address = ""
        self._monitor = Monitor(transport._context(), sock, loop, self._on_event, DIAL_FAIL_EVENTS)

    # --- receive ----------------------------------------------------------------------------
    def _drain(self, budget: int, force: bool = False) -> bool:
        recv = self._sock.recv
        zc = self._opts.zc_min
        rq = self._rq
        max_b = 1 << 62 if force else self._opts.max_queued_bytes
        max_m = 1 << 62 if force else self._opts.max_queued_msgs
        if self._stopped or (self._paused and not force):
            return False
        welcomed = self._handshake.done()
        qb, qm = self._queued_bytes, self._queued_msgs  # kept in locals on the hot path
        n = 0
        try:
            while n < budget:
                if qb > max_b or qm > max_m:
                    self._paused = True
                    return False
                try:
                    fr = recv(NOBLOCK, copy=False)
                except zmq.Again:
                    self._again = True
                    return False
                n += 1
                size = len(fr)
                if size and welcomed and not fr.more:  # the common case, inlined
                    rq.append([fr.bytes if size < zc else fr.buffer])
                    self._rq_bytes += size
                    qb += size
                    qm += 1
                    if self._on_messages is not None:
                        self._marked[self] = None
                    else:
                        w = self._rx_waiter
                        if w is not None and not w.done():
                            w.set_result(None)
                    continue
                self._queued_bytes, self._queued_msgs = qb, qm
                try:
                    self._slow_message(fr)
                finally:
                    qb, qm = self._queued_bytes, self._queued_msgs
                welcomed = self._handshake.done()
                if self._stopped or (self._paused and not force):
                    return False
            return True
        finally:
            self._queued_bytes, self._queued_msgs = qb, qm

    def _slow_message(self, fr: zmq.Frame) -> None:
        ctl, frames, size = self._rx.body(fr)
        if ctl is not None:
            self._control(ctl, frames)
        elif self._handshake.done():
            self._deliver(frames, size)
        else:
            self._violation(ProtocolError("data before welcome"))

    def _control(self, ctl: bytes, args: list[Any]) -> None:
        if ctl == WELCOME and not self._handshake.done():
            if wire.version_ok(args):
                self._handshake.set_result(None)
            else:
                self._violation(HandshakeError("listener answered with an unknown protocol version"))
        elif ctl == WELCOME and self._handshake.cancelled():
            pass  # connect() was cancelled just before the welcome came; its abort() follows
        elif ctl == BYE:
            reason = wire.bye_reason(args)
            what = f"{self.peer_address} closed the connection" + (f" ({reason})" if reason else "")
            self._remote_end(ConnectionClosed(what))
        elif ctl == MALFORMED and args and isinstance(args[0], ProtocolError):
            self._violation(args[0])
        else:
            self._violation(ProtocolError(f"unexpected control frame {ctl[:16]!r}"))

    def _violation(self, err: ProtocolError) -> None:
        log.warning("zmq listener violated the protocol; closing", peer=self.peer_address, error=str(err))
        closed = ConnectionClosed(f"protocol violation by {self.peer_address}: {err}")
        closed.__cause__ = err
        self._remote_end(closed)

    def _on_event(self, event: int, value: int) -> None:
        if self._stopped:
            return
        with contextlib.suppress(zmq.ZMQError):  # what already arrived is delivered first
            self._drain(1 << 30, force=True)
        name = EVENT_NAMES.get(event, str(event))
        why = ""
        if not self._handshake.done() and event != zmq.EVENT_CLOSED:
            why = self._handshake_hint(event)
        self._remote_end(ConnectionClosed(f"connection to {self.peer_address} lost ({name}){why}"))

    def _handshake_hint(self, event: int) -> str:
        """Why a dial most likely failed during the ZMTP handshake (security mismatches)."""
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return ": the listener refused this node's CurveZMQ key (not in its curve_allowed_clients)"
        if event not in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
            return ""
        if self._transport.curve:
            return ": CurveZMQ handshake failed; the listener's key is not curve_server_key_file or it is plaintext"
        return ": ZMTP handshake failed; the listener may require CurveZMQ (transport.zmq curve_* keys)"

    def _fatal(self, exc: zmq.ZMQError) -> None:
        self._remote_end(zmq_error(exc, f"connection to {self.peer_address} failed"))

    def _remote_end(self, exc: TransportError) -> None:
        if not isinstance(exc, ConnectionClosed):
            closed = ConnectionClosed(str(exc))
            closed.__cause__ = exc
            exc = closed
        if self._eof is None and not self._closed:
            self._eof = exc
        if not self._handshake.done():
            err = TransportError(f"cannot connect to {self.peer_address}: {exc}")
            err.__cause__ = exc
            self._handshake.set_exception(err)
            self._handshake.exception()  # mark retrieved: connect() may already have timed out
        self._fail_sends(exc)
        self._wake()
        self._release(0)

    # --- send -------------------------------------------------------------------------------
    def _send_one(self, frame: bytes) -> None:
        bsend(self._bsock, frame, NOBLOCK)

    def _try_send(self, parts: list[Any], large: bool) -> list[asyncio.Future[None]] | None:
        try:
            return self._send_parts(parts, large, None)
        except zmq.ZMQError as exc:
            err = zmq_error(exc, f"send to {self.peer_address}")
            self._remote_end(err)
            raise err from exc

    def _has_pending(self) -> bool:
        return bool(self._sendq)

    def _flush(self) -> bool:
        return self._flush_queue()

    # --- lifecycle --------------------------------------------------------------------------
    async def _connect(self, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                try:  # IMMEDIATE holds the hello until the link is up
                    await self._send_queued(wire.hello(), False)
                except TransportError:
                    pass  # the handshake future carries the reason
                await self._handshake
        except TimeoutError:
            self.abort()
            raise TransportError(f"cannot connect to {self.peer_address}: no answer within {timeout:g}s") from None
        except BaseException:
            self.abort()
            raise

    def _release(self, linger_ms: int) -> None:
        if self._stopped:
            return
        self._stop()
        self._monitor.close()
        self._sock.close(linger=linger_ms)
        self._transport._dialers.discard(self)

    def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fail_sends(ConnectionClosed("connection closed"))
        self._drop_queue()
        self._wake()
        self._release(0)

    async def close(self) -> None:
        if self._closed:
            return
        if self._eof is not None or self._stopped:
            self.abort()
            return
        self._closed = True
        self._fail_sends(ConnectionClosed("connection closed"))
        self._drop_queue()
        self._wake()
        # The bye follows all data already handed to zmq; linger lets zmq flush both.
        with contextlib.suppress(zmq.ZMQError):
            self._sock.send_multipart([EMPTY, BYE], NOBLOCK)
        self._release(self._opts.linger_ms)

    def stats(self) -> ConnectionStats:
        st = super().stats()
        return dataclasses.replace(st, extra={**st.extra, "socket": "DEALER", "curve": self._transport.curve})
