"""Suspicion and verification, from a first doubt about a member to the verdict.

A doubt comes from the watch loop's phi check (:meth:`~.service.Membership._check`) or, on the
fast path, from a connection event: a link lost without a goodbye (:meth:`_on_conn_event`).
Verification then runs probe rounds (:class:`~.probe.Prober`: a direct probe and ``indirect_probes``
helpers) beside the member's liveness responder (:mod:`.liveness`) until the member proves it
is alive, is found dead, or ``suspect_timeout`` passes. Any proof of life (:meth:`_evidence`)
clears a suspicion. This module also answers other members' probe requests and responses.

:class:`Verification` is a mixin that :class:`~.service.Membership` inherits (one ``self``, no
delegation); the pure rules are in :mod:`.suspicion` and :mod:`.table`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ..core.ports import PeerConnectivity
from .awareness import Awareness
from .detector import LagClock, PhiAccrualDetector
from .events import MembershipCounters
from .liveness import Liveness
from .probe import Prober
from .table import ALIVE, DEAD, LEFT, SUSPECT, Member, Update
from .wire import parse_probe_req, parse_probe_rsp

SHOW_SUSPECT_AFTER = 0.1  # s: a suspicion a probe clears faster than this is not shown


class Verification:
    """Suspicion, probe rounds and verdicts of :class:`~.service.Membership` (mixin).

    The annotations below are the host's attributes and methods this mixin uses; the host
    (``Membership.__init__`` and its methods) sets them."""

    cfg: Any  # the [heartbeat] config section
    clock: LagClock
    counters: MembershipCounters
    log: Any
    peers: PeerConnectivity
    prober: Prober
    liveness: Liveness
    awareness: Awareness
    _members: dict[str, Member]
    _detectors: dict[str, PhiAccrualDetector]
    _verifying: dict[str, asyncio.Task[None]]
    _running: bool
    _leaving: bool
    _apply: Callable[..., bool]
    _emit_member: Callable[[Member, str, str | None, str], None]
    _new_detector: Callable[[], PhiAccrualDetector]
    _notify: Callable[[str, Member], None]
    _peer_node_id: Callable[[str], str]
    _spawn: Callable[[Awaitable[Any], str], asyncio.Task[Any]]

    # -------------------------------------------------------------- probe messages (served for others, answers to ours)
    def _on_probe_req(self, peer: str, env: list[Any]) -> None:
        self.counters.recv_msgs += 1
        pid, target, node_id, timeout = parse_probe_req(env)
        if self._running and not self._leaving:
            self.prober.serve(peer, pid, target, node_id, timeout)

    def _on_probe_rsp(self, peer: str, env: list[Any]) -> None:
        self.counters.recv_msgs += 1
        self.prober.answered(peer, *parse_probe_rsp(env))

    # the prober's internals, where tests reach in (and replace ``_probe_url``)
    @property
    def _served(self) -> dict[str, dict[str, int]]:
        return self.prober.served

    @property
    def _exchanges(self) -> dict[str, asyncio.Task[tuple[str, str, str]]]:
        return self.prober._exchanges

    @property
    def _direct_probe(self) -> Callable[[str, str, list[str], float], Awaitable[str]]:
        return self.prober._direct_probe

    @property
    def _probe_url(self) -> Callable[[str, str, str, float], Awaitable[str]]:
        return self.prober._probe_url

    @_probe_url.setter
    def _probe_url(self, fn: Callable[[str, str, str, float], Awaitable[str]]) -> None:
        self.prober._probe_url = fn  # type: ignore[method-assign]

    # ------------------------------------------------------------------ suspicion and verification
    def _on_conn_event(self, peer: str, event: str, details: dict[str, Any]) -> None:
        if not self._running or self._leaving:
            return
        m = self._members.get(peer)
        if m is None:
            return
        if event == "connected":
            if details.get("node_id") == m.node_id and m.state in (ALIVE, SUSPECT):
                self._evidence(peer)
            return
        if m.state in (DEAD, LEFT):
            return
        nid = self._peer_node_id(peer)
        if nid and nid != m.node_id:
            return  # about another process with this name
        if event == "left":
            self._apply(Update(peer, m.node_id, m.incarnation, LEFT, tuple(m.addresses)), reason="said goodbye")
        elif event == "lost":
            if self.peers.connected(peer):
                return  # another connection to it is still up
            why = details.get("reason", "connection lost")
            reset = bool(details.get("reset"))
            self._start_verify(m, f"{why}{' (reset)' if reset else ''}", show_now=reset)
        elif event == "dead":
            self._start_verify(m, f"link failed: {details.get('reason', '')}")

    def _evidence(self, name: str) -> None:
        m = self._members.get(name)
        if m is None:
            return
        m.last_seen = self.clock.real()
        if self.liveness.resumed(name):
            self._emit_member(m, "resumed", ALIVE.value, "its event loop runs again")
            if name in self._detectors:  # the stall's silence is not its normal heartbeat rhythm
                self._detectors[name] = self._new_detector()
        self.prober.wake(name, alive=True)
        if m.suspected and name not in self._verifying:
            self._clear_suspicion(m, "proof of life")

    def _clear_suspicion(self, m: Member, why: str) -> None:
        if m.suspected:
            prev = m.shown_state
            m.suspected = ""
            if m.shown_state != prev:
                self._emit_member(m, m.shown_state.value, prev.value, why)

    def _start_verify(self, m: Member, reason: str, show_now: bool = False) -> None:
        """Verify a suspicion. It is shown (state suspect, an event) at once when ``show_now``,
        else only if the first probe does not answer quickly: a peer whose data connection is
        merely back-pressured answers a fresh probe in milliseconds and should not flap."""
        if m.name in self._verifying or not self._running or self._leaving or m.state in (DEAD, LEFT):
            return
        self.counters.suspicions += 1
        if show_now:
            self._show_suspect(m.name, m.node_id, reason)
        task = self._spawn(self._verify(m.name, m.node_id, reason, show_now), f"aionet-verify-{m.name}")
        self._verifying[m.name] = task

        def done(t: asyncio.Task[None], name: str = m.name) -> None:
            if self._verifying.get(name) is t:
                del self._verifying[name]

        task.add_done_callback(done)

    def _show_suspect(self, name: str, node_id: str, reason: str) -> None:
        m = self._members.get(name)
        if m is not None and m.node_id == node_id and not m.suspected and m.state == ALIVE:
            m.suspected = reason
            self._emit_member(m, SUSPECT.value, ALIVE.value, reason)

    async def _verify(self, name: str, node_id: str, reason: str, shown: bool) -> None:
        show = None
        if not shown:
            delay = min(SHOW_SUSPECT_AFTER, self.cfg.probe_timeout / 2)
            show = asyncio.get_running_loop().call_later(delay, self._show_suspect, name, node_id, reason)
        try:
            await self._verify_rounds(name, node_id, reason)
        finally:
            if show is not None:
                show.cancel()

    async def _verify_rounds(self, name: str, node_id: str, reason: str) -> None:
        started = self.clock()
        while True:
            m = self._members.get(name)
            if m is None or m.node_id != node_id or m.state in (DEAD, LEFT):
                return
            timeout = self.awareness.probe_timeout(self.cfg.probe_timeout, m.load.max_stall_ms if m.load else 0.0)
            t0 = self.clock()
            # beside the probes, ask the member's responder: it answers for the process while
            # user code blocks the loop, and is silent when the process is stopped or gone
            probe = self.prober.probe_round(m, timeout, self.cfg.indirect_probes)
            outcome, why, stalled = await self.liveness.verify_round(name, m.load, probe, timeout, self._spawn)
            reason = why or reason
            if stalled is not None:
                self._emit_member(m, "stalled", ALIVE.value, f"event loop blocked {stalled:.1f} s")
            self.log.debug(
                "probe round",
                member=name,
                outcome=outcome or "unknown",
                timeout=round(timeout, 3),
                took=round(self.clock() - t0, 3),
            )
            m = self._members.get(name)
            if m is None or m.node_id != node_id or m.state in (DEAD, LEFT):
                return
            if outcome == ALIVE:
                m.verified_at = self.clock()
                self._clear_suspicion(m, "answered a probe")
                if m.state == SUSPECT:
                    self._notify(name, m)
                return
            if outcome == DEAD or self.clock() - started >= self.cfg.suspect_timeout:
                self.counters.deaths_declared += 1
                self._apply(Update(name, node_id, m.incarnation, DEAD, tuple(m.addresses)), reason=reason)
                return
            if m.state == ALIVE:  # nobody could confirm either way: gossip the suspicion, let it refute
                self._apply(Update(name, node_id, m.incarnation, SUSPECT, tuple(m.addresses)), reason=reason)
            await asyncio.sleep(self.cfg.interval)


__all__ = ["SHOW_SUSPECT_AFTER", "Verification"]
