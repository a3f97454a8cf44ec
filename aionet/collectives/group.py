"""A process group: ranks over node names, and the collectives performed over the node's links.

Each collective call takes the group's next sequence number, so concurrent calls and calls that
overlap in time on different ranks never mix their messages. Messages travel on the group's own
mailbox channel as ``[seq, tag, src_rank, payload]`` (:mod:`.wire`: the tag names the call's
signature, its bucket, phase, step and segment); the channel callback hands
each to the waiting future (or, for a small allreduce, to its step: :mod:`.small`), keeping
messages for calls this rank has not reached yet. The array algorithms (direct, doubling, ring,
tree) are in :mod:`.group_algorithms`, a mixin :class:`Group` inherits.

Failure semantics: when membership declares a member dead (or it leaves), every pending and
later call on every group containing it raises :class:`~aionet.errors.CollectiveError` naming
it, within the failure-detection time; nothing waits for a dead rank. ``shrink()`` gives the
survivors a new group on which the next call is correct (MPI ULFM's revoke + shrink).

A call that fails on one rank for a reason of its own (inputs that disagree with a peer's,
arguments refused there, cancellation) sends the peers an ABORT for its sequence number
(:mod:`.wire`): their matching call raises CollectiveError naming the rank, and the group goes
on. A timeout breaks the group on every member (its ABORT says so), so all of them shrink.

Ranks that call different things at one number (another collective, op, algorithm or root):
every tag carries its call's signature (:func:`.wire.signature`), and each call in progress
registers what it accepts (``_wants``). A message no call waited for is checked against it as
it arrives (inline bit operations, no call: only early or stray messages pay), and a call that
starts checks the messages kept for its number; a mismatch fails the call here and ABORTs it
on the peers. Where every rank waits and none sends, the group's ticker (every PROBE_AFTER
while calls run) has each call still running since the last tick send the ranks it waits for a
PROBE with its signature, and a rank whose running call differs fails it the same way.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, NoReturn

import numpy as np

from ..core.ports import DeviceArrays, Messaging, ReceiveInto
from ..core.tasks import OwnedTasks
from ..errors import CollectiveError, PeerUnavailable, WouldBlock
from ..instrument import Instruments
from ..log import get_logger
from .algorithms import chunk_bounds, recursive_doubling, ring_allgather
from .aligned import empty_aligned
from .compression import WireCodec, wire_codec
from .group_algorithms import PIPELINE, GroupAlgorithms, _same, await_sends
from .group_native import GroupNative
from .native import NativeSupport
from .ops import OPS, Converted, check_out, finish_mean, for_op, from_numpy, to_numpy, ufunc, work_buffer, write_out
from .small import MISSING, RAW_MAX, DoublingRun, Key, round_tags
from .wire import (
    ABORT,
    CHANNEL_PREFIX,
    KINDS,
    PROBE,
    SIG_SHIFT,
    Tag,
    bucket_of,
    call_mask,
    describe,
    signature,
    tag,
)

ALGORITHMS = ("auto", "ring", "doubling", "direct", "tree", "native")
LEAVE_GRACE = 1.0  # s between a member's graceful leave and failing calls that still wait on it
MAX_ABORTS = 1024  # peers' aborts kept for calls this rank has not reached (a flood beyond is dropped)
ALGORITHM_BITS = 0x7 << SIG_SHIFT  # a signature's resolved algorithm (wire.py's layout)
# A call that waited this long (between one and two periods) without ending asks the peers it
# waits for what they call at its number (wire.PROBE): ranks that call different things and all
# wait (nobody sends: a root that is not the root, a rank that waits for a fold first) find out.
PROBE_AFTER = 0.5

#: what a call accepts from its peers: the tag bits compared (wire.call_mask) and the values
#: they may take (the call's signature OR'd with each of its buckets)
Want = tuple[Tag, tuple[Tag, ...]]


class Group(GroupAlgorithms, GroupNative):
    """``grp = node.group()``: ``grp.rank``, ``grp.size``, ``grp.members`` and the collectives.
    Every member must create the same group (same members in the same order, same name)."""

    def __init__(
        self,
        messaging: Messaging,
        members: Sequence[str],
        name: str,
        *,
        small_bytes: int,
        max_ahead_bytes: int,
        segment_bytes: int,
        timeout: float | None,
        alive: Callable[[str], bool],
        on_close: Callable[[Group], None],
        factory: Callable[[list[str], str, int], Group],
        epoch: int = 0,
        instruments: Instruments | None = None,
        compression: str = "none",
        device: DeviceArrays | None = None,
        inline_bytes: int = 0,
        receive_into: ReceiveInto | None = None,
        pipeline: int = PIPELINE,
        native: NativeSupport | None = None,
    ) -> None:
        if messaging.name not in members:
            raise ValueError(f"node {messaging.name!r} is not in the group's members {list(members)}")
        if len(set(members)) != len(members):
            raise ValueError(f"a group's members must be distinct: {list(members)}")
        self.members: tuple[str, ...] = tuple(members)
        self.name = name
        self.epoch = epoch
        self.rank = self.members.index(messaging.name)
        self.size = len(self.members)
        self.small_bytes = small_bytes
        self.compression = compression  # allreduce's default wire compression of float32
        self._device = device  # device (GPU) inputs: reduced through host copies
        self.max_ahead_bytes = max_ahead_bytes
        self.segment_bytes = max(1, segment_bytes)
        self.pipeline = max(1, pipeline)  # segments per ring chunk, at least (collectives.pipeline_segments)
        self.timeout = timeout
        digest = hashlib.blake2b("\0".join(self.members).encode(), digest_size=6).hexdigest()
        # the member list is part of the channel: groups whose members disagree never mix
        self.channel = f"{CHANNEL_PREFIX}{name}#{epoch}.{digest}"
        self._msg = messaging
        # Arrays below the codec's out-of-band threshold are copied into the message when it is
        # posted, so they can go without a task (send_nowait) and be changed right after.
        self._inline_bytes = inline_bytes
        self._nowait = getattr(messaging, "send_nowait", None)
        # what a call posted goes to the socket before it returns: a caller that computes next
        # without yielding would otherwise hold its last messages back from the waiting peers
        self._write_out = getattr(messaging, "flush", None)
        self._posted: set[int] = set()  # ranks sent to without a task since the last flush
        self._into = receive_into  # the ring's allgather segments land straight in the result
        # large allreduces over the group's native ring (.group_native): set up at the first one
        self._native_support = native
        self._native = None
        self._native_state = None  # None: not set up yet; True: in use; False: not (see _native_why)
        self._native_why = ""
        self._native_lock = asyncio.Lock()
        self._doubling_plan = recursive_doubling(self.size, self.rank)
        # the small allreduce's tags and what it accepts, per (kind, op): no work per call
        self._small: dict[tuple[str, str], tuple[tuple[Tag, ...], Want]] = {}
        for kind, op in [*(("allreduce", op) for op in OPS), ("barrier", "sum")]:
            sig = signature(kind, op, "doubling" if kind == "allreduce" else "")
            self._small[kind, op] = (round_tags(self._doubling_plan, sig), (call_mask(kind), (sig,)))
        self._instruments = instruments if instruments is not None else Instruments()  # collective_finished
        self._alive = alive
        self._on_close = on_close
        self._factory = factory
        self._seq = 0
        self._active: set[int] = set()  # sequence numbers of calls in progress
        self._wants: dict[int, Want] = {}  # each call in progress: the signature its peers' messages carry
        self._ticker: asyncio.TimerHandle | None = None  # probes stalled calls (_tick) while calls run
        self._stalled: set[int] = set()  # the calls in progress at the last tick
        self._sends: dict[int, list[asyncio.Task[None]]] = {}
        self._waiting: dict[tuple[int, Tag, int], asyncio.Future[Any]] = {}
        self._early: dict[tuple[int, Tag, int], Any] = {}
        # small allreduces (.small): the step each waits for, and each call's run by sequence number
        self._steps: dict[Key, Callable[[Any], None]] = {}
        self._runs: dict[int, DoublingRun] = {}
        # bytes held for calls this rank has not started (peers running ahead), bounded
        self._ahead: dict[tuple[int, Tag, int], int] = {}
        self._ahead_bytes = 0
        self._broken: CollectiveError | None = None
        # calls a peer aborted (wire.ABORT): seq -> the error its call raises here, active or not yet started
        self._aborted: dict[int, CollectiveError] = {}
        self._telling = OwnedTasks(get_logger("aionet.collectives"), "collective abort")  # ABORTs that had to wait
        self.lost: set[str] = set()
        self._closed = False
        self._close_why = ""  # what close() was told, for the errors of later calls
        self._broken_before_close: CollectiveError | None = None
        self.log = get_logger("aionet.collectives", node=messaging.name, group=name)
        # messages are taken as they arrive (no mailbox, no task wake-up per message); what
        # is kept for calls not reached yet is bounded by max_ahead_bytes
        messaging.on_channel(self.channel, self._on_message)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def broken(self) -> bool:
        """A member was lost (or a call failed on some rank): every call raises; shrink() it."""
        return self._broken is not None

    def __repr__(self) -> str:
        return f"<Group {self.name!r} rank {self.rank}/{self.size}>"

    # ------------------------------------------------------------------ membership
    def member_lost(self, name: str, reason: str) -> None:
        """Membership says ``name`` is gone: fail what waits, refuse what comes."""
        if name not in self.members or name == self.members[self.rank]:
            return
        self.lost.add(name)
        exc = CollectiveError(f"group {self.name!r}: member {name!r} is {reason}", member=name)
        if reason != "left":
            self._break(exc)
            return
        # A graceful leave: what the member sent before it left is still arriving (its link
        # delivers everything before its goodbye, but gossip may tell of the leave sooner), so a
        # call it already finished its part of can still complete. Break after a short grace.
        asyncio.get_running_loop().call_later(LEAVE_GRACE, self._break, exc, True)

    def _break(self, exc: CollectiveError, quiet: bool = False) -> None:
        if self._broken is None:
            self._broken = exc
            if self._waiting or not quiet:
                self.log.warning("collective group broken: shrink() it to go on", error=str(exc))
        futs = [*self._waiting.values(), *(run.done for run in self._runs.values())]
        for fut in futs:
            if not fut.done():
                fut.set_exception(self._broken)
                fut.exception()  # retrieved here: a waiter that is gone must not log it
        self._waiting.clear()
        self._steps.clear()

    def shrink(self) -> Group:
        """A new group of the members still alive (without the lost ones), ranks renumbered in
        the same order. Every survivor calls it; the next collective on it is correct."""
        survivors = [m for m in self.members if m not in self.lost and self._alive(m)]
        return self._factory(survivors, self.name, self.epoch + 1)

    async def close(self, why: str = "") -> None:
        """Fail what is pending and every later call (CollectiveError), stop taking messages."""
        if self._closed:
            return
        self._closed = True
        self._close_why = f" ({why})" if why else ""
        self._broken_before_close = self._broken
        self._break(CollectiveError(f"group {self.name!r} is closed{f' ({why})' if why else ''}"), quiet=True)
        self._msg.on_channel(self.channel, None)
        self._native_close()
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        await self._telling.cancel_all()
        self._aborted.clear()
        self._early.clear()
        self._ahead.clear()
        self._ahead_bytes = 0
        self._on_close(self)

    # ------------------------------------------------------------------ messages
    def _on_message(self, sender: str, msg: Any) -> None:
        """A message on the group's channel, as it is delivered: to the call waiting for it,
        or kept for a call this rank has not reached yet. A malformed one is dropped with a
        log line (it was acknowledged: closing the connection would only have it replayed)."""
        if type(msg) is not list or len(msg) != 4 or not (type(msg[0]) is type(msg[1]) is type(msg[2]) is int):
            self.log.warning("malformed collective message dropped: not [seq, tag, src, payload]", peer=sender)
            return
        seq, t, src, payload = msg
        key = (seq, t, src)
        step = self._steps.pop(key, None)
        if step is not None:  # a small allreduce's round: it reduces and sends on from here
            step(payload)
            return
        fut = self._waiting.pop(key, None)
        if fut is not None:
            if not fut.done():
                fut.set_result(payload)
        elif t == ABORT:
            self._on_abort(seq, src, payload)
        elif t == PROBE:
            self._on_probe(seq, src, payload)
        elif self._broken is None and not self._closed and seq >= self._low_seq():
            wants = self._wants  # wire.matches inlined: only messages no call waited for pay it
            if seq in wants and t & wants[seq][0] not in wants[seq][1]:
                self._mismatched(seq, t, src)  # a peer's call #seq is another call than this rank's
                return
            self._early[key] = payload  # for a call this rank has not reached yet
            if seq >= self._seq:
                self._hold_ahead(key, payload)

    def _hold_ahead(self, key: tuple[int, Tag, int], payload: Any) -> None:
        n = int(getattr(payload, "nbytes", 0)) or 64
        self._ahead[key] = n
        self._ahead_bytes += n
        if self._ahead_bytes > self.max_ahead_bytes:
            self._early.clear()
            self._ahead.clear()
            self._ahead_bytes = 0
            self._break(
                CollectiveError(
                    f"group {self.name!r}: peers ran more than collectives.max_ahead_bytes "
                    f"({self.max_ahead_bytes}) ahead of rank {self.rank}: call the same collectives "
                    "in the same order on every rank, or raise the bound"
                )
            )

    def _release_ahead(self, key: tuple[int, Tag, int]) -> None:
        n = self._ahead.pop(key, None)
        if n is not None:
            self._ahead_bytes -= n

    def _low_seq(self) -> int:
        """Messages below this belong to calls that ended (failed ones leave some behind)."""
        return min(self._active, default=self._seq)

    def _recv(self, seq: int, t: Tag, src: int) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        key = (seq, t, src)
        if key in self._early:
            self._release_ahead(key)
            fut.set_result(self._early.pop(key))
        elif self._broken is not None:
            fut.set_exception(self._broken)
            fut.exception()  # a call awaiting several futures raises one: the others must not log
        elif self._aborted and seq in self._aborted:
            fut.set_exception(self._aborted[seq])
            fut.exception()
        else:
            self._waiting[key] = fut
        return fut

    def _expect(self, key: Key, step: Callable[[Any], None]) -> Any:
        """:meth:`_recv` for a callback: the message if it came early, else MISSING and ``step``
        gets it on arrival. Raises the group's failure once it broke."""
        if key in self._early:
            self._release_ahead(key)
            return self._early.pop(key)
        if self._broken is not None:
            raise self._broken
        if self._aborted and key[0] in self._aborted:
            raise self._aborted[key[0]]
        self._steps[key] = step
        return MISSING

    async def _send(self, dst: int, seq: int, t: Tag, payload: Any) -> None:
        peer = self.members[dst]
        try:
            await self._msg.send(peer, self.channel, [seq, t, self.rank, payload])
        except PeerUnavailable as exc:
            self.member_lost(peer, f"unreachable ({exc})")
            raise self._broken or CollectiveError(str(exc), member=peer) from exc

    async def _run(
        self, what: str, fn: Callable[[int], Awaitable[Any]], timeout: float | None, want: Want, nbytes: int = 0
    ) -> Any:
        """One collective call: its sequence number, the failure and timeout rules, the hook.
        ``want``: the signature the peers' messages for this call must carry (:meth:`_want`)."""
        hook = self._instruments.collective_finished
        if hook is None:
            return await self._call(what, fn, timeout, want)
        t0 = time.perf_counter()
        error: str | None = "CancelledError"
        try:
            out = await self._call(what, fn, timeout, want)
            error = None
            return out
        except Exception as exc:
            error = type(exc).__name__
            raise
        finally:
            hook(self.name, what, nbytes, time.perf_counter() - t0, error)

    async def _call(self, what: str, fn: Callable[[int], Awaitable[Any]], timeout: float | None, want: Want) -> Any:
        if self._closed or self._broken is not None:
            # a fresh error per refused call: re-raising one instance would grow its traceback
            # with every call a loop makes on a dead group
            if self._closed:
                b = self._broken_before_close
                was = f"; it had broken: {b}" if b is not None else ""
                raise CollectiveError(f"group {self.name!r} is closed{self._close_why}{was}", b and b.member)
            b = self._broken
            assert b is not None
            raise CollectiveError(str(b), member=b.member)
        seq = self._seq
        self._seq += 1
        self._active.add(seq)
        self._wants[seq] = want
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().call_later(PROBE_AFTER, self._tick)
        odd: tuple[int, Tag, int] | None = None  # a message a peer sent for another call at this number
        if self._early:
            low = self._low_seq()
            for k in [k for k in self._early if k[0] < low]:  # leftovers of failed calls
                del self._early[k]
                self._release_ahead(k)
            for k in [k for k in self._ahead if k[0] == seq]:  # started now: no longer ahead
                self._release_ahead(k)
                if k[1] & want[0] not in want[1]:
                    odd = k
        limit = self.timeout if timeout is None else timeout
        sends = self._sends[seq] = []
        awaited = -1  # how many of sends were awaited and succeeded (all of them: nothing left to reap)
        try:
            if self._aborted and seq in self._aborted:
                raise self._aborted[seq]  # a peer gave this call up before this rank reached it
            if odd is not None:
                raise self._signature_error(seq, want, odd[1], odd[2])  # the peers are told below
            if limit is None:  # the usual case: no timer to arm, no context to enter and leave
                out = await fn(seq)
                awaited = await await_sends(sends)
                if self._posted:
                    self._flush_posted()
                return out
            async with asyncio.timeout(limit):
                out = await fn(seq)
                awaited = await await_sends(sends)
                if self._posted:
                    self._flush_posted()
                return out
        except TimeoutError:
            if limit is None:
                raise
            exc = CollectiveError(
                f"group {self.name!r}: {what} timed out after {limit} s on rank {self.rank}{self._missing(seq)}",
                member=self._missing_member(seq),
            )
            self._break(exc)
            self._tell_abort(seq, what, f"it timed out there after {limit} s", breaks=True)
            raise exc from None
        except BaseException as exc:  # cancelled, or this rank's input disagrees with its peers'
            if exc is not self._broken and exc is not self._aborted.get(seq):
                why = "it was cancelled there" if isinstance(exc, asyncio.CancelledError) else f"{exc}"
                self._tell_abort(seq, what, why, breaks=False)
            raise
        finally:
            self._active.discard(seq)
            del self._wants[seq]
            del self._sends[seq]
            if self._aborted:
                self._aborted.pop(seq, None)
            if awaited != len(sends):  # failed, cancelled or timed out: stop and reap every send
                for k in [k for k in self._steps if k[0] == seq]:  # what it still waited for
                    del self._steps[k]
                for k in [k for k in self._waiting if k[0] == seq]:
                    del self._waiting[k]
                for t in sends:
                    if not t.done():
                        t.cancel()
                if sends:
                    await asyncio.gather(*sends, return_exceptions=True)

    # ------------------------------------------------------------------ aborts
    def _missing(self, seq: int) -> str:
        """Who call ``seq`` still waits for, for a timeout's message."""
        srcs = sorted({k[2] for k in self._waiting if k[0] == seq} | {k[2] for k in self._steps if k[0] == seq})
        if not srcs:
            return ""
        who = ", ".join(f"rank {r} ({self.members[r]!r})" for r in srcs)
        return (
            f", waiting for {who}: check that it calls the same collectives in the same order, "
            "on a group with the same members and name"
        )

    def _missing_member(self, seq: int) -> str | None:
        srcs = {k[2] for k in self._waiting if k[0] == seq} | {k[2] for k in self._steps if k[0] == seq}
        return self.members[next(iter(srcs))] if len(srcs) == 1 else None

    def _skip(self, what: str, exc: BaseException) -> None:
        """A call refused its arguments before it took a sequence number: take one all the same
        and tell the peers that call failed here. Arguments that differ between ranks (one rank's
        dtype cannot be compressed, one root's list is short) then fail the call on every rank,
        and every rank's next call gets the same number, instead of peers waiting forever."""
        if self._broken is not None or self._closed:
            return
        seq = self._seq
        self._seq += 1
        self._aborted.pop(seq, None)  # the peers made the same mistake and told this rank first
        self._tell_abort(seq, what, f"{type(exc).__name__}: {exc}", breaks=False)

    def _tell_abort(self, seq: int, what: str, reason: str, *, breaks: bool) -> None:
        """Tell every other member that call ``seq`` failed here (wire.ABORT), without waiting."""
        if self._closed:
            return
        self._tell(range(self.size), [seq, ABORT, self.rank, [what, reason[:2000], breaks]])

    def _tell(self, dsts: Iterable[int], msg: list[Any]) -> None:
        """Send a control message (ABORT, PROBE) to ranks ``dsts`` without waiting."""
        for dst in dsts:
            peer = self.members[dst]
            if dst == self.rank or peer in self.lost:
                continue
            if self._nowait is not None:
                try:
                    self._nowait(peer, self.channel, msg)
                    continue
                except PeerUnavailable:
                    continue  # gone: membership tells the others
                except WouldBlock:
                    pass
            self._telling.spawn(self._send_abort(peer, msg), f"collective message to {peer}")

    async def _send_abort(self, peer: str, msg: list[Any]) -> None:
        try:
            await self._msg.send(peer, self.channel, msg)
        except PeerUnavailable:
            pass

    def _on_abort(self, seq: int, src: Any, payload: Any) -> None:
        """A peer's call ``seq`` failed there: fail this rank's (now, or when it gets there)."""
        if type(payload) is not list or len(payload) != 3 or not 0 <= src < self.size or src == self.rank:
            self.log.warning("malformed collective abort dropped", src=src)
            return
        what, reason, breaks = payload
        peer = self.members[src]
        if breaks:
            if self._broken is None:
                self._break(
                    CollectiveError(
                        f"group {self.name!r}: rank {src} ({peer!r}) broke the group: {what} #{seq} {reason}; "
                        "shrink() on every member to go on",
                        member=peer,
                    )
                )
            return
        if self._closed or seq < self._low_seq() or seq in self._aborted:
            return  # that call ended here (it had all it needed from the peer), or was told already
        if seq >= self._seq and len(self._aborted) >= MAX_ABORTS:
            self.log.warning("too many collective aborts for calls not started: dropped", src=src, seq=seq)
            return
        exc = CollectiveError(
            f"group {self.name!r}: {what} #{seq} failed on rank {src} ({peer!r}): {reason}", member=peer
        )
        self._aborted[seq] = exc
        if seq in self._active:  # else raised when this rank's call seq starts
            self._fail_call(seq, exc)

    def _fail_call(self, seq: int, exc: CollectiveError) -> None:
        """End call ``seq`` (in progress) with ``exc``: what it waits for raises it."""
        for key in [k for k in self._waiting if k[0] == seq]:
            fut = self._waiting.pop(key)
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()
        for key in [k for k in self._steps if k[0] == seq]:
            del self._steps[key]
        run = self._runs.get(seq)
        if run is not None and not run.done.done():
            run.done.set_exception(exc)
            run.done.exception()

    # ------------------------------------------------------------------ signatures
    def _want(self, kind: str, op: str = "", algorithm: str = "", root: int = 0, buckets: int = 1) -> Want:
        """What call of ``kind`` accepts from its peers (wire.signature, wire.call_mask)."""
        sig = signature(kind, op, algorithm, root)
        return call_mask(kind), tuple(sig | tag(b, 0, 0) for b in range(buckets))

    def _mismatched(self, seq: int, t: Tag, src: Any) -> None:
        """A peer's message for call ``seq`` (in progress here) carries another call's signature:
        fail the call here at once and tell every peer (so their call raises too, none waits)."""
        if type(src) is not int or not 0 <= src < self.size or src == self.rank:
            self.log.warning("collective message with a bad source rank dropped", src=src)
            return
        if seq in self._aborted:
            return  # the call failed already (told by a peer, or by an earlier message)
        want = self._wants[seq]
        exc = self._signature_error(seq, want, t, src)
        self._tell_abort(seq, KINDS[want[1][0] >> SIG_SHIFT >> 7], str(exc), breaks=False)
        self._aborted[seq] = exc  # later waits of the call raise it; _call tells no one twice
        self._fail_call(seq, exc)

    def _tick(self) -> None:
        """Every PROBE_AFTER while calls run: a call still running since the last tick asks the
        peers it waits for what they call at its number (:meth:`_on_probe` answers)."""
        self._ticker = None
        if self._closed or self._broken is not None or not self._active:
            self._stalled = set()
            return
        for seq in self._stalled & self._active:
            srcs = {k[2] for k in self._waiting if k[0] == seq} | {k[2] for k in self._steps if k[0] == seq}
            if srcs and seq not in self._aborted:
                self._tell(sorted(srcs), [seq, PROBE, self.rank, self._wants[seq][1][0]])
        self._stalled = set(self._active)
        self._ticker = asyncio.get_running_loop().call_later(PROBE_AFTER, self._tick)

    def _on_probe(self, seq: int, src: Any, t: Any) -> None:
        """A peer's call ``seq`` (signature ``t``) waits for this rank: if this rank's call at that
        number is running and is another call, fail it here and on every peer. Not reached yet:
        the peer asks again at its next tick. Ended: what it sent was checked where it landed."""
        if type(t) is not int or type(src) is not int or not 0 <= src < self.size or src == self.rank:
            self.log.warning("malformed collective probe dropped", src=src)
            return
        want = self._wants.get(seq)
        if want is not None and t & want[0] not in want[1]:
            self._mismatched(seq, t, src)

    def _signature_error(self, seq: int, want: Want, t: Tag, src: int) -> CollectiveError:
        """The error of a call (``want``) whose peer ``src`` sent ``t``, another call's tag, at ``seq``."""
        allowed = want[1]
        mine = next((a for a in allowed if bucket_of(a) == bucket_of(t)), allowed[0])
        theirs, ours = describe(t), describe(mine)
        if theirs == ours:  # the same call, another bucket: the listed arrays' dtypes differ
            theirs += f" with dtype bucket {bucket_of(t)}"
            ours += f" with {len(allowed)} dtype bucket(s)"
        hint = ""
        if (t ^ mine) & ALGORITHM_BITS and (t ^ mine) >> SIG_SHIFT >> 3 == 0:
            hint = " (algorithm='auto' picks by the input's size: check the shapes too)"
        peer = self.members[src]
        return CollectiveError(
            f"group {self.name!r}: rank {src} ({peer!r}) called {theirs} where rank {self.rank} "
            f"({self.members[self.rank]!r}) called {ours} at call #{seq}: call the same collective with the "
            f"same arguments on every rank{hint}",
            member=peer,
        )

    def _post(self, dst: int, seq: int, t: Tag, payload: Any) -> asyncio.Task[None] | None:
        """Send without waiting (large messages wait for the peer's ack: pipelining needs many
        in flight); the call awaits them all before it returns. A small array the link takes at
        once goes without a task (None): it is copied into the message here, so nothing is left
        to await and its buffer may change right after (the latency-bound algorithms' case)."""
        nowait = self._nowait
        if (
            nowait is not None
            and ((type(payload) is np.ndarray and payload.nbytes < self._inline_bytes) or type(payload) is bytes)
            and self._broken is None
        ):
            try:
                nowait(self.members[dst], self.channel, [seq, t, self.rank, payload])
                self._posted.add(dst)
                return None
            except (WouldBlock, PeerUnavailable):
                pass  # the link is busy or not up, or the peer is gone: the task path says so
        # the loop's create_task: ensure_future's type checks cost ~6 Python calls per send,
        # and a ring allreduce posts one per segment
        task = asyncio.get_running_loop().create_task(self._send(dst, seq, t, payload))
        self._sends[seq].append(task)
        return task

    def _flush_posted(self) -> None:
        """Write what this call sent without a task before it returns. Otherwise a call that
        completes without waiting (its peers' messages were already here) leaves its own last
        messages in the loop iteration's batch, and a caller that computes next without yielding
        keeps its peers waiting that long: data-parallel ranks would take turns."""
        posted, self._posted = self._posted, set()
        flush = self._write_out
        if flush is not None:
            members = self.members
            for dst in posted:
                flush(members[dst])

    # ------------------------------------------------------------------ reductions
    async def allreduce(
        self,
        x: Any,
        op: str = "sum",
        *,
        out: Any = None,
        algorithm: str = "auto",
        timeout: float | None = None,
        compression: str | None = None,
    ) -> Any:
        """The reduction of every rank's ``x`` (same shape and dtype everywhere), on every rank.
        A list or tuple of arrays is fused into one message per dtype (tensor fusion) and comes
        back as a list. ``out=``: write the result there (may be ``x`` itself).
        ``compression="fp16"|"bf16"``: float32 travels as 16 bits (error bound in
        aionet.collectives.compression); default ``collectives.compression``. Device (CuPy)
        arrays are reduced through host copies and come back as device arrays."""
        seq0 = self._seq  # argument errors below, before the call takes a number: see _skip
        try:
            if out is not None and not (  # the usual out=: checked inline, no call (check_out's rules)
                type(out) is np.ndarray
                and type(x) is np.ndarray
                and out.size == x.size
                and out.flags.writeable
                and op != "mean"
            ):
                check_out(out, x, op)
            if (
                type(x) is np.ndarray
                and x.nbytes < RAW_MAX
                and algorithm in ("auto", "doubling")
                and (
                    compression in (None, "none")
                    if compression is not None
                    else self.compression in (None, "none") or x.dtype != np.float32  # the default: float32 only
                )
                and x.dtype.kind in "iufc"  # bool counts in int64 for sum, prod, mean (ops.for_op)
                and x.flags.c_contiguous
                and self.size > 1
                and (algorithm == "doubling" or x.nbytes <= self.small_bytes or x.size < self.size)
            ):
                return await self._small_allreduce(x, op, out, timeout)
            hx, back = self._on_host(x, out)
            if out is None and hx is not x and type(hx) is np.ndarray:
                out = hx  # a device input's host copy is ours: reduce into it, no second host array
            res = await self._allreduce(hx, op, out=out, algorithm=algorithm, timeout=timeout, compression=compression)
            return back(res)
        except (TypeError, ValueError) as exc:
            if self._seq == seq0:
                self._skip("allreduce", exc)
            raise

    async def _small_allreduce(
        self, x: np.ndarray, op: str, out: Any, timeout: float | None, kind: str = "allreduce"
    ) -> Any:
        """Recursive doubling driven from the channel callback (:mod:`.small`): what ``auto``
        picks for arrays under RAW_MAX, with one future and one wake-up per call."""
        fn = ufunc(op)
        tags, want = self._small[kind, op]

        async def go(seq: int) -> Any:
            done: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
            plan = self._doubling_plan
            run = DoublingRun(self._post, self._expect, self.rank, seq, x.reshape(-1), fn, plan, tags, done)
            self._runs[seq] = run
            try:
                run.start()
                res = await done
            finally:
                del self._runs[seq]  # a step still registered is dropped by _call (a timeout names its rank)
            if op == "mean":
                res = finish_mean(res, self.size)
            if out is None:
                return res.reshape(x.shape)
            if type(out) is np.ndarray and out.size == res.size and out.flags.c_contiguous and out.flags.writeable:
                np.copyto(out, res.reshape(out.shape), casting="same_kind")  # write_out's rule, fewer checks
                return out
            return write_out(out, res)

        return await self._run(kind, go, timeout, want, x.nbytes)

    async def reduce(
        self, x: Any, root: int = 0, op: str = "sum", *, out: Any = None, timeout: float | None = None
    ) -> Any:
        """The reduction on rank ``root`` (None elsewhere), over a binomial tree."""
        seq0 = self._seq  # argument errors below, before the call takes a number: see _skip
        try:
            if out is not None and self.rank == root:
                check_out(out, x, op)
            hx, back = self._on_host(x, out)
            res = await self._reduce(hx, root, op, out=out, timeout=timeout)
            return back(res)  # None off the root (the host copy is handed back all the same)
        except (TypeError, ValueError) as exc:
            if self._seq == seq0:
                self._skip("reduce", exc)
            raise

    async def reduce_scatter(self, x: Any, op: str = "sum", *, timeout: float | None = None) -> Any:
        """Rank ``r`` gets block ``r`` of the reduction of ``x``: ``x``'s first axis split into
        ``size`` near-equal blocks (as ``numpy.array_split``), reduced around the ring."""
        seq0 = self._seq  # argument errors below, before the call takes a number: see _skip
        try:
            hx, back = self._on_host(x, None)
            return back(await self._reduce_scatter(hx, op, timeout=timeout))
        except (TypeError, ValueError) as exc:
            if self._seq == seq0:
                self._skip("reduce_scatter", exc)
            raise

    def _on_host(self, x: Any, out: Any) -> tuple[Any, Callable[[Any], Any]]:
        """``x`` with device arrays copied to the host, and how to give the result back (device
        results for device inputs, through the node's staging backend). The host copies are
        borrowed (pinned, reused call after call) and handed back once the result is on the
        device; a call that fails keeps them (its sends may still reference them)."""
        dev = self._device
        items = list(x) if isinstance(x, (list, tuple)) else [x]
        on_dev = [dev is not None and not isinstance(i, np.ndarray) and dev.is_device_array(i) for i in items]
        if not any(on_dev):
            return x, _same
        assert dev is not None
        if out is not None:
            raise TypeError("out= takes host arrays: a device input's result comes back as a new device array")
        host = [dev.borrow_host(i) if d else i for i, d in zip(items, on_dev, strict=True)]
        borrowed = [h for h, d in zip(host, on_dev, strict=True) if d]

        def back(res: Any) -> Any:
            if res is None:
                pass
            elif isinstance(x, (list, tuple)):
                res = [dev.to_device(r) if d else r for r, d in zip(res, on_dev, strict=True)]
            else:
                res = dev.to_device(res)
            for h in borrowed:
                dev.give_back(h)
            return res

        if not isinstance(x, (list, tuple)):
            return host[0], back
        return host, back

    async def _allreduce(
        self,
        x: Any,
        op: str = "sum",
        *,
        out: Any = None,
        algorithm: str = "auto",
        timeout: float | None = None,
        compression: str | None = None,
    ) -> Any:
        fn = ufunc(op)
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}")
        comp = self.compression if compression is None else compression
        if isinstance(x, (list, tuple)):
            return await self._allreduce_many(list(x), op, algorithm, timeout, comp)
        c = for_op(to_numpy(x), op)
        if compression is None and c.flat.dtype != np.float32:
            comp = None  # the group's default (collectives.compression) compresses float32 only
        codec = self._codec(comp, c.flat.dtype, algorithm)
        if self._native_eligible(c.flat, op, algorithm, codec):
            algo = "native"  # the native ring, or the ring of the links where the group has none
        elif algorithm == "native":
            raise ValueError(
                "algorithm='native' takes an array of float32, float64, int32 or int64 (sum, mean, prod, min, "
                "max) with at least one element per rank, no compression, and collectives.native_bytes > 0"
            )
        else:
            algo = self._resolve(algorithm, c.flat)
        want = self._want("allreduce", op, algo)

        dest = work_buffer(out, c.flat)

        async def go(seq: int) -> Any:
            if algo == "native":
                res = await self._native_call(seq, c.flat, op, want[1][0], dest)
                if res is None:  # the group has no native ring: the ring of the links, same signature
                    res = await self._ring_allreduce(seq, c.flat, fn, want[1][0], None, dest)
            else:
                res = await self._allreduce_flat(seq, c.flat, fn, algo, want[1][0], codec, dest)
            return await self._finish(seq, c, res, op, out, dest)

        return await self._run("allreduce", go, timeout, want, c.flat.nbytes)

    async def _flush(self, seq: int) -> None:
        """Wait for this call's posted sends: they may not have serialized the buffer yet, so
        it must not be changed in place before (a rank that folds in or a tree child would get
        the changed values)."""
        sends = self._sends.get(seq)
        if sends:
            await await_sends(sends)

    async def _finish(
        self, seq: int, c: Converted, res: np.ndarray, op: str, out: Any, dest: np.ndarray | None = None
    ) -> Any:
        if op == "mean":
            await self._flush(seq)  # divided in place below
            res = finish_mean(res, self.size)
        if out is not None:
            if res is dest:  # the algorithm worked in out itself: nothing to copy
                return out
            # out may be the input itself (the direct exchange never works in place; a tensor's
            # memory is the array's), which sends of this call may not have taken yet: a peer
            # whose result does not wait on them would otherwise receive this rank's result
            await self._flush(seq)
            return write_out(out, res)
        return from_numpy(c, res)

    def _codec(self, compression: str | None, dtype: np.dtype[Any], algorithm: str) -> WireCodec | None:
        codec = wire_codec(compression, dtype)
        if codec is not None and algorithm == "tree":
            raise ValueError("compression works with the ring and recursive doubling, not algorithm='tree'")
        return codec

    async def _allreduce_many(
        self, xs: list[Any], op: str, algorithm: str, timeout: float | None, compression: str | None
    ) -> list[Any]:
        fn = ufunc(op)
        if algorithm == "native":
            raise ValueError("algorithm='native' takes one array, not a list (a list's buckets choose by size)")
        cs = [for_op(to_numpy(x), op) for x in xs]
        # compression applies to the float32 buckets; others travel as they are
        codecs = {c.flat.dtype: self._codec(compression if c.flat.dtype == np.float32 else None, c.flat.dtype,
                                            algorithm) for c in cs}  # fmt: skip
        by_dtype: dict[np.dtype[Any], list[int]] = {}
        for i, c in enumerate(cs):
            by_dtype.setdefault(c.flat.dtype, []).append(i)
        # a bucket of several arrays is a copy of our own (aligned: the kernel receives into it),
        # reduced in place; a bucket of one is the caller's array, reduced into a new one
        fused = [_fuse([cs[i].flat for i in idx]) if len(idx) > 1 else cs[idx[0]].flat
                 for idx in by_dtype.values()]  # fmt: skip
        ours = [len(idx) > 1 for idx in by_dtype.values()]
        # each bucket resolves 'auto' by its own size (a large one takes the native ring, as a
        # single array would): the signature of each is its own
        algos = ["native" if self._native_eligible(f, op, algorithm, codecs[f.dtype]) else self._resolve(algorithm, f)
                 for f in fused]  # fmt: skip
        mask = call_mask("allreduce")
        bases = tuple(signature("allreduce", op, a) | tag(b, 0, 0) for b, a in enumerate(algos))

        async def go(seq: int) -> list[Any]:
            results: list[Any] = [None] * len(cs)
            for bucket, idx in enumerate(by_dtype.values()):
                f, dest = fused[bucket], fused[bucket] if ours[bucket] else None
                if algos[bucket] == "native":
                    res = await self._native_call(seq, f, op, bases[bucket], dest)
                    if res is None:  # the group has no native ring: the ring of the links, same signature
                        res = await self._ring_allreduce(seq, f, fn, bases[bucket], None, dest)
                else:
                    res = await self._allreduce_flat(seq, f, fn, algos[bucket], bases[bucket], codecs[f.dtype], dest)
                start = 0
                for i in idx:
                    n = cs[i].flat.size
                    results[i] = await self._finish(seq, cs[i], res[start : start + n], op, None)
                    start += n
            return results

        want = (mask, bases or (signature("allreduce", op),))  # an empty list: no bucket, no message
        return await self._run("allreduce", go, timeout, want, sum(c.flat.nbytes for c in cs))

    async def _allreduce_flat(
        self,
        seq: int,
        flat: np.ndarray,
        fn: Any,
        algorithm: str,
        base: Tag,
        codec: WireCodec | None = None,
        dest: np.ndarray | None = None,
    ) -> np.ndarray:
        """The reduction of ``flat`` by ``algorithm`` (:meth:`_resolve`'s), every tag OR'd with
        ``base`` (the call's signature and bucket); the ring and the direct exchange build it in
        ``dest`` when given (the caller's ``out=``: no fresh pages to fault in, no copy at the end)."""
        if self.size == 1:
            return flat.copy()
        if algorithm == "ring":
            return await self._ring_allreduce(seq, flat, fn, base, codec, dest)
        if algorithm == "tree":
            red = await self._tree_reduce(seq, flat, fn, 0, base)
            return self._checked(await self._tree_bcast(seq, red, 0, base, phase=3), flat.dtype, flat.size, 0)
        if algorithm == "direct":  # sends its input to every peer while results land: never in place
            return await self._direct(seq, flat, fn, base, codec, None if dest is flat else dest)
        return await self._doubling(seq, flat, fn, base, codec)

    def _resolve(self, algorithm: str, flat: np.ndarray) -> str:
        """The algorithm that runs (``auto`` by size; the ring needs an element per rank): part
        of the call's signature, the same on every rank whose input has the same size."""
        if algorithm == "auto":
            return "doubling" if flat.nbytes <= self.small_bytes or flat.size < self.size else "ring"
        if algorithm == "ring" and flat.size < self.size:
            return "doubling"
        return algorithm

    async def _reduce(
        self, x: Any, root: int = 0, op: str = "sum", *, out: Any = None, timeout: float | None = None
    ) -> Any:
        fn, c = ufunc(op), for_op(to_numpy(x), op)
        self._check_root(root)
        want = self._want("reduce", op, root=root)

        async def go(seq: int) -> Any:
            res = await self._tree_reduce(seq, c.flat, fn, root, want[1][0])
            return None if res is None else await self._finish(seq, c, res, op, out)

        return await self._run("reduce", go, timeout, want, c.flat.nbytes)

    async def _reduce_scatter(self, x: Any, op: str = "sum", *, timeout: float | None = None) -> Any:
        fn, c = ufunc(op), for_op(to_numpy(x), op)
        if not c.shape:
            raise ValueError("reduce_scatter needs an array with at least one axis")
        rows = chunk_bounds(c.shape[0], self.size)
        per_row = c.flat.size // max(1, c.shape[0])
        bounds = [(a * per_row, b * per_row) for a, b in rows]
        # large enough and of a type the native ring takes: over it (the ring of the links where
        # the group has none), under the native signature on every rank alike
        native = self._native_eligible(c.flat, op, "auto", None)
        want = self._want("reduce_scatter", op, "native" if native else "")

        async def go(seq: int) -> Any:
            n, r = self.size, self.rank
            res = None
            if n == 1:
                res = c.flat.copy()
            elif native:
                res = await self._native_reduce_scatter(seq, c.flat, op, want[1][0], bounds)
            if res is None:
                res = await self._ring_reduce_scatter(seq, c.flat, fn, bounds, want[1][0])
            if op == "mean":
                await self._flush(seq)  # divided in place: the ring's last sends may still read it
                res = finish_mean(res, n)
            a, b = rows[r]
            return from_numpy(Converted(res, (b - a, *c.shape[1:]), c.kind, x), res)

        return await self._run("reduce_scatter", go, timeout, want, c.flat.nbytes)

    # ------------------------------------------------------------------ data movement
    async def broadcast(self, x: Any = None, root: int = 0, *, timeout: float | None = None) -> Any:
        """``root``'s ``x`` on every rank (any serializable object), over a binomial tree."""
        seq0 = self._seq  # argument errors below, before the call takes a number: see _skip
        try:
            self._check_root(root)
            nbytes = getattr(x, "nbytes", 0)
            want = self._want("broadcast", root=root)
            base = want[1][0]
            return await self._run("broadcast", lambda seq: self._tree_bcast(seq, x, root, base), timeout, want, nbytes)
        except (TypeError, ValueError) as exc:
            if self._seq == seq0:
                self._skip("broadcast", exc)
            raise

    async def allgather(self, x: Any, *, timeout: float | None = None) -> list[Any]:
        """Every rank's ``x``, in rank order, on every rank (around the ring)."""

        want = self._want("allgather")
        base = want[1][0]

        async def go(seq: int) -> list[Any]:
            n, r = self.size, self.rank
            items: list[Any] = [None] * n
            items[r] = x
            for s, step in enumerate(ring_allgather(n, r, first=r)):
                t = base | tag(0, 9, s)
                self._post((r + 1) % n, seq, t, items[step.send])
                items[step.recv] = await self._recv(seq, t, (r - 1) % n)
            return items

        return await self._run("allgather", go, timeout, want, getattr(x, "nbytes", 0))

    async def gather(self, x: Any, root: int = 0, *, timeout: float | None = None) -> list[Any] | None:
        """Every rank's ``x`` in rank order on ``root`` (None elsewhere)."""
        self._check_root(root, "gather")
        want = self._want("gather", root=root)
        t = want[1][0] | tag(0, 10, 0)

        async def go(seq: int) -> list[Any] | None:
            if self.rank != root:
                self._post(root, seq, t, x)
                return None
            futs = {src: self._recv(seq, t, src) for src in range(self.size) if src != root}
            return [x if src == root else await futs[src] for src in range(self.size)]

        return await self._run("gather", go, timeout, want, getattr(x, "nbytes", 0))

    async def scatter(self, xs: Sequence[Any] | None = None, root: int = 0, *, timeout: float | None = None) -> Any:
        """Rank ``r`` gets ``xs[r]`` from ``root`` (``xs`` only matters on the root)."""
        self._check_root(root, "scatter")
        if self.rank == root and (xs is None or len(xs) != self.size):
            self._refuse("scatter", ValueError(f"scatter needs one item per rank on the root ({self.size})"))
        want = self._want("scatter", root=root)
        t = want[1][0] | tag(0, 11, 0)

        async def go(seq: int) -> Any:
            if self.rank == root:
                assert xs is not None
                for dst in range(self.size):
                    if dst != root:
                        self._post(dst, seq, t, xs[dst])
                return xs[root]
            return await self._recv(seq, t, root)

        return await self._run("scatter", go, timeout, want)

    async def alltoall(self, xs: Sequence[Any], *, timeout: float | None = None) -> list[Any]:
        """Rank ``r`` sends ``xs[d]`` to rank ``d`` and gets everyone's item for ``r``, in rank order."""
        if len(xs) != self.size:
            self._refuse("alltoall", ValueError(f"alltoall needs one item per rank ({self.size})"))
        want = self._want("alltoall")
        t = want[1][0] | tag(0, 12, 0)

        async def go(seq: int) -> list[Any]:
            futs = {src: self._recv(seq, t, src) for src in range(self.size) if src != self.rank}
            for dst in range(self.size):
                if dst != self.rank:
                    self._post(dst, seq, t, xs[dst])
            return [xs[self.rank] if src == self.rank else await futs[src] for src in range(self.size)]

        return await self._run("alltoall", go, timeout, want)

    async def barrier(self, *, timeout: float | None = None) -> None:
        """Returns once every rank has entered it: a small allreduce of a zero under a signature
        of its own (a barrier on one rank and an allreduce on another is a mismatch)."""
        await self._small_allreduce(np.zeros((), np.int64), "sum", None, timeout, "barrier")

    def _check_root(self, root: int, what: str = "") -> None:
        if not 0 <= root < self.size:
            exc = ValueError(f"root must be a rank in [0, {self.size}), not {root!r}")
            if what:
                self._refuse(what, exc)
            raise exc

    def _refuse(self, what: str, exc: Exception) -> NoReturn:
        """Raise ``exc`` for arguments refused before the call took a number (see :meth:`_skip`)."""
        self._skip(what, exc)
        raise exc


def _fuse(parts: list[np.ndarray]) -> np.ndarray:
    """One aligned array holding ``parts`` (flat, one dtype) back to back: a fusion bucket."""
    buf = empty_aligned(sum(p.size for p in parts), parts[0].dtype)
    np.concatenate(parts, out=buf)
    return buf


__all__ = ["ALGORITHMS", "Group"]
