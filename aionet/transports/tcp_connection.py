"""One ``tcp://`` (and ``tls://``) connection: :class:`TCPConnection`, its own asyncio protocol,
so that each message costs one object on the hot paths. The transport that dials and listens,
and the options, are in :mod:`aionet.transports.tcp`.

Receive: an ``asyncio.BufferedProtocol`` lets the kernel write straight into
:class:`~aionet.codecs.framing.FrameDecoder`'s buffers -- small messages into a reused staging
buffer, large frames directly into their final allocation (or, receive-into, into the place a
consumer registered for that very frame: :meth:`TCPConnection.set_frame_target`). Completed
messages wait in a queue whose size (in bytes) is bounded: reading pauses above ``max_queued_bytes``.

Send: messages are encoded into a per-connection batch and written with one
``transport.writelines`` per event-loop iteration, so a burst of small messages becomes one
``writev`` on uvloop (the stdlib loop joins the buffers; slower, still correct). What a
push-mode consumer writes while it handles a read (replies) is written when it returns, and
after two reads in a row of one message each the next small write goes out at once: a
request/reply exchange does not wait a loop iteration per message. Frames below
``copy_below`` are copied into the batch, so callers may reuse them at once; larger ``bytes``
are written by reference (immutable); larger mutable buffers are written by reference too and
``send`` returns only once the kernel has them. ``send`` waits while the transport's write
buffer is above ``write_high_water``.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..codecs.framing import HEAD, ONE_FRAME_PREFIX, FrameDecoder, FrameTarget, OwnedFrame, as_frame, encode_prefix
from ..errors import ConnectionClosed, FrameTooLarge, ProtocolError, TooManyFrames
from ..log import get_logger

try:  # FIONREAD: bytes waiting in the socket's receive queue (POSIX)
    from fcntl import ioctl
    from termios import FIONREAD
except ImportError:  # pragma: no cover - not on this platform: more_inbound() says False
    ioctl = None  # type: ignore[assignment]
    FIONREAD = 0
from ..stats import ConnectionStats
from .base import Address, Buffer, Connection, Message
from .push_delivery import PushDelivery

if TYPE_CHECKING:
    from ..config import LimitsSection


# connection events log under the transport's name
log = get_logger("aionet.transports.tcp")

#: Bytes charged per queued message on top of its payload, so that floods of tiny messages are
#: bounded too (a 1-frame message costs a list and a bytes object: ~160 bytes of CPython objects).
MESSAGE_OVERHEAD = 160

#: Seconds without a new large frame after which remembered large-frame buffers are freed.
TRIM_AFTER = 2.0

_PACK1 = ONE_FRAME_PREFIX.pack  # (HEAD, 1, length) -> the 16-byte prefix of a 1-frame message


def _url(sockaddr: Any) -> str:
    if isinstance(sockaddr, tuple) and len(sockaddr) >= 2:
        return Address("tcp", str(sockaddr[0]), int(sockaddr[1]), "").url()
    return f"tcp://{sockaddr}"


class TCPConnection(PushDelivery, Connection, asyncio.BufferedProtocol):
    """One TCP connection; it is its own asyncio protocol (one object on the hot paths)."""

    _log = log  # PushDelivery's warning about a failed consumer
    busy_polls = True  # the loop reads the socket: each message may cost a wake-up

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        opts: Mapping[str, Any],
        limits: LimitsSection,
        on_connected: Callable[[TCPConnection], None] | None = None,
    ) -> None:
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._on_connected = on_connected
        self._nodelay: bool = opts["nodelay"]
        self._limits = limits
        self._max_header = limits.max_header_bytes
        self._max_frame = limits.max_frame_bytes
        self._max_message = limits.max_message_bytes
        self._max_frames = limits.max_frames
        self._close_timeout: float = opts["close_timeout"]
        # receive side
        self._decoder = FrameDecoder(
            limits,
            large_frame_bytes=opts["large_frame_bytes"],
            staging_bytes=opts["staging_bytes"],
            reuse_frames=opts["reuse_frames"],
        )
        self._fd = -1  # the socket's descriptor, for more_inbound()
        # Receive low-water mark while a large frame arrives (0: off; see _follow_frame).
        self._lowat_max: int = opts["rcvlowat_bytes"]
        self._lowat = 1  # the socket's SO_RCVLOWAT as last set (1: the kernel's default)
        self._lowat_allocs = 0  # the decoder's large_allocs when the mark was last looked at
        self._sock: Any = None
        self._fionread = bytearray(4)
        self._trim_handle: asyncio.TimerHandle | None = None
        self._trim_seen = 0
        # The kernel asks the decoder directly where to put bytes: no extra Python frame per read.
        self.get_buffer = self._decoder.get_buffer  # type: ignore[method-assign]
        self._decode = self._decoder.buffer_updated
        self._queue: deque[Message] = deque()
        self._queued_bytes = 0
        self._delivered_seen = 0
        self._max_queued: int = max(1, opts["max_queued_bytes"])
        self._read_batch: int = max(1, opts["read_batch_bytes"])
        self._consumer_woken = False  # a recv was woken and has not taken its messages yet
        self._resume_below = self._max_queued // 2
        self._read_paused = False
        # push mode: after read_batch_bytes of messages with large frames, reading stops for one
        # loop iteration so that the consumers their delivery woke run (see _yield_to_consumers)
        self._yielding = False
        self._yield_mark = 0  # decoder.delivered_bytes at the last yield
        self._yield_large = 0  # decoder.large_done at the last yield
        self._recv_waiters: list[asyncio.Future[None]] = []
        self._init_push()  # push mode (start_receiving): PushDelivery's state
        # send side
        self._wbuf = bytearray()
        self._wlist: list[Buffer] = []
        self._wbytes = 0
        self._flush_scheduled = False
        # set while the push consumer runs inside a read callback: its writes are sent in one
        # write when it returns (no loop iteration later)
        self._in_read = False
        # the last two reads brought one message each: the next small write goes out at once
        self._write_through = False
        self._last_single = False  # the last read brought one message
        self._flush_bytes: int = max(1, opts["flush_bytes"])
        self._copy_below: int = opts["copy_below"]
        self._high: int = opts["write_high_water"]
        self._write_paused = False
        self._forced_pause = False
        self._write_waiters: list[asyncio.Future[None]] = []
        # lifecycle
        self._closed = False  # no more sends/recvs (local close, abort, failure or connection lost)
        self._local_close = False  # closed by us: recv raises even with messages queued
        self._lost = False
        self._lost_fut: asyncio.Future[None] = loop.create_future()
        self._cause: BaseException | None = None
        self._close_task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self.local_address} -> {self.peer_address} {state}>"

    # ================================================================= asyncio protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not derive from asyncio.Transport, hence no isinstance check.
        self._transport = transport  # type: ignore[assignment]
        self.local_address = _url(transport.get_extra_info("sockname"))
        self.peer_address = _url(transport.get_extra_info("peername"))
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1 if self._nodelay else 0)
            except (OSError, AttributeError):  # not a TCP socket (e.g. a test double)
                pass
            try:
                self._fd = sock.fileno()
            except (OSError, AttributeError):
                self._fd = -1
            # plain TCP only: under TLS the mark would count ciphertext (larger: still safe, untested)
            if self._lowat_max and transport.get_extra_info("ssl_object") is None:
                self._sock = sock
        # Low water 0: resume_writing means everything written before reached the kernel, which
        # is what a zero-copy send of a mutable buffer waits for.
        transport.set_write_buffer_limits(high=self._high, low=0)  # type: ignore[attr-defined]
        if self._on_connected is not None:
            cb, self._on_connected = self._on_connected, None
            cb(self)

    # get_buffer is bound per instance in __init__ (the decoder's); this is the class fallback.
    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            msgs = self._decode(nbytes)
        except ProtocolError as exc:
            self._protocol_violation(exc)
            return
        dec = self._decoder
        if self._sock is not None and (self._lowat > 1 or dec.large_allocs != self._lowat_allocs):
            # a large frame started or is in progress (reads of small ones skip this); in the
            # middle of one, with the mark at its most and at least that much still owed,
            # _follow_frame would keep the mark as it is: most reads of a large message
            if not (
                dec.large_allocs == self._lowat_allocs
                and self._lowat == self._lowat_max
                and dec.frame_remaining >= self._lowat
            ):
                self._follow_frame()
        if not msgs:
            return
        on_messages = self._on_messages
        if on_messages is not None and not self._queue and self._push_pending is None and not self._closed:
            # Push mode with nothing queued (the usual case): the messages go to the consumer
            # straight from here, not through the queue and _push. What the consumer writes
            # on this connection meanwhile (replies) is sent in one write when it returns.
            self._delivered_seen = dec.delivered_bytes
            self._in_read = True
            try:
                pending = on_messages(msgs)
            except Exception as exc:
                self._push_failed(exc)
                return
            finally:
                self._in_read = False
                if self._wbuf or self._wlist:
                    self._flush()
            # Two reads in a row of one message each: a request/reply exchange; the next write
            # (its next request, an async handler's reply) goes out at once instead of a loop
            # iteration later. Not after a single one: with many requests in flight, a lone
            # message among batches would keep travelling alone instead of joining the next
            # batch (measured: 64 in flight fell from 44k to 25-30k requests/s).
            single = len(msgs) == 1
            self._write_through = single and self._last_single
            self._last_single = single
            if pending is not None:
                self._pushed(pending)
            if (
                dec.large_done != self._yield_large
                and dec.delivered_bytes - self._yield_mark >= self._read_batch
                and not self._yielding
                and not self._read_paused
            ):
                self._yield_to_consumers()
        else:
            delivered = dec.delivered_bytes
            self._queued_bytes += delivered - self._delivered_seen + MESSAGE_OVERHEAD * len(msgs)
            self._delivered_seen = delivered
            self._queue.extend(msgs)
            if on_messages is not None:
                self._push()
            elif self._recv_waiters:
                self._wake(self._recv_waiters)
                self._consumer_woken = True
            queued = self._queued_bytes
            if (queued > self._max_queued or (queued > self._read_batch and self._consumer_woken)) and (
                not self._read_paused
            ):
                # Above the bound: back-pressure. Above a batch with the consumer waiting: let
                # it run now rather than after many more reads (uvloop reads up to 32 times per
                # wake-up); smaller batches stay in cache and were ~30% cheaper per message.
                self._pause_reading()
        if self._trim_handle is None and dec.large_allocs != self._trim_seen and dec.spare_bytes:
            self._trim_seen = dec.large_allocs
            self._trim_handle = self._loop.call_later(TRIM_AFTER, self._trim)

    def _follow_frame(self) -> None:
        """Keep SO_RCVLOWAT at min(what is still to come of the large frame in progress,
        ``rcvlowat_bytes``), and at 1 otherwise, so the kernel wakes this connection once per that
        many bytes instead of for every few packets. Never above the frame's remaining bytes, which
        the peer has committed to send: the mark cannot hold back a message nor wait for one."""
        dec = self._decoder
        self._lowat_allocs = dec.large_allocs
        rem = dec.frame_remaining
        cur = self._lowat
        # engaged for frames of at least two marks, then followed to the frame's end
        want = min(rem, self._lowat_max) if rem and (cur > 1 or rem >= 2 * self._lowat_max) else 1
        if want != cur:
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
            except (OSError, AttributeError, ValueError):
                self._sock = None  # not settable here: read as before
                return
            self._lowat = want

    def _yield_to_consumers(self) -> None:
        """Stop reading until the next loop iteration, after a read delivered large frames.

        uvloop reads up to 32 times per wake-up, so a stream of 1 MiB frames otherwise piles
        up to 16 of them (a peek and a frame each), each in its own buffer, before the consumer
        their delivery woke gets to run and drop the last ones: with a consumer that keeps its
        previous batch, 5-74 % of the frames landed in fresh memory (256 page faults each) and
        the rest rotated through cold buffers. Reading resumes one iteration later, after the
        woken consumers (already in the ready queue) ran; a pause for back-pressure meanwhile
        keeps it paused. Costs an epoll_ctl or two per ``read_batch_bytes`` of large frames."""
        t = self._transport
        if t is None or self._lost or t.is_closing():
            return
        self._yielding = True
        t.pause_reading()
        self._loop.call_soon(self._end_yield)

    def _end_yield(self) -> None:
        self._yielding = False
        dec = self._decoder
        self._yield_mark = dec.delivered_bytes
        self._yield_large = dec.large_done
        t = self._transport
        if not self._read_paused and t is not None and not self._lost and not t.is_closing():
            t.resume_reading()

    def _trim(self) -> None:
        """Free remembered large-frame buffers once large frames stopped arriving."""
        allocs = self._decoder.large_allocs
        if allocs == self._trim_seen or self._lost:
            self._decoder.trim()
            self._trim_handle = None
        else:
            self._trim_seen = allocs
            self._trim_handle = self._loop.call_later(TRIM_AFTER, self._trim)

    def eof_received(self) -> bool:
        return False  # close our side too: a connection is bidirectional or nothing

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._closed = True
        if self._cause is None:
            if exc is not None:
                self._cause = exc
            elif not self._local_close:
                try:
                    self._decoder.eof()
                except ProtocolError as err:
                    log.warning("peer closed mid-message", peer=self.peer_address, error=str(err))
                    self._cause = err
        self._wbuf = bytearray()
        self._wlist = []
        self._wbytes = 0
        self._wake(self._recv_waiters)
        self._wake(self._write_waiters)
        if self._trim_handle is not None:
            self._trim_handle.cancel()
            self._trim_handle = None
        self._decoder.trim()
        if not self._lost_fut.done():
            self._lost_fut.set_result(None)
        if self._on_messages is not None or self._on_closed is not None:
            self._push()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._forced_pause:
            self._forced_pause = False
            if self._transport is not None and not self._lost:
                self._transport.set_write_buffer_limits(high=self._high, low=0)
        self._wake(self._write_waiters)

    # ================================================================= helpers
    @staticmethod
    def _wake(waiters: list[asyncio.Future[None]]) -> None:
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        waiters.clear()

    def _pause_reading(self) -> None:
        t = self._transport
        if t is not None and not self._lost and not t.is_closing():
            t.pause_reading()
            self._read_paused = True

    def _maybe_resume_reading(self) -> None:
        if self._queued_bytes > self._resume_below or self._push_pending is not None:
            return
        self._read_paused = False
        t = self._transport
        if t is not None and not self._lost and not t.is_closing():
            t.resume_reading()

    def _protocol_violation(self, exc: ProtocolError) -> None:
        log.warning(
            "protocol violation; closing connection",
            peer=self.peer_address,
            local=self.local_address,
            error=f"{type(exc).__name__}: {exc}",
        )
        if self._cause is None:
            self._cause = exc
        self._closed = True
        self._wake(self._recv_waiters)
        self._wake(self._write_waiters)
        if self._transport is not None and not self._lost:
            self._transport.abort()

    def _closed_error(self) -> ConnectionClosed:
        why = "closed" if self._local_close else "closed by peer" if self._cause is None else "failed"
        err = ConnectionClosed(f"connection {self.local_address} -> {self.peer_address} {why}")
        err.__cause__ = self._cause
        return err

    # ================================================================= sending
    async def send(self, frames: Sequence[Buffer]) -> None:
        if self._closed:
            raise self._closed_error()
        if self._write_paused:
            await self._wait_writable()
        w = self.write_nowait(frames)
        if w is not None:
            await w
        if self._closed:
            raise self._closed_error()

    def write_nowait(self, frames: Sequence[Buffer]) -> Awaitable[None] | None:
        """Enqueue now; return a future to await before writing more when the transport is
        above its high-water mark or still references a large mutable frame of this message."""
        if self._closed:
            raise self._closed_error()
        if len(frames) == 1:
            # Fast path, as in send(): one small frame copied into the batch behind its prefix.
            f = frames[0]
            if type(f) is not bytes:
                f = as_frame(f)
            ln = len(f)
            if ln < self._copy_below and ln <= self._max_header:
                if self._flush_scheduled or self._in_read:
                    # (in a read callback, buffer_updated writes the batch when the consumer returns)
                    wbuf = self._wbuf
                    wbuf += _PACK1(HEAD, 1, ln)
                    wbuf += f
                    self._wbytes += ln + 16
                    if self._wbytes >= self._flush_bytes:
                        self._flush()
                elif self._write_through and self._transport is not None:
                    # nothing is batched (no flush scheduled, not in a read): straight to the socket
                    self._write_through = False  # what follows in this loop iteration is batched
                    self._transport.write(_PACK1(HEAD, 1, ln) + f)
                else:
                    wbuf = self._wbuf
                    wbuf += _PACK1(HEAD, 1, ln)
                    wbuf += f
                    self._wbytes += ln + 16
                    self._flush_scheduled = True
                    self._loop.call_soon(self._scheduled_flush)
                if self._write_paused:
                    fut = self._loop.create_future()
                    self._write_waiters.append(fut)
                    return fut
                return None
        if self._append(frames, False):
            self._flush()
            return self._drained_future()
        self._schedule_flush()
        if self._write_paused:
            fut = self._loop.create_future()
            self._write_waiters.append(fut)
            return fut
        return None

    def send_nowait(self, frames: Sequence[Buffer]) -> None:
        """Enqueue now, ignoring back-pressure (acks, heartbeats); every frame is copied or
        immutable, so nothing needs waiting for."""
        if self._closed:
            raise self._closed_error()
        f = frames[0] if len(frames) == 1 else None
        if type(f) is bytes and len(f) < self._copy_below and len(f) <= self._max_header:
            # one small frame (an ACK, a heartbeat): behind its prefix in the batch, as _append
            # would put it, without its general frame walk
            wbuf = self._wbuf
            wbuf += _PACK1(HEAD, 1, len(f))
            wbuf += f
            self._wbytes += len(f) + 16
        else:
            self._append(frames, True)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_scheduled or self._in_read:
            # (in a read callback, buffer_updated writes the batch when the consumer returns)
            if self._wbytes >= self._flush_bytes:
                self._flush()
        else:
            self._flush_scheduled = True
            self._loop.call_soon(self._scheduled_flush)

    def _append(self, frames: Sequence[Any], copy_all: bool) -> bool:
        """Encode one message into the batch; True if it references caller-mutable memory.

        Limits are checked here so an oversized message fails at the sender rather than
        making the peer drop the connection."""
        n = len(frames)
        if n > self._max_frames:
            raise TooManyFrames(f"message has {n} frames; limit is {self._max_frames} (limits.max_frames)")
        fs = [as_frame(f) for f in frames]
        total = 0
        for i, f in enumerate(fs):
            ln = len(f)
            limit = self._max_header if i == 0 else self._max_frame
            if ln > limit:
                which = "header frame" if i == 0 else f"frame {i}"
                raise FrameTooLarge(f"{which} has {ln} bytes; limit is {limit}")
            total += ln
        if total > self._max_message:
            raise FrameTooLarge(f"message has {total} bytes; limit is {self._max_message}")
        wbuf = self._wbuf
        prefix = encode_prefix(fs)
        wbuf += prefix
        mutable = False
        copy_below = self._copy_below
        for f in fs:
            if len(f) < copy_below:
                wbuf += f
                continue
            # bytes, an OwnedFrame (never changed while sent) and read-only views (the caller's
            # promise, README "Delivery guarantees") need no waiting for the kernel to take them
            if type(f) is not bytes and type(f) is not OwnedFrame and not (type(f) is memoryview and f.readonly):
                if copy_all:
                    f = bytes(f)
                else:
                    mutable = True
            # Large: by reference. Close the current batch chunk and start a new one.
            if wbuf:
                self._wlist.append(wbuf)
                wbuf = self._wbuf = bytearray()
            self._wlist.append(f)
        self._wbytes += len(prefix) + total
        return mutable

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        self._flush()

    @property
    def flush_pending(self) -> bool:
        """Something written in this loop iteration waits for the scheduled flush (or, in a
        read callback, for the write at its end)."""
        return self._flush_scheduled or (self._in_read and bool(self._wbuf))

    def flush_now(self) -> None:
        """Write what this iteration queued now rather than at the scheduled flush (which then
        finds nothing); in a read callback it goes at the read's end anyway."""
        if self._wbuf or self._wlist:
            if self._in_read:
                return
            self._flush()

    def write_now(self, frames: Sequence[Buffer]) -> Awaitable[None] | None:
        """:meth:`write_nowait`, then write everything queued now rather than at a flush
        scheduled for the next loop iteration: for a caller that runs at the end of an
        iteration anyway (the link sealing a batch of requests or replies, whose peer waits)."""
        scheduled = self._flush_scheduled
        self._flush_scheduled = True  # no flush of its own: done below
        try:
            w = self.write_nowait(frames)
        finally:
            self._flush_scheduled = scheduled
        self._flush()
        return w

    def _flush(self) -> None:
        """Hand the whole batch to the transport: one write/writelines call."""
        wbuf = self._wbuf
        wlist = self._wlist
        if not wbuf and not wlist:
            return
        self._wbuf = bytearray()  # the transport may keep a view on the old one
        self._wbytes = 0
        t = self._transport
        if t is None or self._lost or t.is_closing():
            self._wlist = []
            return
        if wlist:
            self._wlist = []
            if wbuf:
                wlist.append(wbuf)
            t.writelines(wlist)
            if not self._write_paused and t.get_write_buffer_size() > (high := 0 if self._forced_pause else self._high):
                # the selector transports of Python 3.12.0-3.12.8 and 3.13.0-3.13.1 never pause
                # the protocol from writelines (CPython gh-127655): the send buffer would grow
                # without bound. Setting the limits again makes the transport check and pause.
                t.set_write_buffer_limits(high=high, low=0)  # type: ignore[attr-defined]
        else:
            t.write(wbuf)

    async def _wait_writable(self) -> None:
        while self._write_paused and not self._closed:
            fut = self._loop.create_future()
            self._write_waiters.append(fut)
            await fut
        if self._closed:
            raise self._closed_error()

    def _drained_future(self) -> asyncio.Future[None] | None:
        """None if the write buffer is empty, else a future resolved once it is (or on close)."""
        t = self._transport
        if t is None or self._lost or t.get_write_buffer_size() == 0:
            return None
        if not self._write_paused:
            # Pause as soon as anything is buffered, so resume_writing (low water 0) tells us
            # when the buffer is empty.
            self._forced_pause = True
            t.set_write_buffer_limits(high=0, low=0)
            if not self._write_paused:  # the transport did not pause: nothing buffered after all
                self._forced_pause = False
                t.set_write_buffer_limits(high=self._high, low=0)
                return None
        fut = self._loop.create_future()
        self._write_waiters.append(fut)
        return fut

    async def _wait_drained(self) -> None:
        """Wait until every byte written so far is in the kernel (write buffer empty)."""
        while not self._closed:
            fut = self._drained_future()
            if fut is None:
                return
            await fut
        raise self._closed_error()

    # ================================================================= receiving
    def more_inbound(self) -> bool:
        """Whether bytes of a further message are already here: part of one in the decoder,
        or unread in the socket's receive queue (one FIONREAD ioctl, about a microsecond)."""
        if self._decoder.pending_bytes:
            return True
        fd = self._fd
        if fd < 0 or ioctl is None or self._lost:
            return False
        buf = self._fionread
        try:
            ioctl(fd, FIONREAD, buf, True)
        except OSError:
            return False
        return int.from_bytes(buf, sys.byteorder) > 0

    async def _wait_readable(self) -> None:
        while not self._queue:
            if self._closed:
                raise self._closed_error()
            fut = self._loop.create_future()
            self._recv_waiters.append(fut)
            await fut
        if self._local_close:
            raise self._closed_error()

    async def recv(self) -> Message:
        q = self._queue
        if not q or self._local_close:
            await self._wait_readable()
        msg = q.popleft()
        self._consumer_woken = False
        self._queued_bytes -= (len(msg[0]) if len(msg) == 1 else sum(map(len, msg))) + MESSAGE_OVERHEAD
        if self._read_paused:
            self._maybe_resume_reading()
        return msg

    async def recv_many(self) -> list[Message]:
        q = self._queue
        if not q or self._local_close:
            await self._wait_readable()
        msgs = list(q)
        q.clear()
        self._queued_bytes = 0
        self._consumer_woken = False
        if self._read_paused:
            self._maybe_resume_reading()
        return msgs

    def start_receiving(
        self,
        on_messages: Callable[[list[Message]], Awaitable[None] | None],
        on_closed: Callable[[BaseException], None],
    ) -> None:
        """Push mode: batches go to ``on_messages`` straight from the read callback.

        An awaitable returned by ``on_messages`` pauses reading (and delivery) until it is
        done. ``on_closed`` is called once, after the last batch, with ConnectionClosed (its
        ``__cause__`` says why) or with the exception ``on_messages`` raised; in the latter
        case the connection is aborted."""
        self._on_messages = on_messages
        self._on_closed = on_closed
        if self._queue or self._closed:
            self._loop.call_soon(self._push)

    def _push(self) -> None:
        """Deliver queued batches in push mode; report the end once everything is delivered."""
        q = self._queue
        while q and self._push_pending is None and self._on_messages is not None:
            batch = list(q)
            q.clear()
            self._queued_bytes = 0
            try:
                pending = self._on_messages(batch)
            except Exception as exc:
                self._push_failed(exc)
                return
            if pending is not None and self._pushed(pending):
                return
        if self._read_paused and self._push_pending is None:
            self._maybe_resume_reading()
        if self._closed and not q and self._push_pending is None and self._on_closed is not None:
            if not self._local_close or self._lost:
                cb, self._on_closed = self._on_closed, None
                self._on_messages = None
                cb(self._closed_error())

    def _hold_input(self) -> None:
        """PushDelivery: the consumer asked to wait; stop reading until ``_push`` resumes it."""
        if not self._read_paused:
            self._pause_reading()

    def _abort_for_consumer(self, exc: BaseException) -> None:
        """PushDelivery: the consumer failed; ``exc`` becomes why the connection ended."""
        if self._cause is None:
            self._cause = exc
        self.abort()

    # ================================================================= lifecycle
    @property
    def closed(self) -> bool:
        return self._closed

    def set_frame_allocator(self, alloc: Callable[[int], Any] | None) -> None:
        """Where incoming large frames land from now on (see FrameDecoder.set_frame_allocator):
        the staging receiver uses it to receive chunks into pool buffers or final memory."""
        self._decoder.set_frame_allocator(alloc)

    def set_frame_target(self, fn: FrameTarget | None) -> None:
        """Receive-into (see FrameDecoder.set_frame_target): the core asks, per large frame,
        whether a consumer (a collective) already holds its final place."""
        self._decoder.set_frame_target(fn)

    def release_frame_target(self, buf: Any) -> bool:
        """Stop receiving into ``buf`` if the frame in progress still is (its owner gave up)."""
        return self._decoder.release_frame_target(buf)

    def stats(self) -> ConnectionStats:
        t = self._transport
        kernel_side = t.get_write_buffer_size() if t is not None and not self._lost else 0
        return ConnectionStats(
            local=self.local_address,
            remote=self.peer_address,
            queued_send_bytes=kernel_side + self._wbytes,
            queued_recv_bytes=self._queued_bytes,
            queued_recv_messages=len(self._queue),
            read_paused=self._read_paused,
            write_paused=self._write_paused,
            extra={
                "write_buffer_size": kernel_side,
                "pending_write_bytes": self._wbytes,
                "partial_recv_bytes": self._decoder.pending_bytes,
            },
        )

    def abort(self) -> None:
        """Close now without flushing."""
        self._local_close = True
        self._closed = True
        self._wake(self._recv_waiters)
        self._wake(self._write_waiters)
        if self._transport is not None and not self._lost:
            self._transport.abort()

    async def close(self) -> None:
        """Flush what was sent (within ``close_timeout``), then close; idempotent."""
        if self._close_task is None:
            self._close_task = self._loop.create_task(self._close())
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        was_closed = self._closed
        self._local_close = True
        self._closed = True
        self._wake(self._recv_waiters)
        t = self._transport
        if t is None or self._lost:
            return
        try:
            async with asyncio.timeout(self._close_timeout):
                if not was_closed:
                    self._flush()
                    # Senders already see the connection closed; this only waits for the buffer.
                    while not self._lost:
                        fut = self._drained_future()
                        if fut is None:
                            break
                        await fut
                t.close()
                await asyncio.shield(self._lost_fut)
        except TimeoutError:
            log.warning("close timed out; aborting", peer=self.peer_address, timeout=self._close_timeout)
            t.abort()
        finally:
            self._wake(self._write_waiters)


__all__ = ["MESSAGE_OVERHEAD", "TRIM_AFTER", "TCPConnection"]
