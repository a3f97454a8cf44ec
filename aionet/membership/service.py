"""The membership service: the one driver that performs effects (tasks, timers, sockets).

Here: lifecycle and joining, the public views, the heartbeat and watch loops, receiving
heartbeats and gossip, and merging updates into the member table. What happens once a member
is doubted (probe rounds, verdicts) is in :mod:`.verification`, which :class:`Membership`
inherits. The design is in the package docstring (:mod:`aionet.membership`).

The service never sees the Node: it gets the narrow ports of :mod:`aionet.core.ports`
(messaging, the control channel, peer connectivity, a clock), so a test can hand it fakes
and feed it time.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from ..config import validate_heartbeat
from ..core.ports import Clock, ControlChannel, Messaging, PeerConnectivity, loop_time
from ..core.tasks import OwnedTasks
from ..devices import Devices
from ..errors import AionetError, PeerUnavailable, ProtocolError
from ..instrument import Instruments
from ..log import get_logger
from ..stats import MembershipStats
from .awareness import STALL_WARNING, Awareness
from .detector import LagClock, PhiAccrualDetector
from .events import MemberEvent, MemberEventStream, MembershipCounters, Subscribers, member_view, self_view
from .gossip import GossipQueue, LoadRelay, gossip_budget, sync_reply
from .liveness import Liveness
from .load import LoadReport, LoadSampler
from .probe import DialPolicy, Prober
from .rtt import RttEstimator
from .suspicion import CheckConfig, Forget, Notify, check
from .table import (
    ALIVE,
    DEAD,
    LEFT,
    SUSPECT,
    Disseminate,
    Effect,
    Emit,
    KillLink,
    LearnAddresses,
    LinkLeft,
    Member,
    MemberTable,
    Refuted,
    Restarted,
    StartVerify,
    TableFull,
    Update,
    ring_predecessors,
    ring_successors,
)
from .verification import Verification
from .wire import (
    GOSSIP,
    HB,
    HB_ACK,
    MEMBERS_SERVICE,
    PROBE_REQ,
    PROBE_RSP,
    SYNC_SERVICE,
    parse_beat,
    parse_gossip,
    parse_load,
    parse_load_entry,
)

REVIVE_EVERY = 2.0  # s between heartbeats to one random member believed dead


# ---------------------------------------------------------------------- the service
class Membership(Verification):
    """The membership and failure-detection service of one node (see the module docstring).

    Suspicion, probe rounds and verdicts are in :mod:`.verification` (inherited)."""

    def __init__(
        self,
        cfg: Any,
        *,
        messaging: Messaging,
        control: ControlChannel,
        peers: PeerConnectivity,
        join: bool = False,
        clock: Clock | None = None,
        dumps: Callable[[Any], list[Any]] | None = None,
        load_sampler: LoadSampler | None = None,
        devices: Devices | None = None,
        token: bytes | None = None,
        instruments: Instruments | None = None,
    ):
        """``cfg`` is the ``[heartbeat]`` section. ``join``: the node dialed configured seeds
        before :meth:`start` (their member tables are fetched then). ``clock``: monotonic
        seconds for every timer and record (default: the running loop's clock; tests pass an
        :class:`aionet.testing.FakeClock`). ``dumps`` serializes an envelope, only to count
        bytes when ``count_bytes`` is set. ``token``: the cluster token, which signs the
        liveness responder's answers (:mod:`.liveness`). ``instruments``: the node's hooks."""
        validate_heartbeat(cfg)
        self.messaging = messaging
        self.control = control
        self.peers = peers
        self.cfg = cfg
        self._join = join
        self._dumps = dumps
        self.name: str = messaging.name
        self.node_id: str = messaging.node_id
        self.log = get_logger("aionet.membership", node=self.name)
        # lateness beyond an eighth of an interval is a stall of ours; routine scheduling jitter
        # under load is not (the detectors' learned jitter covers it)
        self.clock = LagClock(clock or loop_time, slack=cfg.interval / 8)
        self.incarnation = int(time.time() * 1000)
        self.awareness = Awareness(self.clock)
        self.load = load_sampler or LoadSampler(
            lag_ms=lambda: self.clock.lag * 1000.0,
            stall_ms=self.awareness.sample_stall_ms,
            devices=devices,
        )
        self.counters = MembershipCounters()
        self.liveness = Liveness(
            enabled=cfg.liveness_responder, token=token, max_loop_stall=cfg.max_loop_stall, log=self.log
        )
        self.count_bytes = False
        self.table = MemberTable()
        self._members: dict[str, Member] = self.table.members  # the same dict, read everywhere
        self._detectors: dict[str, PhiAccrualDetector] = {}
        self._rtt = RttEstimator()  # heartbeat -> echo round trips of the watched members
        self._gossip = GossipQueue()
        self._verifying: dict[str, asyncio.Task[None]] = {}
        self._capped_logged = False
        self._next_id = 0
        self._tasks = OwnedTasks(self.log, "membership")
        self._subscribers = Subscribers(self._spawn, self.log, instruments)
        self._loads = LoadRelay()
        self._dials = DialPolicy(self.name, cfg.interval)
        self._next_revive = 0.0
        self._notified: dict[str, float] = {}
        self._running = False
        self._leaving = False
        self.prober = Prober(
            messaging,
            peers,
            self.clock,
            self._members,
            send=self._send,
            spawn=self._spawn,
            addresses=self._my_addresses,
            probe_timeout=cfg.probe_timeout,
            counters=self.counters,
            log=self.log,
        )
        control.add_control_handler(HB, self._on_hb)
        control.add_control_handler(HB_ACK, self._on_ack)
        control.add_control_handler(PROBE_REQ, self._on_probe_req)
        control.add_control_handler(PROBE_RSP, self._on_probe_rsp)
        control.add_control_handler(GOSSIP, self._on_gossip)
        control.on_connection_event(self._on_conn_event)
        messaging.add_service(SYNC_SERVICE, self._on_sync, cancellable=False)
        messaging.add_service(MEMBERS_SERVICE, lambda _arg: self.status())

    # ------------------------------------------------------------------ lifecycle
    async def start(self, sync_timeout: float = 5.0) -> None:
        """Start heartbeating; if the node is connected to seeds, fetch their member table."""
        if self._running:
            return
        self._running = True
        self._leaving = False
        self._subscribers.closed = False
        live = await self.liveness.start(self.peers.advertised())
        if live is not None:
            self.load.add_field("live", lambda: live)
        self.load.sample()
        self._spawn(self._heartbeat_loop(), "aionet-heartbeat")
        self._spawn(self._watch_loop(), "aionet-lag-watch")
        # the node dialed its configured seeds before starting us: those are the connected peers
        seeds = [n for n in self.peers.known_peers() if self.peers.connected(n)] if self._join else []
        if seeds:
            await self._sync(seeds, sync_timeout)

    async def join(self, seeds: Iterable[str], timeout: float = 5.0) -> int:
        """Join through seed URLs after start (``Node(join=...)`` does this for you); returns
        how many members are known afterwards. Raises PeerUnavailable if no seed answers."""
        names = []
        errors = []
        for url in seeds:
            try:
                names.append(await self.peers.connect(url))
            except (AionetError, OSError, TimeoutError) as exc:
                errors.append(f"{url}: {exc}")
        if not names or not await self._sync(names, timeout):
            raise PeerUnavailable("could not join through any seed: " + "; ".join(errors or ["no answer"]))
        return len(self._members) + 1

    async def _sync(self, peers: list[str], timeout: float) -> bool:
        arg = {"member": self._self_update().to_wire(), "load": self.load.last.to_wire()}
        results = await asyncio.gather(
            *(self.messaging.request(p, SYNC_SERVICE, arg, timeout=timeout) for p in peers), return_exceptions=True
        )
        ok = False
        for peer, res in zip(peers, results, strict=True):
            if isinstance(res, BaseException):
                self.log.warning("member sync with seed failed", seed=peer, error=str(res) or type(res).__name__)
                continue
            try:
                self._apply_table(res, source=peer)
                ok = True
            except (ProtocolError, TypeError, ValueError, KeyError) as exc:
                self.log.warning("bad member table from seed", seed=peer, error=str(exc))
        return ok

    async def stop(self) -> None:
        """Announce a graceful leave (not a failure) and stop the tasks."""
        if not self._running:
            return
        self._leaving = True
        env = [GOSSIP, [self._self_update().to_wire()], []]
        for m in list(self._members.values()):
            if m.state in (ALIVE, SUSPECT):
                self._send(m.name, env)
        await self._tasks.cancel_all()
        await self.load.aclose()
        await self.liveness.stop()
        self._subscribers.close()
        self._running = False

    def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        """Every task membership starts is owned here: cancelled and awaited by :meth:`stop`,
        and its exception (a bug) is logged rather than left "never retrieved"."""
        return self._tasks.spawn(coro, name)

    # ------------------------------------------------------------------ public views
    def members(self) -> dict[str, dict[str, Any]]:
        """name -> state, address(es), incarnation, node id, load, devices, age; self included.

        ``load`` is always a map: all zeros with ``reported`` False until the member's first
        load report arrives (so callers can index it without a None check)."""
        now = self.clock.real()
        me = Update(self.name, self.node_id, self.incarnation, LEFT if self._leaving else ALIVE)
        out = {self.name: self_view(me, self._my_addresses(), self.load.last)}
        unknown = LoadReport.unknown()
        for m in self._members.values():
            out[m.name] = member_view(m, now, unknown, self.liveness.stalled.get(m.name))
        return out

    def status(self) -> dict[str, Any]:
        """What ``aionet status`` shows (served as ``aionet.members``)."""
        return {"node": self.name, "time": time.time(), "members": self.members(), "stats": self.stats().as_dict()}

    def stats(self) -> MembershipStats:
        """Gossip and detector counters, the loop's lag and stall, and per watched member its
        phi now and its smoothed heartbeat round trip (seconds; absent before the first echo)."""
        lag, targets = self.clock.lag * 1000.0, tuple(sorted(self._detectors))
        now = self.clock()
        phi = {name: det.phi(now) for name, det in self._detectors.items()}
        return MembershipStats(
            **vars(self.counters),
            targets=targets,
            loop_lag_ms=lag,
            stalled_s=self.clock.stalled,
            phi=phi,
            rtt_s=self._rtt.smoothed(),
        )

    def state_of(self, name: str) -> str | None:
        if name == self.name:
            return (LEFT if self._leaving else ALIVE).value
        m = self._members.get(name)
        return m.shown_state.value if m else None

    def on_member_change(self, fn: Callable[[MemberEvent], Any]) -> Callable[[], None]:
        """Call ``fn(event)`` on every change (inline; a returned coroutine is scheduled).
        Returns a function that unsubscribes."""
        return self._subscribers.add(fn)

    def events(self, maxsize: int = 10_000) -> MemberEventStream:
        return self._subscribers.stream(maxsize)

    async def wait_for(self, name: str, states: str | Iterable[str], timeout: float | None = None) -> str:
        """Wait until ``name`` is shown in one of ``states``; returns that state."""
        want = {states} if isinstance(states, str) else set(states)
        async with self.events() as stream:
            cur = self.state_of(name)
            if cur in want:
                return cur  # type: ignore[return-value]

            async def watch() -> str:
                async for ev in stream:
                    st = self.state_of(name)
                    if ev.name == name and st in want:
                        return st  # type: ignore[return-value]
                raise AionetError("membership stopped")

            return await asyncio.wait_for(watch(), timeout)

    # ------------------------------------------------------------------ tasks
    async def _heartbeat_loop(self) -> None:
        """Heartbeats on their own task, at a fixed rate (late wakes are not caught up)."""
        interval = self.cfg.interval
        real = self.clock.real
        next_t = real()
        last_load = next_t
        while True:
            now = real()
            if now - last_load >= self.cfg.load_interval:
                last_load = now
                self.load.sample()
            try:
                self._send_heartbeats()
            except Exception as exc:  # a bug here must not silence the node
                self.log.error("heartbeat round failed", error=repr(exc))
            next_t += interval
            delay = next_t - real()
            if delay < 0:
                next_t, delay = real(), 0.0
            await asyncio.sleep(delay)
            self.clock.note(next_t)

    async def _watch_loop(self) -> None:
        """The tiny lag-measuring task; it also evaluates the detectors (cheap: fanout peers)."""
        tick = min(0.05, self.cfg.interval / 4)
        real = self.clock.real
        while True:
            expected = real() + tick
            await asyncio.sleep(tick)
            late = self.clock.note(expected)
            self.liveness.stamp()
            if late > STALL_WARNING:
                self.log.warning("event loop was blocked; not counting it against peers", seconds=round(late, 3))
            try:
                self._check()
            except Exception as exc:
                self.log.error("failure check failed", error=repr(exc))

    def _check(self) -> None:
        """Decide with :func:`suspicion.check`, then act (verifications start after the walk)."""
        cfg = self.cfg
        ccfg = CheckConfig(cfg.phi_threshold, cfg.interval, cfg.suspect_timeout, cfg.forget_after)
        now, real_now = self.clock(), self.clock.real()
        actions, max_phi = check(self._members, self._detectors, self._verifying, ccfg, now=now, real_now=real_now)
        self.counters.max_phi = max(self.counters.max_phi, max_phi)
        for a in actions:
            m = self._members.get(a.name)
            if isinstance(a, Forget):
                self._forget(a.name)
            elif m is None:
                continue
            elif isinstance(a, Notify):
                self._notify(a.name, m)
            else:
                self._start_verify(m, a.reason)
        self._revive_probe(real_now)

    def _forget(self, name: str) -> None:
        self.table.forget(name)
        self._rtt.forget(name)
        self.liveness.stalled.pop(name, None)
        self._loads.forget(name)
        self._dials.forget(name)
        self._notified.pop(name, None)

    def _revive_probe(self, now: float) -> None:
        """Now and then heartbeat one member we think dead (not left): after a partition heals,
        or for a node that was only frozen, this is how the two sides find each other again
        (it answers, learns it was declared dead, and refutes)."""
        if now < self._next_revive:
            return
        self._next_revive = now + REVIVE_EVERY
        dead = [m for m in self._members.values() if m.state == DEAD and m.addresses]
        if not dead:
            return
        m = random.choice(dead)
        self._next_id += 1
        env = [HB, self._next_id, self.incarnation, None, [self._self_update().to_wire()], []]
        if not self._send(m.name, env) and self._dials.allow_addresses(m.addresses, now):
            self._spawn(self._dial(m.name), f"aionet-member-revive-{m.name}")

    # ------------------------------------------------------------------ heartbeats
    def _live_names(self) -> list[str]:
        return [n for n, m in self._members.items() if m.state in (ALIVE, SUSPECT)]

    def _send_heartbeats(self) -> None:
        live = self._live_names()
        targets = ring_successors(live, self.name, self.cfg.fanout) if live else []
        for t in list(self._detectors):
            if t not in targets:
                del self._detectors[t]
                self._rtt.forget(t)
        for t in targets:
            det = self._detectors.get(t)
            if det is None:
                det = self._detectors[t] = self._new_detector()
            self._next_id += 1
            env = self._beat(HB, self._next_id, t)
            if self._send(t, env):
                self._rtt.sent(t, self._next_id, self.clock.real())
                if self._dials.connected(t) and det.elapsed() > self.cfg.interval:
                    # first heartbeat after waiting for a connection: judge it from now on
                    self._detectors[t] = self._new_detector()
            else:
                self._ensure_connected(t)

    def _new_detector(self) -> PhiAccrualDetector:
        return PhiAccrualDetector(
            self.clock,
            expected_interval=self.cfg.interval,
            min_std=self.cfg.min_std,
            acceptable_pause=self.cfg.acceptable_pause,
        )

    def _beat(self, kind: int, seq: int, peer: str) -> list[Any]:
        """An HB or HB_ACK to ``peer``: our load report if it changed, gossip, others' loads."""
        own = self._loads.own_for(peer, self.load.last)
        n = len(self._members) + 1
        updates = [u.to_wire() for u in self._gossip.take(self.cfg.max_piggyback, gossip_budget(n))]
        loads = self._loads.others_for(peer, self._members, self.clock.real())
        return [kind, seq, self.incarnation, own, updates, loads]

    def _send(self, peer: str, env: list[Any]) -> bool:
        ok = bool(self.control.send_control(peer, env))
        if ok:
            self.counters.sent_msgs += 1
            if self.count_bytes and self._dumps is not None:
                self.counters.sent_bytes += sum(
                    f.nbytes if isinstance(f, memoryview) else len(f) for f in self._dumps(env)
                )
        return ok

    def _ensure_connected(self, name: str) -> None:
        """Dial a member we must heartbeat, as :class:`DialPolicy` allows."""
        m = self._members.get(name)
        if self._running and self._dials.want(name, m.addresses if m else None, self.clock.real()):
            self._spawn(self._dial(name), f"aionet-member-dial-{name}")

    async def _dial(self, name: str) -> None:
        try:
            await self.peers.ensure_link(name)
        except Exception as exc:  # unreachable: the detector will notice
            self.log.debug("dial to member failed", peer=name, error=str(exc))

    # ------------------------------------------------------------------ receiving
    def _on_hb(self, peer: str, env: list[Any]) -> None:
        self.counters.recv_msgs += 1
        seq, inc, load, updates, loads = parse_beat(env)
        if self._leaving:  # keep answering while we drain, with our goodbye attached
            self._send(peer, [HB_ACK, seq, self.incarnation, None, [self._self_update().to_wire()], []])
            return
        self._heard_from(peer, inc, load)
        self._apply_wire(updates, loads, peer)
        self._send(peer, self._beat(HB_ACK, seq, peer))

    def _on_ack(self, peer: str, env: list[Any]) -> None:
        self.counters.recv_msgs += 1
        seq, inc, load, updates, loads = parse_beat(env)
        if self._leaving:
            return
        det = self._detectors.get(peer)
        m = self._members.get(peer)
        if det is not None and m is not None and m.node_id == self._peer_node_id(peer):
            det.heartbeat()
            self._rtt.echoed(peer, seq, self.clock.real())
        self._heard_from(peer, inc, load)
        self._apply_wire(updates, loads, peer)

    def _on_gossip(self, peer: str, env: list[Any]) -> None:
        self.counters.recv_msgs += 1
        updates, loads = parse_gossip(env)
        if not self._leaving:
            self._apply_wire(updates, loads, peer)

    def _peer_node_id(self, name: str) -> str:
        return self.peers.peer_node_id(name)

    def _heard_from(self, peer: str, inc: int, load: LoadReport | None) -> None:
        """A member spoke to us directly: proof of life, and maybe news about its incarnation."""
        m = self._members.get(peer)
        nid = self._peer_node_id(peer)
        if m is None or (nid and nid != m.node_id):
            if not nid:
                return
            addrs = tuple(self.peers.known_peers().get(peer, ()) or (m.addresses if m else ()))
            if not self._apply(Update(peer, nid, inc, ALIVE, addrs), source=peer, reason="heard from it"):
                return
            m = self._members[peer]
        elif inc > m.incarnation:
            self._apply(Update(peer, m.node_id, inc, ALIVE, tuple(m.addresses)), source=peer, reason="refuted")
        elif m.state != ALIVE:
            self._notify(peer, m)  # it does not know it is suspected (or declared dead): tell it
        if m.state in (DEAD, LEFT):
            return
        if load is not None:
            m.load, m.load_time = load, self.clock.real()
        self._evidence(peer)

    def _apply_wire(self, updates: list[Any], loads: list[Any], source: str, spread: bool = True) -> None:
        for w in updates:
            self._apply(Update.from_wire(w), source=source, spread=spread)
        now = self.clock.real()
        for w in loads:
            name, nid, age_ms, rep = parse_load_entry(w)
            m = self._members.get(name)
            if m is None or m.node_id != nid or m.state != ALIVE:
                continue
            made = now - max(age_ms, 0) / 1000.0
            if m.load_time is None or made > m.load_time:
                m.load = parse_load(rep)
                m.load_time = made

    def _apply_table(self, table: Any, source: str) -> None:
        if not isinstance(table, dict) or not isinstance(table.get("members"), list):
            raise ProtocolError("member table is not a map with a member list")
        loads = table.get("loads", [])
        self._apply_wire(table["members"], loads if isinstance(loads, list) else [], source, spread=False)

    def _on_sync(self, arg: Any) -> dict[str, Any]:
        """A joiner's first contact: take its record, hand back the whole table."""
        if not isinstance(arg, dict):
            raise ProtocolError("sync argument is not a map")
        u = Update.from_wire(arg.get("member"))
        if u.name != self.name:
            self._apply(u, reason="joined")
            m = self._members.get(u.name)
            if m is not None and m.node_id == u.node_id and arg.get("load") is not None:
                try:
                    m.load, m.load_time = LoadReport.from_wire(arg["load"]), self.clock.real()
                except (TypeError, ValueError, KeyError):
                    pass
        return sync_reply(self._self_update(), self.load.last, self._members.values(), self.clock.real())

    # ------------------------------------------------------------------ state changes
    def _self_update(self) -> Update:
        return Update(
            self.name,
            self.node_id,
            self.incarnation,
            LEFT if self._leaving else ALIVE,
            tuple(self._my_addresses()),
        )

    def _my_addresses(self) -> list[str]:
        return self.peers.advertised()

    def _apply(self, u: Update, source: str | None = None, reason: str = "", spread: bool = True) -> bool:
        """Merge one update into the table and perform what the merge decided (events, dead
        links, spreading the news unless ``spread`` is off: a seed's table is news to us only).
        True if it changed."""
        if u.name == self.name:
            self._about_me(u, source)
            return False
        changed, effects = self.table.merge(
            u,
            now=self.clock.real(),
            adj_now=self.clock(),
            source=source,
            reason=reason,
            spread=spread,
            verify_after=self.cfg.probe_timeout,
            distrust_revived=self.cfg.suspect_timeout,
        )
        self._perform(effects)
        return changed

    def _perform(self, effects: list[Effect]) -> None:
        """Carry out the merge's decisions, in order."""
        for e in effects:
            if isinstance(e, Emit):
                ev = MemberEvent(e.name, e.kind, e.state, e.previous, e.incarnation, e.node_id, e.reason)
                self._subscribers.emit(ev)
            elif isinstance(e, Disseminate):
                self._disseminate(e.update, e.source)
            elif isinstance(e, LearnAddresses):
                self.peers.learn_peers({e.name: list(e.addresses)}, hearsay=False)
            elif isinstance(e, KillLink):
                nid = self._peer_node_id(e.name)
                if not nid or nid == e.node_id:  # not a link to another process of that name
                    self.peers.declare_dead(e.name, e.reason)
            elif isinstance(e, LinkLeft):
                nid = self._peer_node_id(e.name)
                if not nid or nid == e.node_id:
                    self.peers.member_left(e.name, e.reason)
            elif isinstance(e, StartVerify):
                m = self._members.get(e.name)
                if m is not None:
                    self._start_verify(m, e.reason)
            elif isinstance(e, Restarted):
                self._detectors.pop(e.name, None)
                self._loads.forget(e.name)
                t = self._verifying.get(e.name)
                if t is not None:
                    t.cancel()
            elif isinstance(e, Refuted):
                self.prober.wake(e.name, alive=True)
            elif isinstance(e, TableFull):
                if not self._capped_logged:
                    self._capped_logged = True
                    limit = self.table.max_members
                    self.log.warning(
                        "member table full; ignoring updates about new names", limit=limit, source=e.source
                    )

    def _about_me(self, u: Update, source: str | None) -> None:
        if self._leaving or not self._running:
            return
        if u.node_id != self.node_id:
            if u.incarnation >= self.incarnation and u.state in (ALIVE, SUSPECT):
                self.incarnation = u.incarnation + 1  # an older process of my name: outrank it
                self._announce_self(source)
            return
        if u.state != ALIVE and u.incarnation >= self.incarnation:
            self.incarnation = u.incarnation + 1
            self.counters.refutations += 1
            self.log.info("refuting", claimed=u.state, told_by=source, incarnation=self.incarnation)
            self._announce_self(source)
        elif u.incarnation > self.incarnation:
            self.incarnation = u.incarnation

    def _announce_self(self, also: str | None) -> None:
        u = self._self_update()
        self._gossip.push(u)
        env = [GOSSIP, [u.to_wire()], []]
        for n in set(self._neighbours()) | ({also} if also else set()):
            self._send(n, env)

    def _neighbours(self) -> list[str]:
        live = self._live_names()
        if not live:
            return []
        k = self.cfg.fanout
        return list(dict.fromkeys(ring_successors(live, self.name, k) + ring_predecessors(live, self.name, k)))

    def _disseminate(self, u: Update, source: str | None) -> None:
        """Queue for piggybacking, and push once right away to our ring neighbours."""
        self._gossip.push(u)
        if not self._running:
            return
        env = [GOSSIP, [u.to_wire()], []]
        targets = set(self._neighbours())
        if u.state in (SUSPECT, DEAD):
            targets.add(u.name)  # let it refute if it can still hear us
        else:
            targets.discard(u.name)
        targets.discard(source or "")
        for n in targets:
            self._send(n, env)

    def _notify(self, peer: str, m: Member) -> None:
        now = self.clock.real()
        if self._notified.get(peer, -math.inf) + self.cfg.interval > now:
            return
        self._notified[peer] = now
        self._send(peer, [GOSSIP, [m.update().to_wire()], []])

    def _emit_member(self, m: Member, kind: str, previous: str | None, reason: str) -> None:
        state = m.shown_state.value
        self._subscribers.emit(MemberEvent(m.name, kind, state, previous, m.incarnation, m.node_id, reason))


__all__ = ["Membership"]
