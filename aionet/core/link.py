"""Reliable per-peer link over whatever connection is current.

Every application envelope to a peer gets a sequence number and carries a cumulative ack;
it stays in a bounded replay buffer until acknowledged. When a connection drops, the side
that dialed reconnects (jittered exponential backoff) and, after the resume handshake, the
unacknowledged messages are replayed in order before anything new; the receiver drops
duplicates. A link that stays disconnected for ``give_up_after`` seconds, or whose peer is
declared dead, fails: blocked senders and pending requests get PeerUnavailable.

A death verdict can be wrong (a frozen process that comes back, a healed partition). So the
link keeps its unacknowledged messages and its stream position for ``death_grace`` seconds
after such a failure: a successor link to the same process adopts them and replays them in
order, exactly once. What is finally given up (grace expired, the peer came back as a new
process, or lost our stream) is counted and reported through ``on_undeliverable``, never
dropped silently.

The bookkeeping itself is :class:`aionet.core.link_state.LinkState` (sans-I/O); this module
adds the asyncio side of sending and receiving: waiting for space, batching, size limits and
ack timers. Attaching connections, replay, reconnect, resume and failure are in
:mod:`aionet.core.link_recovery` (a mixin :class:`Link` inherits).
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack

from ..codecs.array_send import ARRAY_PAYLOADS, encode_array_send
from ..codecs.batch import RPC_INLINE_MAX, RPC_INLINE_NAME_MAX, encode_rpc_batch, encode_send_batch
from ..codecs.dtypes import DtypeTable
from ..codecs.envelope import ACK, CANCEL, REP, REQ, SEND, XFER
from ..codecs.framing import frame_nbytes
from ..config import LimitsSection
from ..errors import (
    ConnectionClosed,
    SerializationError,
    WouldBlock,
)
from ..stats import LinkStats
from ..transports.base import Connection
from .link_limits import SIZE_LIMITS, SizeLimits
from .link_recovery import LinkRecovery
from .link_state import LinkState
from .replay_copies import ReplayCopies
from .request_slots import RequestSlots

# Ack at once when this many bytes arrived. A message this big is sent zero-copy and its
# sender waits for the ack (the replay buffer holds the caller's memory), unless it has at
# most copy_max bytes (link.big_copy_max_bytes, default 0; COPY_MAX is the largest worth
# it): then it is copied into link-owned memory and its send returns at once, the copies
# bounded by replay_copies.COPY_BUDGET. Immutable payloads (bytes, read-only arrays) need
# neither: their send returns at once, zero-copy (ReplayCopies.immutable).
BIG_MESSAGE = 1 << 20
# ... unless more is already arriving on the connection (Connection.more_inbound): then its
# sender streams rather than waits for this ack, and one ACK covers up to this many bytes.
# A sender that does wait (a writable big send) sends nothing more meanwhile, so it is acked
# at once; at worst a wait lasts until these bytes or the ack timer (ack_delay).
STREAM_ACK_BYTES = 4 * BIG_MESSAGE
_PLAIN = frozenset({int, float, bool, type(None)})
_PLAIN_MAX = 1024  # bytes/str shorter than this are packed inline by any serializer setting
_FLAT_MAX = 8  # a list payload of up to this many such items is packed inline too
# Small SENDs to one channel within one loop iteration share an envelope (codecs/batch.py):
# payloads of these types are packed at once by the strict packer (any other type, or a
# container holding one, takes the serializer's path as its own envelope, in order)
_BATCHABLE = frozenset({int, float, bool, type(None), list, dict})
_SCALARS = frozenset({int, float, bool, type(None)})
_RPC = frozenset({REQ, REP})  # requests and replies batch too, to a peer that takes them (set_rpc_batch_limit)
BATCH_BYTES = 32 * 1024  # an open batch is sealed once its payloads reach this many bytes ...
BATCH_MESSAGES = 4096  # ... or this many messages (or fewer: what the peer advertises)
# A batch of requests or replies is sealed and written to the socket once it holds this many,
# not at the end of the loop iteration: the peer, in another process, starts on them while
# this side builds the rest. One write per iteration made the two sides take turns (each
# idle about a third of the time with 64 requests in flight); BENCHMARKS.md, "Requests
# pipelined across the two processes".
RPC_PIPELINE = 16


def _flat(items: list[Any]) -> bool:
    """A short list of what packs inline under any serializer setting (scalars, short bytes
    and str: the cache's requests and replies): the link's own packer takes it, skipping the
    serializer's walk, as it takes a plain payload."""
    if len(items) > _FLAT_MAX:
        return False
    for x in items:
        t = type(x)
        if t in _PLAIN or ((t is bytes or t is str) and len(x) < _PLAIN_MAX):
            continue
        return False
    return True


def nbytes_of(frames: list[Any]) -> int:
    n = 0
    for f in frames:
        t = type(f)
        n += f.nbytes if t is memoryview else len(f) if t is bytes or t is bytearray else frame_nbytes(f)
    return n


class Link(LinkRecovery):
    """The reliable channel to one peer (one per peer name and incarnation)."""

    def __init__(
        self,
        peer: str,
        *,
        dumps: Callable[..., list[Any]],
        max_inflight_bytes: int,
        give_up_after: float,
        ack_delay: float = 0.005,
        log: Any,
        redial: Callable[[], Awaitable[None]] | None = None,
        on_dead: Callable[[str, BaseException], None] | None = None,
        limits: LimitsSection | None = None,
        dumps_sized: Callable[..., tuple[list[Any], int, int]] | None = None,
        death_grace: float = 0.0,
        on_undeliverable: Callable[[str, int, str], None] | None = None,
        copy_max: int = 0,
        dtypes: DtypeTable | None = None,
        oob_min: int = 0,
    ):
        self.peer = peer
        lim = limits or LimitsSection()
        self._limits = SizeLimits({k: int(getattr(lim, k)) for k in SIZE_LIMITS}, peer)
        # single-frame messages up to _size_ok pass every limit (one compare on the hot path)
        self._size_ok, self._max_frames = self._limits.size_ok, self._limits.max_frames
        self.dumps = dumps
        self._dumps_sized = dumps_sized  # with compression: limits count inflated bytes
        self._pack = msgpack.Packer(use_bin_type=True, strict_types=True, datetime=False).pack
        # SENDs of [*key, array] (a ring segment) are packed here, as the serializer would
        # (codecs/array_send.py): its dtype table and out-of-band threshold; None: never
        self._dtypes = dtypes
        self._oob_min = max(1, oob_min)
        self.state = LinkState(max_inflight_bytes)
        self.tx_id = uuid.uuid4().hex[:16]  # our outgoing stream toward this peer
        self.rx_id = ""  # the peer's outgoing stream toward us, as last seen
        self.peer_node_id = ""
        self.compress = False
        self.conns: list[Any] = []  # live handshaken connections (node's _Conn objects)
        self.current: Any = None  # the one we send on
        self.dialer = False  # we dialed: we are the one who reconnects
        self.dead: BaseException | None = None
        self.left = False
        self.give_up_after = give_up_after
        self.ack_delay = ack_delay
        self.log = log
        self._redial = redial
        self._on_dead = on_dead
        self._space = asyncio.Event()
        self._space.set()
        self._ack_waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._copies = ReplayCopies()  # big messages' buffers, owned while unacknowledged
        self._copy_max = copy_max  # big messages up to this size are copied (0: none)
        self._replaying = False
        self._ack_timer: asyncio.TimerHandle | None = None
        self._shares_frames = False  # a connection hands the peer our frame objects (inproc://)
        self._ack_armed_seq = 0  # recv_seq when the ack timer was armed
        self._reconnect_task: asyncio.Task[None] | None = None
        self._switch_task: asyncio.Task[None] | None = None
        self._bytes_owed = 0
        self.sent_bytes = 0  # sequenced payload bytes posted / delivered (for metrics)
        self.recv_bytes = 0
        self.replayed = 0  # messages written again after a reconnect
        self.acks_sent = 0  # standalone ACK frames (for stats)
        # the peer's handshake feature "cancel": it cancels a handler when told that its
        # caller gave up (CANCEL); a peer without it is not sent one
        self.peer_cancels = False
        # this node's unanswered requests to the peer, held to the window it advertises
        self.requests = RequestSlots()
        # services the peer answers inline (handshake "rpc_inline"): requests to them take no slot
        self.inline_services: frozenset[str] = frozenset()
        self.peer_takes_inline = False  # its HELLO had "rpc_inline": it reads INLINE updates
        self._waiting_senders = 0
        self.disconnected_since: float | None = None
        self._stuck_seq = 0  # oldest unacked seq when the last connection was lost ...
        self._stuck_count = 0  # ... and how many quick losses in a row it has stayed the oldest
        self._attached_at = 0.0  # when the current connection became current
        self.death_grace = death_grace
        self._on_undeliverable = on_undeliverable
        self.undeliverable = 0  # messages this link gave up on (each reported)
        self._grace_timer: asyncio.TimerHandle | None = None  # set while dead, keeping its stream
        # the open batch of SENDs (push): one channel, payloads packed, sealed into one
        # envelope at the end of this loop iteration, when full, or before any other envelope
        self.batching = False  # the peer accepts SEND envelopes with many payloads (handshake)
        self._bch: Any = None
        self._bitems: list[bytes] = []
        self._bbytes = 0
        self._bcap = BATCH_BYTES
        self._bmax = 1  # payloads per envelope (set_batch_limit)
        # requests / replies per REQ / REP envelope (set_rpc_batch_limit; 0: one each). The open
        # batch then holds packed requests or replies and _bch is REQ or REP (an int, so never
        # equal to a channel name)
        self._rpc_max = 0
        self._rep_max = 0
        self._seal_scheduled = False
        # set while nothing more may be pushed without waiting: the transport's future (above its
        # high-water mark) or an ack waiter (a big message sent with send_nowait)
        self._blocked: asyncio.Future[None] | None = None

    def _dead_error(self) -> BaseException:
        """Why the link failed, as a fresh exception for one caller. Raising the one ``dead``
        instance in every waiter would append each caller's frames to its single traceback:
        a user would read the frames of every other blocked call, and all those frames (and
        what they hold) would stay alive as long as the dead link does."""
        return copy.copy(self.dead)  # a copy has the type and message, no traceback

    # ------------------------------------------------------------------ sending
    async def send(self, kind: int, fields: list[Any]) -> None:
        """Send a sequenced envelope. Returns when the transport took it; the caller may reuse
        its buffers then (a big message's are copied, up to ``copy_max`` bytes, or the peer
        has acknowledged it). Never raises for a dropped connection: the message is replayed later."""
        aw = self.post(kind, fields)
        if aw is not None:
            await aw

    def post(self, kind: int, fields: list[Any], wait_ack: bool = True) -> Awaitable[None] | None:
        """Like :meth:`send` but synchronous when nothing needs waiting: the message's place
        in the stream is fixed by this call; returns an awaitable to await otherwise."""
        if self.dead is not None:
            raise self._dead_error()
        st = self.state
        if self._waiting_senders or st.inflight_bytes >= st.max_inflight_bytes or self._blocked is not None:
            self._waiting_senders += 1
            return self._send_when_space(kind, fields, wait_ack)
        if kind in _RPC:
            if self._rpc_max and (
                self._bitems or (c := self.current) is None or getattr(c.conn, "flush_pending", None) is not False
            ):
                # something else goes out in this loop iteration (or may: no connection now, or
                # one that cannot tell): join (or open) a batch
                if self._push_rpc(kind, fields):
                    return None
            elif not self._bitems:
                # a lone request or reply (or no batching), nothing pushed before it
                payload = fields[-1]
                t = type(payload)
                if ((t is bytes or t is str) and len(payload) < _PLAIN_MAX) or t in _PLAIN:
                    return self._post_small(kind, fields, wait_ack)
        return self._post_now(kind, fields, wait_ack)

    def _post_small(self, kind: int, fields: list[Any], wait_ack: bool) -> Awaitable[None] | None:
        """:meth:`_post_now` of an envelope whose payload packs inline (a scalar, short bytes
        or str) with no open batch: the request/reply round trip's path. What :meth:`_enqueue`
        does for it, without the checks that only bigger or structured messages need (those,
        and anything over the size limits, go through :meth:`_enqueue` after all)."""
        st = self.state
        owed = st.ack_owed
        seq, ack = st.stamp()
        try:
            frame = self._pack([kind, seq, ack, *fields])
            nbytes = len(frame)
        except (TypeError, ValueError, OverflowError):  # e.g. an int beyond 64 bits: _enqueue decides
            nbytes = BIG_MESSAGE
        if nbytes > self._size_ok or nbytes >= BIG_MESSAGE:
            st.next_seq -= 1  # nothing awaited since stamp(): nobody else took a number
            st.ack_owed = owed  # nothing went out, so no ack was piggybacked either
            return self._post_now(kind, fields, wait_ack)
        self._bytes_owed = 0  # the ack rides on this envelope (see _seal)
        frames = [frame]
        st.record(seq, frames, nbytes)
        self.sent_bytes += nbytes
        c = self.current
        if c is not None and not self._replaying:
            try:
                w = c.conn.write_nowait(frames)
            except ConnectionClosed:
                self.connection_lost(c)
                return None
            if w is not None:
                return self._finish(w, c, 0)
        return None

    def can_post(self) -> bool:
        """Whether :meth:`post` would take a message now without waiting for window space."""
        st = self.state
        return not self._waiting_senders and self._blocked is None and st.inflight_bytes < st.max_inflight_bytes

    # ------------------------------------------------------------------ batched SENDs
    def push(self, channel: str, obj: Any) -> bool:
        """Add a SEND to the open batch when nothing needs waiting and ``obj`` packs inline;
        False (nothing done) otherwise: then :meth:`post` takes it, after sealing the batch,
        so the stream order is the call order either way."""
        # (senders waiting for space do not stop it: each waits for the one thing that blocked
        # it, then goes, so a stream of pushes cannot starve it; and ordering between two
        # concurrent senders was never promised)
        if self.dead is not None or not self.batching:
            return False
        if (b := self._blocked) is not None:
            if not b.done():
                return False
            self._blocked = None
        st = self.state
        if st.inflight_bytes + self._bbytes >= st.max_inflight_bytes:
            return False
        t = type(obj)
        if t is bytes or t is str:
            if len(obj) >= _PLAIN_MAX:
                return False
        elif t not in _BATCHABLE:
            return False
        try:
            b = self._pack(obj)
        except (TypeError, ValueError, OverflowError):  # not plain msgpack: the serializer's job
            return False
        n = len(b)
        if channel != self._bch or self._bbytes + n > self._bcap:
            if n > self._bcap or type(channel) is not str:
                return False
            if self._bitems:
                self._seal()
            self._bch = channel
        items = self._bitems
        items.append(b)
        self._bbytes += n
        if len(items) == 1 and not self._seal_scheduled:
            self._seal_scheduled = True
            asyncio.get_running_loop().call_soon(self._seal_soon)
        elif len(items) >= self._bmax:
            self._seal()
        return True

    def set_batch_limit(self, limit: Any) -> None:
        """The peer's handshake feature ``"batch"``: how many payloads one SEND envelope may
        carry (what one of its mailboxes holds, so a batch never overfills one); batching is
        off for a peer that does not advertise it."""
        ok = type(limit) is int and limit > 1
        self.batching = ok
        self._bmax = min(BATCH_MESSAGES, limit) if ok else 1

    def set_rpc_batch_limit(self, limit: Any, waits: Any = None) -> None:
        """The peer's handshake feature ``"rpc_batch"``: how many requests one REQ envelope
        may carry (its ``max_concurrent_requests``: more could not start at once anyway); it
        then takes REP envelopes with many replies too. Off for a peer without it. With
        ``"rpc_wait"`` (``waits``: how many more requests it lets wait for a handler slot
        without stopping to read), their sum is how many of our requests may be unanswered at
        once (:attr:`requests`); without it (an older peer), ``limit`` alone. This side puts at
        most :data:`RPC_PIPELINE` in one envelope either way."""
        ok = type(limit) is int and limit > 1
        self._rpc_max = min(limit, RPC_PIPELINE) if ok else 0
        self._rep_max = RPC_PIPELINE if ok else 0
        extra = waits if type(waits) is int and waits > 0 and type(limit) is int else 0
        self.requests.set_bound(limit + extra if extra else limit)

    def set_inline_services(self, names: Any) -> None:
        """The peer's handshake feature ``"rpc_inline"``, or its later INLINE_SERVICES update:
        the services it answers inline on its reader (plain ``def`` handlers), which never hold
        one of its handler slots, so our requests to them are not counted against
        :attr:`requests`. Anything malformed, or past the advertised bounds, is ignored (such
        requests are counted: always safe). A service turned ``async def`` before we hear of
        it can, meanwhile, fill the peer's waiting room (it then stops reading from us, the
        behaviour before the window)."""
        ok: set[str] = set()
        if type(names) is list:
            for n in names[:RPC_INLINE_MAX]:
                if type(n) is str and len(n) <= RPC_INLINE_NAME_MAX:
                    ok.add(n)
        self.inline_services = frozenset(ok)

    def _push_rpc(self, kind: int, fields: list[Any]) -> bool:
        """Add a request ``[rid, service, payload]`` or reply ``[rid, payload]`` that packs
        inline to the open batch (sealed into one REQ / REP envelope at the end of this loop
        iteration, before any other envelope, or once it holds :data:`RPC_PIPELINE`: then
        written to the socket at once); False (nothing done) otherwise.
        The caller (:meth:`post`) has checked that nothing needs waiting, and that this is not
        a lone message (those go alone, as they would unbatched, so a lone request waits for
        no seal; what follows one in the same loop iteration joins a batch, written right after it)."""
        items = self._bitems
        payload = fields[-1]
        t = type(payload)
        if t is bytes or t is str:
            if len(payload) >= _PLAIN_MAX:
                return False
        elif t not in _BATCHABLE:
            return False
        st = self.state
        if st.inflight_bytes + self._bbytes >= st.max_inflight_bytes:
            return False
        try:
            b = self._pack(fields)
        except (TypeError, ValueError, OverflowError):  # not plain msgpack: the serializer's job
            return False
        n = len(b)
        if kind != self._bch or self._bbytes + n > self._bcap:
            if n > self._bcap:
                return False
            if items:
                self._seal()
                items = self._bitems
            self._bch = kind
        items.append(b[1:])  # the fields without the list's header (a fixarray: one byte)
        self._bbytes += n
        if len(items) == 1:
            if not self._seal_scheduled:
                self._seal_scheduled = True
                asyncio.get_running_loop().call_soon(self._seal_soon)
        elif len(items) >= (self._rpc_max if kind == REQ else self._rep_max):
            self._seal(now=True)  # the peer starts on these while we build the next (RPC_PIPELINE)
        return True

    def push_many(self, channel: str, objs: list[Any], start: int = 0) -> int:
        """:meth:`push` each of ``objs[start:]`` in order; returns the index of the first one
        not taken (``len(objs)`` when all were)."""
        push = self.push
        pack = self._pack
        i = start
        n = len(objs)
        while i < n:
            if not push(channel, objs[i]):  # checks what may stop a batch, opens or seals one
                return i
            i += 1
            # then, until this batch is full, only what push does per message
            st = self.state
            items = self._bitems
            room = min(self._bcap - self._bbytes, st.max_inflight_bytes - st.inflight_bytes - self._bbytes)
            left = self._bmax - len(items)
            added = 0
            while i < n and left > 0:
                obj = objs[i]
                t = type(obj)
                if t is bytes or t is str:
                    if len(obj) >= _PLAIN_MAX:
                        break
                elif t not in _SCALARS:
                    break  # containers and the rest: push decides
                try:
                    b = pack(obj)
                except OverflowError:  # an int beyond 64 bits
                    break
                m = len(b)
                if m > room:
                    break
                items.append(b)
                room -= m
                added += m
                left -= 1
                i += 1
            self._bbytes += added
            if left <= 0:
                self._seal()
        return i

    def post_nowait(self, kind: int, fields: list[Any]) -> None:
        """:meth:`post` that never waits: raises :class:`WouldBlock` (nothing sent) when the
        window is full or the transport is above its high-water mark. A message that leaves
        something to wait for (a big one, until acknowledged; the transport's buffer) blocks
        the next ones until :meth:`wait_space` has seen it done."""
        if self.dead is not None:
            raise self._dead_error()
        st = self.state
        b = self._blocked
        if b is not None and b.done():
            b = self._blocked = None
        if self._waiting_senders or b is not None or st.inflight_bytes + self._bbytes >= st.max_inflight_bytes:
            raise WouldBlock(f"link to {self.peer!r} is full; await node.wait_space({self.peer!r}) and send again")
        w, c, seq = self._enqueue(kind, fields)
        if seq:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._add_ack_waiter(seq, fut)
            self._blocked = fut
        elif w is not None:
            self._blocked = self._hold(w, c)

    def post_cancel(self, rid: Any) -> None:
        """Tell the peer that our request ``rid``, already posted, was given up (CANCEL), even
        when the window is full: a cancel is a few bytes, one at most per request that held a
        slot of :attr:`requests` (so bounded), and it frees work on the peer. It goes behind
        its request, as every sequenced message does."""
        if self.dead is not None:
            return
        self._enqueue(CANCEL, [rid])  # what the transport may ask to wait for: nobody waits

    async def wait_space(self) -> None:
        """Until :meth:`push` / :meth:`post_nowait` may take a message: what blocked the link
        is done and the window has room (the caller then tries again, and waits again if
        others took the room first). Raises the link's failure if it dies meanwhile."""
        if self._bitems:
            self._seal()  # what is pushed counts against the window from now on
        await self._unblock()
        self._waiting_senders += 1
        try:
            await self._wait_space()
        finally:
            self._waiting_senders -= 1
        if self._waiting_senders:
            await asyncio.sleep(0)  # senders queued before us were woken too: they go first

    async def _unblock(self) -> None:
        """Wait for what blocks the link now (if anything); each caller waits for one such
        thing, so a stream of new ones cannot starve it."""
        b = self._blocked
        if b is None:
            return
        if not b.done():
            await asyncio.wait((b,))  # never cancels ``b`` (others may wait on it too)
        if self._blocked is b:
            self._blocked = None
        if self.dead is not None and not b.cancelled() and b.exception() is not None:
            raise self._dead_error()

    def flush_now(self) -> None:
        """Write what this loop iteration queued for the peer now, not when the iteration ends:
        for a caller about to run a while without yielding (a collective that returns at once
        must not hold its last message back from the peers waiting for it)."""
        if self._bitems:
            self._seal(now=True)  # as _seal_soon would (which then finds nothing)
            return
        c = self.current
        if c is not None:
            flush = getattr(c.conn, "flush_now", None)
            if flush is not None:
                flush()

    def _seal_soon(self) -> None:
        self._seal_scheduled = False
        if self._bitems:
            # requests and replies wait on their peer: written now (where the transport can)
            # rather than one loop iteration later, when its own flush would run
            self._seal(now=self._bch in _RPC)

    def _seal(self, write: bool = True, now: bool = False) -> None:
        """Turn the open batch into one sequenced envelope: recorded for replay, written
        (unless ``write`` is False: a stream about to be given up; ``now``: to the socket
        at once, not at the transport's next flush, where it can)."""
        items = self._bitems
        self._bitems = []
        nb = self._bbytes
        self._bbytes = 0
        st = self.state
        seq, ack = st.stamp()
        kind = self._bch
        if type(kind) is int:  # requests or replies
            frame = encode_rpc_batch(self._pack, kind, seq, ack, items)
            self._bch = None
        else:
            frame = encode_send_batch(self._pack, seq, ack, kind, items)
        nbytes = len(frame)
        # the ack rides on this envelope; an armed ack timer is left to find nothing owed
        # (cancelling and re-arming one per request cost as much as a loop iteration)
        self._bytes_owed = 0
        st.record(seq, [frame], nbytes)
        self.sent_bytes += nb
        c = self.current
        if c is not None and write and not self._replaying:
            try:
                w = ((now and getattr(c.conn, "write_now", None)) or c.conn.write_nowait)([frame])
            except ConnectionClosed:
                self.connection_lost(c)
            else:
                if w is not None:
                    self._blocked = self._hold(w, c)

    def _hold(self, w: Awaitable[None], c: Any) -> asyncio.Future[None]:
        """A future for the transport's ``w`` that :meth:`wait_space` and :meth:`post` wait on."""
        fut = w if isinstance(w, asyncio.Future) else asyncio.ensure_future(self._finish(w, c, 0))
        fut.add_done_callback(_consume)
        return fut

    # ------------------------------------------------------------------ one envelope each
    def _post_now(self, kind: int, fields: list[Any], wait_ack: bool = True) -> Awaitable[None] | None:
        w, c, seq = self._enqueue(kind, fields, wait_ack)
        if seq and wait_ack:
            return self._finish(w, c, seq)
        if w is not None:
            return self._finish(w, c, 0)
        return None

    def _enqueue(self, kind: int, fields: list[Any], wait_ack: bool = True) -> tuple[Awaitable[None] | None, Any, int]:
        """Stamp, encode, record and write one envelope. Returns what to wait for: the
        transport's awaitable (or None), the connection, and a seq whose ack the sender
        must wait for, else 0: a big message's own (above copy_max, sent zero-copy, unless
        every out-of-band buffer is immutable: then nothing can change under the replay), or an
        older one's when the copies of unacknowledged big messages exceed their budget.
        ``wait_ack`` False: the caller keeps its buffers unchanged until the ack by itself
        (replies, staged chunks): sent zero-copy, nothing to wait for."""
        if self._bitems:
            self._seal()  # what was pushed before goes first
        st = self.state
        owed = st.ack_owed
        seq, ack = st.stamp()
        payload = fields[-1] if fields else None
        t = type(payload)
        extra = raw_max = 0
        mutable = None  # whether the out-of-band frames may change, where already known
        try:
            if (
                t in _PLAIN
                or ((t is bytes or t is str) and len(payload) < _PLAIN_MAX)
                or (t is list and _flat(payload))
            ):
                # every envelope field but the payload is an int or str: no walk needed
                try:
                    frames = [self._pack([kind, seq, ack, *fields])]
                except OverflowError:  # an int beyond 64 bits: the serializer has an ext for it
                    frames = self.dumps([kind, seq, ack, *fields], compress=self.compress)
            elif self.compress and self._dumps_sized is not None:
                # the receiver checks its limits on inflated sizes: so must we
                frames, extra, raw_max = self._dumps_sized([kind, seq, ack, *fields], compress=True)
            elif (
                t in ARRAY_PAYLOADS
                and kind == SEND
                and self._dtypes is not None
                and not self.compress
                and (f := encode_array_send(self._pack, seq, ack, fields[0], payload, self._dtypes, self._oob_min))
                is not None
            ):
                frames = f  # [*key, array] (a ring segment) or an array: the serializer's bytes, packed here
                mutable = not f[1].readonly  # (a memoryview of the array: read-only when it is)
            else:
                frames = self.dumps([kind, seq, ack, *fields], compress=self.compress)
            nframes = len(frames)
            if nframes == 1:
                nbytes = len(frames[0])
            elif mutable is None:
                nbytes = nbytes_of(frames)
            else:  # the short road's header and array view
                nbytes = len(frames[0]) + frames[1].nbytes
            if nbytes + extra > self._size_ok or nframes > self._max_frames or raw_max > self._size_ok:
                # before the message takes its place in the stream: one that can never be
                # delivered fails its own send, and nothing else (no replay of it, no gap)
                self._limits.check(frames, nbytes + extra, raw_max)
        except BaseException:
            st.next_seq -= 1  # nothing awaited since stamp(): nobody else took a number
            st.ack_owed = owed  # nothing went out, so no ack was piggybacked either
            raise
        wait_seq = 0
        if nbytes >= BIG_MESSAGE and wait_ack:
            if self._shares_frames:
                # the peer receives these very objects: after the ack the caller may change its
                # buffers, so the peer must get copies of the writable ones (and need not be waited for)
                frames = self._copies.freeze(frames)
            elif nbytes <= self._copy_max:
                frames = self._copies.copy(frames)  # the caller may reuse its buffers at once
                wait_seq = self._copies.sent(seq, nbytes)
            elif mutable if mutable is not None else not ReplayCopies.immutable(frames):
                wait_seq = seq  # zero-copy: the replay buffer holds the caller's memory until acked
            # else: immutable buffers (bytes, read-only arrays) cannot change under the replay
            # buffer, so the send returns without its ack; the window still bounds what is unacked
        elif nframes > 1 and kind != XFER:
            # returns before the ack (a smaller send, a reply): a replay after a cut must carry
            # the bytes of the call, not what the caller wrote into its buffer since
            frames = self._copies.freeze(frames)
        self._bytes_owed = 0  # the ack rides on this envelope (see _seal)
        st.record(seq, frames, nbytes)
        self.sent_bytes += nbytes
        c = self.current
        w = None
        if c is not None and not self._replaying:
            try:
                w = c.conn.write_nowait(frames)
            except ConnectionClosed:
                self.connection_lost(c)
        return w, c, wait_seq

    # ------------------------------------------------------------------ size limits
    def set_peer_limits(self, limits: Any) -> None:
        """The peer's advertised [limits] (handshake feature "limits"); malformed values are ignored."""
        self._limits.set_peer(limits)
        self._size_ok, self._max_frames = self._limits.size_ok, self._limits.max_frames

    async def _finish(self, w: Awaitable[None] | None, c: Any, seq: int) -> None:
        if w is not None:
            try:
                await w
            except ConnectionClosed:
                self.connection_lost(c)
        if seq:
            await self.wait_acked(seq)

    async def _send_when_space(self, kind: int, fields: list[Any], wait_ack: bool) -> None:
        try:
            await self._unblock()  # the transport first; then the window, with no await before posting
            await self._wait_space()
        finally:
            self._waiting_senders -= 1
        if kind == SEND and len(fields) == 2 and self.push(fields[0], fields[1]):
            return  # batched after all: a wait must not turn a stream into one envelope each
        aw = self._post_now(kind, fields, wait_ack)
        if aw is not None:
            await aw

    async def _wait_space(self) -> None:
        st = self.state
        while st.inflight_bytes >= st.max_inflight_bytes:
            if self.dead is not None:
                raise self._dead_error()
            self._space.clear()
            await self._space.wait()
        if self.dead is not None:
            raise self._dead_error()

    async def wait_acked(self, seq: int) -> None:
        if self.state.acked >= seq:
            return
        if self.dead is not None:
            raise self._dead_error()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._add_ack_waiter(seq, fut)
        await fut

    def _add_ack_waiter(self, seq: int, fut: asyncio.Future[None]) -> None:
        """Keep the waiters ordered by seq (on_ack resolves them from the front): a sender
        waiting for an older message's ack (the copy budget) may come after one waiting for
        its own, newer one."""
        waiters = self._ack_waiters
        i = len(waiters)
        while i and waiters[i - 1][0] > seq:
            i -= 1
        waiters.insert(i, (seq, fut))

    def send_control(self, frames: list[Any]) -> None:
        """Unsequenced, best-effort (acks): sent on the current connection if any."""
        c = self.current
        if c is not None:
            try:
                c.conn.send_nowait(frames)
            except ConnectionClosed:
                pass

    # ------------------------------------------------------------------ receiving
    def on_ack(self, ack: int) -> None:
        st = self.state
        if ack <= st.acked:
            return
        if ack >= st.next_seq:
            # an ack for a stream we have since reset (both sides dialed at once): stale
            self.log.debug("ignoring ack beyond what was sent", peer=self.peer, ack=ack, sent=st.next_seq - 1)
            return
        st.on_ack(ack)
        if self._copies.inflight:
            self._copies.acked(ack)
        # only a waiting sender waits on _space (and it re-checks the window before it waits)
        if self._waiting_senders and st.inflight_bytes < st.max_inflight_bytes:
            self._space.set()
        waiters = self._ack_waiters
        while waiters and waiters[0][0] <= ack:
            fut = waiters.popleft()[1]
            if not fut.done():
                fut.set_result(None)

    def received(self, nbytes: int) -> None:
        """After delivering a batch: ack now if much arrived (a big message: unless more is
        already arriving, up to STREAM_ACK_BYTES), else within ack_delay (by the timer already
        armed, if any: it may fire sooner) or, for what arrived after a send carried an ack,
        within twice that (:meth:`_ack_due`)."""
        st = self.state
        if st.ack_owed == 0:
            return
        owed = self._bytes_owed = self._bytes_owed + nbytes
        if owed >= BIG_MESSAGE or st.ack_owed >= st.ack_every:  # (st.should_ack(), inlined)
            if owed >= STREAM_ACK_BYTES or st.ack_owed >= st.ack_every or not self._more_inbound():
                self.flush_ack()
                return
        if self._ack_timer is None:
            self._ack_armed_seq = self.state.recv_seq
            self._ack_timer = asyncio.get_running_loop().call_later(self.ack_delay, self._ack_due)

    def _more_inbound(self) -> bool:
        """Whether bytes of a further message already wait on the current connection: the
        peer keeps streaming (a big send that waits for its ack sends nothing more), so one
        ACK can cover several big messages (measured: an ACK written and read per 1 MiB cost
        both sides a wake-up, a syscall and a parse)."""
        c = self.current
        more = getattr(c.conn, "more_inbound", None) if c is not None else None  # test doubles: absent
        return more is not None and more()

    def _ack_due(self) -> None:
        """The ack timer. When every message still owed arrived after it was armed (a send
        piggybacked the ack of the older ones meanwhile: traffic both ways, as requests and
        replies or a collective's rounds), they get a timer of their own instead of a
        standalone ACK now: a write here, and a wake-up, a read and a parse at the peer, fewer
        per ack_delay on a busy two-way link."""
        self._ack_timer = None
        st = self.state
        if st.ack_owed and st.recv_seq - st.ack_owed >= self._ack_armed_seq and self.current is not None:
            self._ack_armed_seq = st.recv_seq
            self._ack_timer = asyncio.get_running_loop().call_later(self.ack_delay, self._ack_due)
            return
        self.flush_ack()

    def flush_ack(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        self._bytes_owed = 0
        if self.state.ack_owed and self.current is not None:
            self.acks_sent += 1
            # two ints: the link's own packer makes the serializer's bytes without its walk (a ring
            # allreduce acknowledges about one segment in each such frame)
            self.send_control([self._pack([ACK, self.state.acked_now()])])

    def stats(self) -> LinkStats:
        st = self.state
        return LinkStats(
            connected=self.current is not None,
            dead=str(self.dead) if self.dead else None,
            inflight_bytes=st.inflight_bytes,
            unacked_messages=len(st.unacked),
            next_seq=st.next_seq,
            acked=st.acked,
            recv_seq=st.recv_seq,
            undeliverable=self.undeliverable,
            sent_bytes=self.sent_bytes,
            recv_bytes=self.recv_bytes,
            replayed=self.replayed,
            acks_sent=self.acks_sent,
            requests_out=self.requests.out,
            requests_waiting=self.requests.waiting,
        )


def _consume(fut: asyncio.Future[Any]) -> None:
    """Mark a future's exception retrieved (what it means is read from the link's state)."""
    if not fut.cancelled():
        fut.exception()


async def close_conn(conn: Connection) -> None:
    try:
        await asyncio.wait_for(conn.close(), 2.0)
    except Exception:
        conn.abort()


__all__ = ["BIG_MESSAGE", "Link", "SerializationError", "nbytes_of"]
