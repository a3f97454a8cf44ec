"""Reliable-link bookkeeping per peer, sans-I/O: sequence numbers, cumulative acks, a
bounded replay buffer and duplicate suppression. No sockets, no clock, no asyncio.

The sender stamps each sequenced envelope with ``seq`` (its own counter) and ``ack`` (the
highest contiguous sequence number it has received from the peer). Unacknowledged messages
stay in the replay buffer; after a reconnect they are replayed in order, and the receiver
drops any ``seq`` it has already delivered. Because a sender always replays *everything*
unacknowledged before anything new, a receiver never sees a gap: ``seq > expected`` is a
protocol violation.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..errors import ProtocolError


class LinkState:
    __slots__ = (
        "ack_every",
        "ack_owed",
        "acked",
        "inflight_bytes",
        "max_inflight_bytes",
        "next_seq",
        "recv_seq",
        "unacked",
    )

    def __init__(self, max_inflight_bytes: int, ack_every: int = 256):
        self.max_inflight_bytes = max_inflight_bytes
        self.ack_every = ack_every
        self.next_seq = 1
        self.acked = 0  # highest seq the peer acknowledged
        self.recv_seq = 0  # highest contiguous seq received from the peer
        self.ack_owed = 0  # messages received since we last told the peer recv_seq
        self.unacked: deque[tuple[int, list[Any], int]] = deque()
        self.inflight_bytes = 0

    # -------------------------------------------------------------- sending side
    def stamp(self) -> tuple[int, int]:
        """Allocate the next sequence number; returns (seq, ack to piggyback)."""
        seq = self.next_seq
        self.next_seq = seq + 1
        self.ack_owed = 0
        return seq, self.recv_seq

    def record(self, seq: int, frames: list[Any], nbytes: int) -> None:
        """Keep a sent message until the peer acknowledges it."""
        self.unacked.append((seq, frames, nbytes))
        self.inflight_bytes += nbytes

    def can_send(self, nbytes: int) -> bool:
        """Back-pressure: false while unacknowledged bytes would exceed the bound.
        A single message larger than the bound is let through when nothing is in flight."""
        return self.inflight_bytes == 0 or self.inflight_bytes + nbytes <= self.max_inflight_bytes

    def on_ack(self, ack: int) -> int:
        """Drop acknowledged messages; returns how many bytes were freed."""
        if ack <= self.acked:
            return 0
        if ack >= self.next_seq:
            raise ProtocolError(f"peer acknowledged seq {ack}, but only {self.next_seq - 1} were sent")
        self.acked = ack
        freed = 0
        unacked = self.unacked
        while unacked and unacked[0][0] <= ack:
            freed += unacked.popleft()[2]
        self.inflight_bytes -= freed
        return freed

    def replay(self) -> list[tuple[int, list[Any], int]]:
        """Everything unacknowledged, oldest first (to resend on a new connection)."""
        return list(self.unacked)

    # -------------------------------------------------------------- receiving side
    def on_receive(self, seq: int) -> bool:
        """True if the message is new and must be delivered; False for a duplicate."""
        expected = self.recv_seq + 1
        if seq == expected:
            self.recv_seq = seq
            self.ack_owed += 1
            return True
        if seq < expected:
            return False
        raise ProtocolError(f"sequence gap: expected {expected}, got {seq}")

    def unreceive(self, seq: int) -> None:
        """Undo :meth:`on_receive` of ``seq`` (the last accepted): it could not be delivered
        yet, so it must not count as received (nor be acknowledged) until it is. A link that
        fails meanwhile then leaves it to its successor, which gets it again by replay."""
        assert seq == self.recv_seq
        self.recv_seq = seq - 1
        if self.ack_owed:
            self.ack_owed -= 1

    def should_ack(self) -> bool:
        return self.ack_owed >= self.ack_every

    def acked_now(self) -> int:
        """Call when sending a standalone ACK; returns the value to send."""
        self.ack_owed = 0
        return self.recv_seq
