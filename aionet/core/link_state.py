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
from dataclasses import dataclass
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


# ------------------------------------------------------------------ resume rules (sans-I/O)
@dataclass(frozen=True)
class ResumePlan:
    """What a link does with the peer's resume info from a handshake (decided here, done by
    :meth:`aionet.core.link.Link.apply_resume`)."""

    restart_tx: str = ""  # non-empty: our stream restarts (what was in flight is given up): why
    reset_rx: bool = False  # the peer's stream toward us starts over
    rx_id: str | None = None  # the peer's stream id to follow from now on
    ack: int | None = None  # the peer received our stream up to here: trim the replay buffer
    peer_node_id: str = ""
    notes: tuple[str, ...] = ()


def plan_resume(
    info: Any, peer_node_id: str, *, known_node_id: str, tx_id: str, rx_id: str, acked: int, next_seq: int
) -> ResumePlan:
    """The resume rules. ``info`` is the peer's view (``{"tx", "rx", "recv"}``, anything else
    is treated as empty); the rest is ours. In order:

    - a different node id than the one we knew: the peer restarted; both streams start over;
    - a ``tx`` we do not follow yet: the peer started a new stream toward us;
    - its ``rx`` is our stream: it received up to ``recv`` (trim; bogus values are ignored);
      otherwise, if we had sent anything, it lost our stream: ours starts over.
    """
    info = info if isinstance(info, dict) else {}
    notes: list[str] = []
    restart_tx = ""
    reset_rx = False
    if known_node_id and peer_node_id != known_node_id:
        notes.append("peer restarted (new incarnation): messages to the old one are lost")
        restart_tx, reset_rx = "peer restarted; in-flight messages to it are lost", True
        next_seq = 1  # our stream restarts below: nothing of the old one to trim or keep
    their_tx = info.get("tx")
    new_rx = None
    if isinstance(their_tx, str) and their_tx != rx_id:
        if rx_id:
            notes.append("peer started a new stream")
        reset_rx, new_rx = True, their_tx
    ack = None
    if not restart_tx:
        if info.get("rx") == tx_id:
            recv = info.get("recv")
            if isinstance(recv, int) and not isinstance(recv, bool) and acked < recv < next_seq:
                ack = recv
        elif next_seq > 1:
            notes.append("peer lost our stream: restarting it")
            restart_tx = "link reset by peer; in-flight messages are lost"
    return ResumePlan(restart_tx, reset_rx, new_rx, ack, peer_node_id, tuple(notes))
