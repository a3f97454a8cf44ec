"""Sans-I/O protocol of the ``rdma://`` transport: credits, segmentation, reassembly.

No verbs, no sockets, no asyncio: the driver (:mod:`aionet.transports.rdma.transport`) hands this
object filled receive buffers and asks it to fill send buffers; everything that decides *what*
goes on the wire lives here so it is tested on the CPU.

Model. Each side pre-posts ``recv_buffers`` receive buffers of ``segment_bytes`` each on a
reliable-connected QP. Every RDMA SEND consumes exactly one of the peer's posted buffers, and a
SEND with no buffer posted is a fatal RNR error, so a sender holds one *credit* per peer buffer
it may use. Credits come back piggybacked on the peer's segments (``credits`` field) or, when
the peer has nothing to send, in a credit-only segment.

Deadlock freedom. Data segments need two credits: one is kept in reserve for control segments
(credit updates and FIN). A side sends a credit update when it owes at least two credits and
either owes ``update_threshold`` of them or the peer is down to its reserve. Owing >= 2 keeps
updates from being answered by updates forever (an update costs the receiver only one buffer),
and since a starved peer means the other side owes ``recv_buffers - 1 >= 2`` credits once its
application has read, an update is always eventually sent.

Back-pressure. A receive buffer is reposted as soon as its payload has been copied out, but
its credit is returned only while reassembled-and-unread bytes stay under
``recv_queue_bytes``; otherwise it is held until the application reads (``next_message``).

Wire format. Segment header ``<BBHI``: flags, version, credits returned, segment sequence
number (checked: RC delivers in order, so a gap means corruption). The first segment of a
message carries ``<IQ`` (frame count, body length), then one ``<Q`` per frame length; the
body follows, split over as many segments as needed.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...errors import DecodeError, FrameTooLarge, ProtocolError, TooManyFrames

__all__ = ["SEG_HEADER", "RdmaProtocol", "SegmentFlags"]

VERSION = 1
SEG_HEADER = struct.Struct("<BBHI")
_MSG_HEADER = struct.Struct("<IQ")
_LEN = struct.Struct("<Q")
MAX_CREDITS_FIELD = 0xFFFF


class SegmentFlags:
    FIRST = 1
    LAST = 2
    CONTROL = 4  # credit update, no payload
    FIN = 8  # sender closes; no more segments follow


@dataclass
class _Outgoing:
    msg_id: int
    prefix: bytes
    frames: list[memoryview]
    total: int  # prefix + body
    sent: int = 0
    frame_idx: int = 0
    frame_off: int = 0
    prefix_off: int = 0


@dataclass
class _Incoming:
    nframes: int
    lengths: list[int] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    filled: int = 0
    header: bytearray = field(default_factory=bytearray)  # prefix bytes still being parsed


class RdmaProtocol:
    """Both directions of one RDMA connection's message protocol.

    Args:
        recv_buffers: buffers this side posts (the peer's initial credits).
        peer_recv_buffers: buffers the peer posts (our initial credits).
        segment_bytes: size of every send/receive buffer (header included).
    """

    def __init__(
        self,
        *,
        recv_buffers: int,
        peer_recv_buffers: int,
        segment_bytes: int,
        max_message_bytes: int = 16 << 30,
        max_frames: int = 4096,
        recv_queue_bytes: int = 64 << 20,
        update_threshold: int | None = None,
    ) -> None:
        if recv_buffers < 3 or peer_recv_buffers < 3:
            raise ValueError("RDMA credit scheme needs at least 3 receive buffers per side")
        if recv_buffers > MAX_CREDITS_FIELD or peer_recv_buffers > MAX_CREDITS_FIELD:
            raise ValueError(f"at most {MAX_CREDITS_FIELD} receive buffers")
        if segment_bytes < SEG_HEADER.size + _MSG_HEADER.size + _LEN.size:
            raise ValueError("segment_bytes too small")
        self.segment_bytes = segment_bytes
        self.recv_buffers = recv_buffers
        self.max_message_bytes = max_message_bytes
        self.max_frames = max_frames
        self.recv_queue_bytes = recv_queue_bytes
        self.update_threshold = max(2, update_threshold if update_threshold is not None else recv_buffers // 2)
        # send side
        self.credits = peer_recv_buffers  # peer buffers we may still fill
        self._out: deque[_Outgoing] = deque()
        self._next_msg_id = 0
        self._send_seq = 0
        self.fin_sent = False
        # receive side
        self._owed = 0  # credits we may return now
        self._held = 0  # credits withheld for back-pressure
        self._granted = recv_buffers  # credits handed to the peer in total
        self._received = 0  # segments received in total
        self._recv_seq = 0
        self._cur: _Incoming | None = None
        self._ready: deque[list[memoryview]] = deque()
        self._ready_bytes = 0
        self.fin_received = False
        self.counts = {"segments_sent": 0, "segments_received": 0, "control_sent": 0, "messages_received": 0}

    # ------------------------------------------------------------------ sending
    def queue(self, frames: Sequence[bytes | bytearray | memoryview]) -> int:
        """Queue a message; returns its id (reported by :meth:`fill` when fully copied).

        The frames are referenced, not copied, until their bytes are written into send
        buffers, so the caller must keep them unchanged until then."""
        if self.fin_sent:
            raise ProtocolError("connection is closing: no more messages")
        views = [
            memoryview(f).cast("B") if memoryview(f).ndim != 1 or memoryview(f).itemsize != 1 else memoryview(f)
            for f in frames
        ]
        if len(views) > self.max_frames:
            raise TooManyFrames(f"message has {len(views)} frames, limit {self.max_frames}")
        body = sum(v.nbytes for v in views)
        if body > self.max_message_bytes:
            raise FrameTooLarge(f"message of {body} bytes exceeds the limit of {self.max_message_bytes}")
        prefix = _MSG_HEADER.pack(len(views), body) + b"".join(_LEN.pack(v.nbytes) for v in views)
        msg_id = self._next_msg_id
        self._next_msg_id += 1
        self._out.append(_Outgoing(msg_id, prefix, views, len(prefix) + body))
        return msg_id

    @property
    def has_pending_data(self) -> bool:
        return bool(self._out)

    def can_send_data(self) -> bool:
        return bool(self._out) and self.credits >= 2

    def _take_credits_field(self) -> int:
        n = min(self._owed, MAX_CREDITS_FIELD)
        self._owed -= n
        self._granted += n
        return n

    def _header(self, buf: memoryview, flags: int) -> None:
        SEG_HEADER.pack_into(buf, 0, flags, VERSION, self._take_credits_field(), self._send_seq)
        self._send_seq = (self._send_seq + 1) & 0xFFFFFFFF
        self.credits -= 1
        self.counts["segments_sent"] += 1

    def fill(self, buf: memoryview) -> tuple[int, int | None] | None:
        """Write the next data segment into ``buf`` (a registered send buffer).

        Returns ``(nbytes, finished_msg_id_or_None)``, or None when there is nothing to send
        or not enough credits (keep one in reserve for control segments)."""
        if not self.can_send_data():
            return None
        out = self._out[0]
        flags = SegmentFlags.FIRST if out.sent == 0 else 0
        pos = SEG_HEADER.size
        cap = min(len(buf), self.segment_bytes)
        while pos < cap and out.prefix_off < len(out.prefix):  # prefix first
            n = min(cap - pos, len(out.prefix) - out.prefix_off)
            buf[pos : pos + n] = out.prefix[out.prefix_off : out.prefix_off + n]
            pos += n
            out.prefix_off += n
            out.sent += n
        while pos < cap and out.frame_idx < len(out.frames):
            fv = out.frames[out.frame_idx]
            n = min(cap - pos, fv.nbytes - out.frame_off)
            buf[pos : pos + n] = fv[out.frame_off : out.frame_off + n]
            pos += n
            out.frame_off += n
            out.sent += n
            if out.frame_off == fv.nbytes:
                out.frame_idx += 1
                out.frame_off = 0
        done = out.sent == out.total
        if done:
            flags |= SegmentFlags.LAST
            self._out.popleft()
        self._header(buf, flags)
        return pos, (out.msg_id if done else None)

    def peer_remaining(self) -> int:
        """Credits the peer will hold once everything we granted has reached it."""
        return self._granted - self._received

    def wants_credit_update(self) -> bool:
        if self.credits < 1 or self.fin_sent or self._owed < 2:
            return False
        if self.can_send_data():
            return False  # the next data segment carries the credits
        return self._owed >= self.update_threshold or self.peer_remaining() <= 1

    def fill_control(self, buf: memoryview) -> int | None:
        """Write a credit update into ``buf`` if one is due; returns its length or None."""
        if not self.wants_credit_update():
            return None
        self._header(buf, SegmentFlags.CONTROL)
        self.counts["control_sent"] += 1
        return SEG_HEADER.size

    def fill_fin(self, buf: memoryview) -> int | None:
        """Write the FIN segment (after all queued data); None if it cannot go yet."""
        if self.fin_sent or self._out or self.credits < 1:
            return None
        self._header(buf, SegmentFlags.FIN | SegmentFlags.CONTROL)
        self.fin_sent = True
        return SEG_HEADER.size

    # ------------------------------------------------------------------ receiving
    def on_receive(self, data: memoryview) -> None:
        """Consume one received segment. Its buffer may be reposted as soon as this returns.

        Raises ProtocolError (or a subclass) on anything malformed; the connection must then
        be aborted."""
        if len(data) < SEG_HEADER.size:
            raise DecodeError(f"RDMA segment of {len(data)} bytes is shorter than its header")
        if len(data) > self.segment_bytes:
            raise FrameTooLarge(f"RDMA segment of {len(data)} bytes exceeds segment size {self.segment_bytes}")
        flags, version, credits, seq = SEG_HEADER.unpack_from(data, 0)
        if version != VERSION:
            raise DecodeError(f"RDMA segment version {version}, expected {VERSION}")
        if seq != self._recv_seq:
            raise DecodeError(f"RDMA segment sequence {seq}, expected {self._recv_seq}")
        if self.fin_received:
            raise DecodeError("RDMA segment after FIN")
        self._recv_seq = (self._recv_seq + 1) & 0xFFFFFFFF
        self._received += 1
        self.counts["segments_received"] += 1
        self.credits += credits
        payload = data[SEG_HEADER.size :]
        if flags & SegmentFlags.CONTROL:
            if payload.nbytes:
                raise DecodeError("RDMA control segment with payload")
            if flags & SegmentFlags.FIN:
                if self._cur is not None:
                    raise DecodeError("RDMA FIN in the middle of a message")
                self.fin_received = True
            self._return_credit()
            return
        if flags & SegmentFlags.FIRST:
            if self._cur is not None:
                raise DecodeError("RDMA message started before the previous one ended")
            self._cur = _Incoming(nframes=-1)
        elif self._cur is None:
            raise DecodeError("RDMA continuation segment without a first segment")
        self._absorb(payload)
        if flags & SegmentFlags.LAST:
            self._complete()
        elif (
            self._cur is not None
            and self._cur.nframes >= 0
            and self._cur.filled == len(self._cur.body)
            and (len(self._cur.lengths) == self._cur.nframes)
        ):
            raise DecodeError("RDMA message body complete but segment not marked last")
        if self._ready_bytes > self.recv_queue_bytes:
            self._held += 1
        else:
            self._return_credit()

    def _return_credit(self) -> None:
        self._owed += 1

    def _absorb(self, payload: memoryview) -> None:
        cur = self._cur
        assert cur is not None
        pos = 0
        if cur.nframes < 0 or len(cur.lengths) < cur.nframes:  # still parsing the prefix
            while pos < payload.nbytes:
                need = _MSG_HEADER.size if cur.nframes < 0 else _LEN.size
                take = min(need - len(cur.header), payload.nbytes - pos)
                cur.header += payload[pos : pos + take]
                pos += take
                if len(cur.header) < need:
                    break
                if cur.nframes < 0:
                    nframes, body = _MSG_HEADER.unpack(cur.header)
                    if nframes > self.max_frames:
                        raise TooManyFrames(f"RDMA message announces {nframes} frames, limit {self.max_frames}")
                    if body > self.max_message_bytes:
                        raise FrameTooLarge(f"RDMA message announces {body} bytes, limit {self.max_message_bytes}")
                    cur.nframes = nframes
                    cur.body = bytearray(body)
                else:
                    cur.lengths.append(_LEN.unpack(cur.header)[0])
                cur.header.clear()
                if len(cur.lengths) == cur.nframes:
                    if sum(cur.lengths) != len(cur.body):
                        raise DecodeError("RDMA message frame lengths do not add up to its body length")
                    break
        rest = payload.nbytes - pos
        if rest:
            if cur.nframes < 0 or len(cur.lengths) < cur.nframes or cur.filled + rest > len(cur.body):
                raise DecodeError("RDMA message carries more bytes than it announced")
            cur.body[cur.filled : cur.filled + rest] = payload[pos:]
            cur.filled += rest

    def _complete(self) -> None:
        cur = self._cur
        if cur is None or cur.nframes < 0 or len(cur.lengths) != cur.nframes or cur.filled != len(cur.body):
            raise DecodeError("RDMA message ended before all announced bytes arrived")
        mv = memoryview(cur.body)
        frames: list[memoryview] = []
        off = 0
        for n in cur.lengths:
            frames.append(mv[off : off + n])
            off += n
        self._cur = None
        self._ready.append(frames)
        self._ready_bytes += len(cur.body)
        self.counts["messages_received"] += 1

    def next_message(self) -> list[memoryview] | None:
        """The next complete message (frames are writable views the caller owns), or None."""
        if not self._ready:
            return None
        frames = self._ready.popleft()
        self._ready_bytes -= sum(f.nbytes for f in frames)
        while self._held and self._ready_bytes <= self.recv_queue_bytes:
            self._held -= 1
            self._return_credit()
        return frames

    @property
    def has_message(self) -> bool:
        return bool(self._ready)
