"""How a :class:`~aionet.collectives.group.Group` moves and reduces arrays: the direct exchange,
recursive doubling, the segmented ring (with its receive-into registrations) and the binomial
tree, run over the group's messages. Each takes ``base``: the call's signature and fused bucket
(:mod:`.wire`), OR'd into every tag it sends and waits for. The schedules themselves (who sends what to whom, at
which step) are pure functions in :mod:`.algorithms`; the group's calls, membership and
message bookkeeping are in :mod:`.group`.

:class:`GroupAlgorithms` is a mixin :class:`Group` inherits (one ``self``, no delegation).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.ports import ReceiveInto
from ..errors import CollectiveError
from .algorithms import DoublingPlan, binomial_tree, chunk_bounds, ring_allgather, ring_reduce_scatter
from .aligned import empty_like_aligned
from .compression import WireCodec
from .ops import frozen
from .small import RAW_MAX, Key, RawDecoder
from .wire import PHASE_SHIFT, STEP_SHIFT, Tag, tag

# Segments per ring chunk, at least, by default (collectives.pipeline_segments). Each segment costs
# fixed CPU on both ends (measured, same processes alternating call by call: 4 -> 2 per chunk cut a
# rank's CPU per byte by 7-13 % at 16 MiB, and the wall time with it); two still overlap one's
# reduction with the next's transfer.
PIPELINE = 2
MIN_SEGMENT = 256 * 1024  # bytes: smaller pieces cost more per byte than they overlap


class GroupAlgorithms:
    """The array algorithms of a :class:`~aionet.collectives.group.Group` (mixin: uses its state).

    The annotations below are the Group's attributes and methods this mixin (and :class:`_Into`)
    uses; ``Group`` (its ``__init__`` and methods) sets them."""

    members: tuple[str, ...]
    channel: str
    rank: int
    size: int
    segment_bytes: int
    pipeline: int
    _inline_bytes: int
    _into: ReceiveInto | None
    _doubling_plan: DoublingPlan
    _post: Callable[[int, int, Tag, Any], asyncio.Task[None] | None]
    _recv: Callable[[int, Tag, int], asyncio.Future[Any]]

    async def _direct(
        self,
        seq: int,
        acc: np.ndarray,
        fn: Any,
        base: Tag,
        codec: WireCodec | None = None,
        dest: np.ndarray | None = None,
    ) -> np.ndarray:
        """Every rank sends its array to every other and reduces all ``n`` in rank order: one
        round (no rank waits for a partner's earlier round, which on a machine with fewer
        cores than ranks means waiting for that partner to be scheduled), ``n - 1`` messages
        each way. The same order everywhere gives every rank the same bits. Large arrays go in
        segments (as the ring's), each reduced as it arrives: at ``n = 2`` this moves what the
        ring moves, with no step waiting on the peer's reduction."""
        own = acc if codec is None else codec.round(acc)  # as the others will see it
        wire = own if codec is None else codec.encode(own)
        dec = codec.decode if codec is not None else _same
        n, r = self.size, self.rank
        seg = self._segment_items(own.nbytes, own.itemsize) if own.nbytes >= self._inline_bytes else max(1, own.size)
        bounds = [(a, min(a + seg, own.size)) for a in range(0, own.size, seg)] or [(0, 0)]
        futs = [[None if src == r else self._recv(seq, base | tag(0, 13, 0, j), src) for src in range(n)]
                for j in range(len(bounds))]  # fmt: skip
        for j, (a, b) in enumerate(bounds):
            for dst in range(r + 1, r + n):  # the next rank first: every rank's first message differs
                self._post(dst % n, seq, base | tag(0, 13, 0, j), wire[a:b])
        res = empty_like_aligned(own) if dest is None else dest
        for j, (a, b) in enumerate(bounds):
            parts = [own[a:b] if f is None else self._checked(dec(await f), own.dtype, b - a, src)
                     for src, f in enumerate(futs[j])]  # fmt: skip
            out = res[a:b]
            fn(parts[0], parts[1], out=out)
            for p in parts[2:]:
                fn(out, p, out=out)
        return res

    def _checked(self, got: Any, dtype: np.dtype[Any], n: int, src: int) -> np.ndarray:
        """``got`` if it is an array of ``n`` elements of ``dtype`` (what this rank's own input
        says every rank sends), else a CollectiveError: ranks whose inputs disagree must fail,
        not broadcast a one-element block over a longer one or cast another dtype in."""
        if type(got) is not np.ndarray or got.dtype != dtype or got.size != n:
            raise self._mismatch(got, dtype, n, src)
        return got

    def _mismatch(self, got: Any, dtype: np.dtype[Any], n: int, src: int) -> CollectiveError:
        theirs = f"{got.size} {got.dtype} elements" if isinstance(got, np.ndarray) else f"a {type(got).__name__}"
        return CollectiveError(
            f"rank {src} ({self.members[src]!r}) sent {theirs} where rank {self.rank} expected {n} {dtype} "
            "elements: call the same collective with the same shape and dtype on every rank"
        )

    def _segment_items(self, nbytes: int, itemsize: int, parts: int = 1) -> int:
        """Elements per pipelined segment of ``nbytes`` split in ``parts`` chunks: at least
        ``pipeline`` segments per chunk (so each step overlaps), none below MIN_SEGMENT bytes."""
        seg_bytes = max(MIN_SEGMENT, min(self.segment_bytes, nbytes // parts // self.pipeline))
        return max(1, seg_bytes // max(1, itemsize))

    async def _doubling(
        self, seq: int, acc: np.ndarray, fn: Any, base: Tag, codec: WireCodec | None = None
    ) -> np.ndarray:
        plan = self._doubling_plan
        if codec is not None:
            enc, dec = codec.encode, codec.decode
        elif acc.nbytes < RAW_MAX and acc.dtype.kind in "biufc":
            # the latency-bound case: every rank holds this dtype and shape, so the bytes alone
            # travel (short bytes take the link's own packer: no serializer, no ndarray ext)
            raw = RawDecoder(acc.dtype, acc.shape)
            enc, dec = raw.encode, raw
        else:
            enc = dec = _same
        if plan.fold_to is not None:
            self._post(plan.fold_to, seq, base | tag(0, 0, 0), enc(acc))
            got = dec(await self._recv(seq, base | tag(0, 2, 0), plan.fold_to))
            return np.array(self._checked(got, acc.dtype, acc.size, plan.fold_to))
        acc = acc.copy() if codec is None else codec.round(acc)  # kept as the partner will see it
        if plan.fold_from is not None:
            got = dec(await self._recv(seq, base | tag(0, 0, 0), plan.fold_from))
            fn(acc, self._checked(got, acc.dtype, acc.size, plan.fold_from), out=acc)
        for k, partner in enumerate(plan.partners):
            if codec is not None:
                acc = codec.round(acc)
            self._post(partner, seq, base | tag(0, 1, k), enc(acc))
            got = self._checked(dec(await self._recv(seq, base | tag(0, 1, k), partner)), acc.dtype, acc.size, partner)
            # the same operand order on both sides: results agree bit for bit (floats too)
            acc = fn(acc, got) if self.rank < partner else fn(got, acc)
        if codec is not None:
            acc = codec.round(acc)  # what a folded-in rank will receive: every rank the same bits
        if plan.unfold_to is not None:
            self._post(plan.unfold_to, seq, base | tag(0, 2, 0), enc(acc))
        return acc

    async def _ring_allreduce(
        self,
        seq: int,
        flat: np.ndarray,
        fn: Any,
        base: Tag,
        codec: WireCodec | None = None,
        dest: np.ndarray | None = None,
    ) -> np.ndarray:
        """Ring reduce-scatter then ring allgather into one result buffer, every chunk sent in
        segments so the reduction (or copy) of segment j overlaps the transfer of j + 1."""
        n, r = self.size, self.rank
        left, right = (r - 1) % n, (r + 1) % n
        bounds = chunk_bounds(flat.size, n)
        res = empty_like_aligned(flat) if dest is None else dest
        dt = flat.dtype
        seg = self._segment_items(flat.nbytes, flat.itemsize, n)
        holds: dict[int, list[asyncio.Task[None]]] = {}  # sends still reading a chunk of res

        def segments(c: int) -> list[tuple[int, int]]:
            a, b = bounds[c]
            return [(s, min(s + seg, b)) for s in range(a, b, seg)] or [(a, a)]

        enc = codec.encode if codec is not None else None  # None: sent and received as they are
        dec = codec.decode if codec is not None else None
        rs = ring_reduce_scatter(n, r)
        ag = ring_allgather(n, r)
        # every step's tag with segment 0; segment j's is that plus j (tag()'s low 20 bits),
        # checked once here for the largest j rather than once per segment
        rs_tags = [base | tag(0, 4, s) for s in range(len(rs))]
        ag_tags = [base | tag(0, 5, s) for s in range(len(ag))]
        tag(0, 5, len(ag), max(1, -(-max(b - a for a, b in bounds) // seg)) - 1)
        into = _Into(self, seq, base, left, ag) if codec is None and self._into is not None else None
        try:
            t0 = rs_tags[0]
            for j, (a, b) in enumerate(segments(rs[0].send)):
                sent = self._post(right, seq, t0 + j, flat[a:b] if enc is None else enc(flat[a:b]))
                if sent is not None and res is flat:  # in place: the allgather overwrites this chunk
                    holds.setdefault(rs[0].send, []).append(sent)
            if into is not None:
                # Every allgather place is offered now. Its segment can only arrive after the
                # ring carried this rank's own send of that place (the in-place first chunk, or
                # a partial sum) on to where the chunk is complete: those sends were delivered,
                # so no replay will read them again, and the reduction that wrote the place
                # came before its send. The `holds` awaited below guard the copying path only.
                for c in into.chunks:
                    into.open_chunk(c, segments(c), res)
                if res is not flat:
                    # Out of place, the reduce-scatter's segments too: a received partial sum
                    # lands where its reduction goes and is reduced there in place (nothing else
                    # has written those places yet in this call). In place they cannot: the
                    # places hold this rank's own input until reduced.
                    for s, step in enumerate(rs):
                        for j, (a, b) in enumerate(segments(step.recv)):
                            into.offer(4, s, j, res[a:b])
            last = len(rs) - 1
            for s, step in enumerate(rs):
                t_in = rs_tags[s]
                t_out = rs_tags[s + 1] if s < last else ag_tags[0]
                for j, (a, b) in enumerate(segments(step.recv)):
                    got = await self._recv(seq, t_in + j, left)
                    if dec is not None:
                        got = dec(got)
                    if type(got) is not np.ndarray or got.dtype != dt or got.size != b - a:
                        raise self._mismatch(got, dt, b - a, left)
                    # one chain per chunk: every rank gets the same bits (landed in place or not)
                    out = res[a:b]
                    fn(flat[a:b], got, out=out)
                    if s < last:
                        sent = self._post(right, seq, t_out + j, out if enc is None else enc(out))
                        if sent is not None:
                            holds.setdefault(step.recv, []).append(sent)
                    else:
                        # fully reduced here: it starts the allgather at once, segment by segment,
                        # so the right neighbour copies segment j while this rank reduces j + 1
                        if codec is not None:  # kept as the others will receive it
                            res[a:b] = codec.round(out)
                        self._post(right, seq, t_out + j, out if enc is None else enc(out))
            for s, step in enumerate(ag):
                if step.recv in holds:  # about to overwrite what an earlier send may still be reading
                    await await_sends(holds.pop(step.recv))
                t_in = ag_tags[s]
                t_out = ag_tags[s + 1] if s + 1 < len(ag) else 0
                for j, (a, b) in enumerate(segments(step.recv)):
                    got = await self._recv(seq, t_in + j, left)
                    dst = res[a:b]
                    landed = into is not None and _aliases(got, dst)
                    if s + 1 < len(ag):  # forwarded before it is copied in
                        # landed in the result: sent from there, writable, so held until acked
                        self._post(right, seq, t_out + j, dst if landed else frozen(got))
                    if not landed:
                        if dec is not None:
                            got = dec(got)
                        if type(got) is not np.ndarray or got.dtype != dt or got.size != b - a:
                            raise self._mismatch(got, dt, b - a, left)
                        np.copyto(dst, got)
        finally:
            if into is not None:
                into.close()
        return res

    async def _tree_reduce(self, seq: int, flat: np.ndarray, fn: Any, root: int, base: Tag) -> np.ndarray | None:
        node = binomial_tree(self.size, root, self.rank)
        acc = flat.copy()
        t = base | tag(0, 6, 0)  # one tag (a rooted call's root is in base): the sender tells children apart
        for child in reversed(node.children):  # smallest subtree first: it finishes first
            got = self._checked(await self._recv(seq, t, child), acc.dtype, acc.size, child)
            acc = fn(acc, got) if self.rank < child else fn(got, acc)
        if node.parent is not None:
            self._post(node.parent, seq, t, acc)
            return None
        return acc

    async def _tree_bcast(self, seq: int, value: Any, root: int, base: Tag, phase: int = 7) -> Any:
        node = binomial_tree(self.size, root, self.rank)
        t = base | tag(0, phase, 0)
        if node.parent is not None:
            value = await self._recv(seq, t, node.parent)
        for child in node.children:
            self._post(child, seq, t, value)
        return value

    async def _ring_reduce_scatter(
        self, seq: int, flat: np.ndarray, fn: Any, bounds: list[tuple[int, int]], base: Tag
    ) -> np.ndarray:
        """The ring schedule with chunk ``c`` standing for block ``c - 1``, so that rank ``r``
        ends holding block ``r``."""
        n, r = self.size, self.rank
        left, right = (r - 1) % n, (r + 1) % n
        buf = flat.copy()
        rs = ring_reduce_scatter(n, r)
        a, b = bounds[(rs[0].send - 1) % n]
        self._post(right, seq, base | tag(0, 8, 0), buf[a:b])
        for s, step in enumerate(rs):
            a, b = bounds[(step.recv - 1) % n]
            got = self._checked(await self._recv(seq, base | tag(0, 8, s), left), buf.dtype, b - a, left)
            view = buf[a:b]
            fn(view, got, out=view)
            if s + 1 < len(rs):
                self._post(right, seq, base | tag(0, 8, s + 1), view)
        a, b = bounds[r]
        return buf[a:b].copy()


class _Into:
    """One ring allreduce's receive-into registrations: each allgather segment's place in the
    result (and, out of place, each reduce-scatter segment's) is offered to the transport, and
    every registration is withdrawn when the call ends (so a failed call's array is written no
    more)."""

    __slots__ = ("_base", "_channel", "_closed", "_keys", "_peer", "_ports", "_seq", "_src", "chunks")

    def __init__(self, g: GroupAlgorithms, seq: int, base: Tag, left: int, ag: list[Any]) -> None:
        assert g._into is not None
        self._ports = g._into
        self._peer = g.members[left]
        self._src = left  # the sender's rank, as its messages carry it
        self._channel = g.channel
        self._seq = seq
        self._base = base  # the call's signature and bucket
        self._keys: list[Key] = []
        self._closed = False
        #: allgather chunk -> the step that receives it (the step is part of the message's tag)
        self.chunks: dict[int, int] = {step.recv: s for s, step in enumerate(ag)}

    def open_chunk(self, c: int, segs: list[tuple[int, int]], res: np.ndarray) -> None:
        """Offer chunk ``c``'s segments (their places in ``res``) to the transport."""
        s = self.chunks[c]
        for j, (a, b) in enumerate(segs):
            self._expect(s, j, res[a:b])

    def _expect(self, s: int, j: int, place: np.ndarray) -> None:
        self.offer(5, s, j, place)

    def offer(self, phase: int, s: int, j: int, place: np.ndarray) -> None:
        """Segment ``j`` of ring step ``s`` of ``phase`` (4: reduce-scatter, 5: allgather)."""
        if self._closed or not place.size:
            return
        # base | tag(0, phase, s, j) inlined: the ring checked its largest tag when the call began
        key = (self._seq, self._base | (phase << PHASE_SHIFT) | (s << STEP_SHIFT) | j, self._src)
        self._keys.append(key)
        self._ports.expect(self._peer, self._channel, key, place)

    def close(self) -> None:
        self._closed = True
        if self._keys:
            self._ports.forget(self._peer, self._channel, self._keys)
            self._keys = []


async def await_sends(sends: list[asyncio.Task[None]]) -> int:
    """Wait for a call's posted sends; raise the first failure. Returns how many were awaited.

    Most were acknowledged while the call ran: their outcome is read here directly and only the
    ones still running go to ``asyncio.gather``, which costs ~13 Python calls per task (a ring
    allreduce posts one per segment). A done send's failure or cancellation raises as gather
    would have raised it."""
    n = len(sends)  # a send posted meanwhile is not counted: the caller then reaps it
    pending = []
    for t in sends:
        if t.done():
            t.result()
        else:
            pending.append(t)
    if pending:
        await asyncio.gather(*pending)
    return n


def _aliases(got: Any, dst: np.ndarray) -> bool:
    """Whether received ``got`` is ``dst`` itself (the segment was received into its place)."""
    return (
        type(got) is np.ndarray
        and got.dtype == dst.dtype
        and got.shape == dst.shape
        and got.__array_interface__["data"][0] == dst.__array_interface__["data"][0]
    )


def _same(x: np.ndarray) -> np.ndarray:
    return x


__all__ = ["MIN_SEGMENT", "PIPELINE", "GroupAlgorithms", "await_sends"]
