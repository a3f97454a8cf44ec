"""How a :class:`~aionet.core.link.Link` survives its connections: attaching one and replaying
what is unacknowledged, reconnecting when the last one drops, reconciling streams with the
peer's resume info, and failing (or keeping its stream for a successor within ``death_grace``).

None of this runs per message; it is a mixin so that :class:`Link` (which inherits it) keeps
one ``self`` and the send/receive paths in ``link.py`` stay free of any delegation.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import ConnectionClosed, PeerUnavailable, ProtocolError
from .link_state import LinkState, plan_resume
from .replay_copies import ReplayCopies
from .request_slots import RequestSlots

# The peer dropped this many connections in a row, each soon after it was attached, while
# the same message was the oldest one it had not acknowledged: it rejects that message (a
# limit we could not check), and replaying it forever would wedge the link. Fail the link
# instead (reported, bounded). "Soon": within REJECT_WINDOW s (+ the message's transfer time
# at REJECT_RATE bytes/s), so a consumer that stalls while connections drop now and then (a
# middlebox's timeout) is not mistaken for a rejection.
MAX_REPLAY_FAILURES = 6
REJECT_WINDOW = 5.0
REJECT_RATE = 50e6


class LinkRecovery:
    """Connection lifecycle of a :class:`~aionet.core.link.Link` (mixin: uses the Link's state).

    The annotations below are the Link's attributes and methods this mixin uses; ``Link``
    (its ``__init__`` and methods) sets them."""

    peer: str
    state: LinkState
    tx_id: str
    rx_id: str
    peer_node_id: str
    compress: bool
    conns: list[Any]
    current: Any
    dialer: bool
    dead: BaseException | None
    left: bool
    give_up_after: float
    death_grace: float
    log: Any
    replayed: int
    undeliverable: int
    disconnected_since: float | None
    _redial: Callable[[], Awaitable[None]] | None
    _on_dead: Callable[[str, BaseException], None] | None
    _on_undeliverable: Callable[[str, int, str], None] | None
    _space: asyncio.Event
    requests: RequestSlots
    _ack_waiters: deque[tuple[int, asyncio.Future[None]]]
    _copies: ReplayCopies
    _replaying: bool
    _ack_timer: asyncio.TimerHandle | None
    _shares_frames: bool
    _reconnect_task: asyncio.Task[None] | None
    _switch_task: asyncio.Task[None] | None
    _stuck_seq: int
    _stuck_count: int
    _attached_at: float
    _grace_timer: asyncio.TimerHandle | None
    _bitems: list[bytes]
    _blocked: asyncio.Future[None] | None
    _seal: Callable[..., None]
    flush_ack: Callable[[], None]
    on_ack: Callable[[int], None]

    # ------------------------------------------------------------------ connections
    def resume_info(self) -> dict[str, Any]:
        """What the handshake tells the peer about this link (for trimming and resets)."""
        return {"tx": self.tx_id, "rx": self.rx_id, "recv": self.state.recv_seq, "acked": self.state.acked}

    def apply_resume(self, info: dict[str, Any] | None, peer_node_id: str) -> list[str]:
        """Reconcile with the peer's view from its handshake (rules: :func:`plan_resume`);
        returns notes for the log."""
        st = self.state
        plan = plan_resume(
            info,
            peer_node_id,
            known_node_id=self.peer_node_id,
            tx_id=self.tx_id,
            rx_id=self.rx_id,
            acked=st.acked,
            next_seq=st.next_seq,
        )
        if plan.restart_tx:
            self._reset_tx(PeerUnavailable(f"{self.peer}: {plan.restart_tx}"))
        if plan.reset_rx:
            self._reset_rx()
        if plan.rx_id is not None:
            self.rx_id = plan.rx_id
        self.peer_node_id = plan.peer_node_id
        if plan.ack is not None:
            self.on_ack(plan.ack)
        return list(plan.notes)

    def inherit_rx(self, old: LinkRecovery) -> None:
        """Continue receiving the peer's stream where a failed link to it stopped.

        Without this, a peer that was declared dead but kept its stream would replay messages
        we had delivered but not yet acknowledged, and they would be delivered twice."""
        self.rx_id = old.rx_id
        self.peer_node_id = old.peer_node_id
        self.state.recv_seq = old.state.recv_seq

    def _reset_tx(self, exc: BaseException) -> None:
        if self._bitems:
            self._seal(write=False)  # into the old stream, given up below
        self.give_up(str(exc))
        old = self.state
        self.state = LinkState(old.max_inflight_bytes, old.ack_every)
        self.state.recv_seq, self.state.ack_owed = old.recv_seq, old.ack_owed
        self.tx_id = uuid.uuid4().hex[:16]
        self._copies.reset()
        self._fail_waiters(exc)
        self._blocked = None
        self._space.set()

    def _reset_rx(self) -> None:
        self.state.recv_seq = 0
        self.state.ack_owed = 0

    async def attach(self, c: Any, dialer: bool) -> None:
        """Make ``c`` current and replay everything unacknowledged on it, in order."""
        self.conns.append(c)
        if dialer:
            self.dialer = True
        self.compress = c.compress
        self.disconnected_since = None
        if getattr(c.conn, "shares_frames", False):  # test doubles may not derive from Connection
            self._shares_frames = True
        if self.current is not None and not self.current.conn.closed:
            return  # keep sending on the existing connection; this one is read from
        self.current = c
        self._attached_at = time.monotonic()
        st = self.state
        if not st.unacked:
            return
        self._replaying = True
        try:
            nxt = st.unacked[0][0]
            while True:
                if not st.unacked or self.current is not c:
                    break
                first = st.unacked[0][0]
                idx = max(nxt - first, 0)
                if idx >= len(st.unacked):
                    break
                seq, frames, _n = st.unacked[idx]
                w = c.conn.write_nowait(frames)
                self.replayed += 1
                if w is not None:
                    await w
                nxt = seq + 1
        except ConnectionClosed:
            self.connection_lost(c)
        except ProtocolError as exc:  # a message this connection cannot carry: never deliverable
            self.fail(PeerUnavailable(f"{self.peer}: cannot replay an unacknowledged message ({exc})"))
        finally:
            self._replaying = False

    def connection_lost(self, c: Any) -> None:
        if c in self.conns:
            self.conns.remove(c)
        if self.current is c and self.state.unacked and self.dead is None:
            head, _frames, nbytes = self.state.unacked[0]
            quick = time.monotonic() - self._attached_at < REJECT_WINDOW + nbytes / REJECT_RATE
            if head != self._stuck_seq or not quick:
                self._stuck_seq, self._stuck_count = head, 0
            self._stuck_count += quick
            if self._stuck_count >= MAX_REPLAY_FAILURES:
                self.fail(
                    PeerUnavailable(
                        f"{self.peer}: the peer closed {self._stuck_count} connections in a row without accepting "
                        f"message {head} ({nbytes} bytes): it rejects that message (over one of its [limits]? "
                        "see its log); link failed rather than replaying it forever"
                    )
                )
                return
        if self.current is c:
            self.current = next((x for x in self.conns if not x.conn.closed), None)
            if self.current is not None:
                self._switch_task = asyncio.get_running_loop().create_task(self._switch(self.current))
        if self.current is None and self.dead is None and not self.left:
            if self.disconnected_since is None:
                self.disconnected_since = time.monotonic()
            if self._reconnect_task is None or self._reconnect_task.done():
                self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect())

    async def _switch(self, c: Any) -> None:
        self.current = None
        if c in self.conns:
            self.conns.remove(c)
        await self.attach(c, False)

    async def _reconnect(self) -> None:
        delay = 0.02
        deadline = (self.disconnected_since or time.monotonic()) + self.give_up_after
        while self.current is None and self.dead is None and not self.left:
            if self.dialer and self._redial is not None:
                try:
                    await self._redial()
                except Exception as exc:  # any dial failure: try again until the deadline
                    self.log.debug("reconnect attempt failed", peer=self.peer, error=str(exc))
                if self.current is not None:
                    self.log.info("reconnected", peer=self.peer, replayed=len(self.state.unacked))
                    return
            if time.monotonic() >= deadline:
                gone = PeerUnavailable(f"{self.peer}: no connection for {self.give_up_after} s (gave up)")
                self.fail(gone, keep=True)
                return
            await asyncio.sleep(min(delay * (0.5 + random.random()), max(deadline - time.monotonic(), 0)))
            delay = min(delay * 2, 1.0)

    # ------------------------------------------------------------------ ending
    def _fail_waiters(self, exc: BaseException) -> None:
        while self._ack_waiters:
            fut = self._ack_waiters.popleft()[1]
            if not fut.done():
                fut.set_exception(exc)
        self.requests.fail(exc)
        self._space.set()

    def fail(self, exc: BaseException, keep: bool = False) -> None:
        """The peer is dead (or gave up): fail everything waiting on this link.

        ``keep``: the verdict may be wrong (declared dead, no connection for a while), so the
        unacknowledged messages stay for ``death_grace`` s for a successor link to adopt
        (:meth:`adopt_stream`); otherwise they are given up now (and reported)."""
        if self.dead is not None:
            return
        if self._bitems:
            self._seal()  # pushed messages are in the stream: kept for a successor, or reported
        self.dead = exc
        self._fail_waiters(exc)
        if keep and self.state.unacked and self.death_grace > 0:
            self._grace_timer = asyncio.get_running_loop().call_later(
                self.death_grace, self.give_up, f"not back within link.death_grace ({self.death_grace:g} s)"
            )
        else:
            self.give_up(str(exc))
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        for c in list(self.conns):
            c.conn.abort()
        self.conns.clear()
        self.current = None
        if self._reconnect_task is not None and self._reconnect_task is not asyncio.current_task():
            self._reconnect_task.cancel()
        if self._on_dead is not None:
            self._on_dead(self.peer, exc)

    def peer_left(self) -> None:
        """The peer said BYE: nothing more will be delivered; fail waiters without reconnecting."""
        self.left = True
        if self.dead is None:
            if self._bitems:
                self._seal()  # counted as undeliverable below, with the rest
            self.flush_ack()
            self.dead = PeerUnavailable(f"{self.peer}: peer left the cluster")
            self._fail_waiters(self.dead)
            self.give_up("peer left the cluster")
            if self._reconnect_task is not None and self._reconnect_task is not asyncio.current_task():
                self._reconnect_task.cancel()  # left while down (membership's news): nobody to redial
            if self._on_dead is not None:
                self._on_dead(self.peer, self.dead)

    def give_up(self, reason: str) -> int:
        """Drop the unacknowledged messages for good; report how many (returned too)."""
        if self._grace_timer is not None:
            self._grace_timer.cancel()
            self._grace_timer = None
        st = self.state
        n = len(st.unacked)
        st.unacked.clear()
        st.inflight_bytes = 0
        if n:
            self.undeliverable += n
            if self._on_undeliverable is not None:
                self._on_undeliverable(self.peer, n, reason)
        return n

    @property
    def keeping(self) -> int:
        """Unacknowledged messages a dead link still keeps for a successor (0 when none)."""
        return len(self.state.unacked) if self._grace_timer is not None else 0

    def adopt_stream(self, old: LinkRecovery) -> int:
        """Continue our outgoing stream where ``old`` (declared dead, within its grace)
        stopped: its unacknowledged messages become ours, to be trimmed by the peer's resume
        info and replayed on attach. Returns how many were adopted."""
        if old._grace_timer is None:
            return 0
        old._grace_timer.cancel()
        old._grace_timer = None
        mine, kept = self.state, old.state
        n = len(kept.unacked)
        mine.unacked, kept.unacked = kept.unacked, deque()
        mine.next_seq, mine.acked = kept.next_seq, kept.acked
        mine.inflight_bytes, kept.inflight_bytes = kept.inflight_bytes, 0
        self._copies.take_over(old._copies)
        self.tx_id = old.tx_id
        return n


__all__ = ["MAX_REPLAY_FAILURES", "REJECT_RATE", "REJECT_WINDOW", "LinkRecovery"]
