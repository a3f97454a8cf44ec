"""Link-owned copies of large outgoing buffers, so a big ``send`` can return before its ack.

A message stays in the link's replay buffer until the peer acknowledges it, and ``send``
promises that the caller may reuse its buffers once it returns. Referencing the caller's
memory (zero-copy) therefore makes every big ``send`` wait a full round trip for its ack, so
back-to-back sends never overlap on the wire. Copying the caller's buffers into memory the
link owns lets ``send`` return at once (a transport keeps an :class:`OwnedFrame` by
reference without waiting for the kernel to take it); the copies are recycled here (a buffer is handed out
again only when nothing but this pool references it: not the replay buffer, not a transport
still writing it), so steady streams copy into warm memory without page faults.

Off by default (``link.big_copy_max_bytes = 0``): on the 2-core loopback machine where it
was measured loaded (BENCHMARKS.md, "Large messages", 2026-11-27), the copy (~70 us per MiB)
and the busier receive path of overlapping frames cost more CPU than the idle round trips it
hides; measured quiet (2026-11-28) it sent 1 MiB messages 1.4-1.7x faster, but ring
collectives gained nothing at 16 MiB, and the pool holds up to :data:`POOL_BYTES` per link.
Where a round trip is long against the transfer (a real network) it is the better choice;
:data:`COPY_MAX` is the largest bound worth setting (above it the round trip is amortized
and the copy would cost a third of the transfer).
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any

from ..codecs.framing import OwnedFrame, as_frame

#: The largest ``link.big_copy_max_bytes`` worth setting; the pool is sized for it.
COPY_MAX = 8 * 2**20
#: Copies of unacknowledged messages kept at most this many bytes (plus the newest message):
#: beyond, a sender waits for acks. Two or three 1 MiB messages in flight hide the round trip.
COPY_BUDGET = 8 * 2**20
#: The pool keeps at most this many bytes of buffers (in use or free).
POOL_BYTES = COPY_BUDGET + COPY_MAX
#: :meth:`ReplayCopies.freeze` copies buffers from this size into recycled ones (smaller: ``bytes``).
POOLED_MIN = 64 * 1024


class ReplayCopies:
    """Copies of large frames into recycled buffers, and the account of which messages hold them."""

    __slots__ = (
        "_bufs",
        "_free_refs",
        "_pool_bytes",
        "copied_bytes",
        "copies",
        "frozen_bytes",
        "inflight",
        "inflight_bytes",
    )

    def __init__(self) -> None:
        self._bufs: list[OwnedFrame] = [OwnedFrame()]
        self._free_refs = sys.getrefcount(self._bufs[0])  # "only the pool holds it", calibrated
        self._bufs.clear()
        self._pool_bytes = 0
        # (seq, bytes) of sent messages whose frames are copies, oldest first, until acked
        self.inflight: deque[tuple[int, int]] = deque()
        self.inflight_bytes = 0
        self.copies = 0  # messages copied (for tests and stats)
        self.copied_bytes = 0
        self.frozen_bytes = 0  # bytes copied by freeze()

    def copy(self, frames: list[Any]) -> list[Any]:
        """``frames`` with every frame that may be caller memory (anything but ``bytes``)
        replaced by a copy in a link-owned buffer."""
        out = list(frames)
        for i, f in enumerate(out):
            if type(f) is bytes:
                continue
            src = as_frame(f)
            n = len(src)
            dst = self._buffer(n)
            memoryview(dst)[:] = src
            out[i] = dst
            self.copied_bytes += n
        self.copies += 1
        return out

    def freeze(self, frames: list[Any]) -> list[Any]:
        """``frames`` with every out-of-band buffer its owner could still change (writable
        caller memory) replaced by a copy: for a message that goes out before its ack (a
        send under BIG_MESSAGE, a reply), so a replay after a cut carries the bytes of the
        call. Immutable frames (``bytes``, read-only arrays and views, this pool's copies)
        stay zero-copy; so do frames that are not host memory (device frames)."""
        out: list[Any] | None = None
        for i in range(1, len(frames)):
            f = frames[i]
            if _writable(f) is not True:  # immutable, or not host memory (its transport's rules apply)
                continue
            if out is None:
                out = list(frames)
            src = as_frame(f)
            n = len(src)
            if n < POOLED_MIN:
                out[i] = bytes(src)
            else:  # recycled: a steady stream of such messages copies into warm memory
                dst = self._buffer(n)
                memoryview(dst)[:] = src
                out[i] = dst
            self.frozen_bytes += n
        return frames if out is None else out

    @staticmethod
    def immutable(frames: list[Any]) -> bool:
        """Whether no out-of-band frame of ``frames`` is memory its owner may still change:
        ``bytes``, this pool's copies, read-only arrays and views (by the README's contract, a
        caller that marks a buffer read-only does not change it). Frames that are not host
        memory count as mutable here (their transport decides)."""
        return all(_writable(frames[i]) is False for i in range(1, len(frames)))

    def _buffer(self, n: int) -> OwnedFrame:
        """A buffer of exactly ``n`` bytes nobody else references, else a fresh one (pooled
        while the pool stays within POOL_BYTES)."""
        bufs = self._bufs
        free = self._free_refs
        for i in range(len(bufs)):
            b = bufs[i]
            if len(b) == n and sys.getrefcount(b) <= free + 1:  # +1: the local ``b``
                return b
        b = OwnedFrame(n)  # zero-filled once; recycled buffers are not
        if self._pool_bytes + n > POOL_BYTES:
            # Make room by forgetting free buffers (their memory goes back); buffers still in
            # use stay remembered, so the pool never grows past the bound by more than them.
            i = 0
            while i < len(bufs) and self._pool_bytes + n > POOL_BYTES:
                if sys.getrefcount(bufs[i]) <= free:
                    self._pool_bytes -= len(bufs.pop(i))
                else:
                    i += 1
        if self._pool_bytes + n <= POOL_BYTES:
            bufs.append(b)
            self._pool_bytes += n
        return b

    @property
    def pool_bytes(self) -> int:
        """Bytes of buffers the pool remembers (in use or free)."""
        return self._pool_bytes

    def sent(self, seq: int, nbytes: int) -> int:
        """Account a copied message; returns the seq whose ack brings the copies held back
        within COPY_BUDGET (0: already within)."""
        self.inflight.append((seq, nbytes))
        self.inflight_bytes += nbytes
        over = self.inflight_bytes - nbytes - COPY_BUDGET  # the newest message may exceed the budget
        if over <= 0:
            return 0
        for s, nb in self.inflight:
            over -= nb
            if over <= 0:
                return s
        return seq  # not reached: the loop covers every older message

    def acked(self, ack: int) -> None:
        q = self.inflight
        while q and q[0][0] <= ack:
            self.inflight_bytes -= q.popleft()[1]

    def take_over(self, old: ReplayCopies) -> None:
        """A successor link adopted ``old``'s unacknowledged messages: their account too."""
        self.inflight, old.inflight = old.inflight, deque()
        self.inflight_bytes, old.inflight_bytes = old.inflight_bytes, 0

    def reset(self) -> None:
        """The stream was reset or given up: nothing copied is in flight any more."""
        self.inflight.clear()
        self.inflight_bytes = 0


def _writable(f: Any) -> bool | None:
    """Whether its owner may still change frame ``f``: False for ``bytes``, this pool's copies
    and read-only buffers, True for writable host memory, None for what is not host memory."""
    t = type(f)
    if t is bytes or t is OwnedFrame:
        return False
    try:
        return not (f if t is memoryview else memoryview(f)).readonly
    except TypeError:
        return None
