"""Membership: who is in the cluster, how loaded each node is, and who has died.

Design (SWIM with phi-accrual heartbeats, Lifeguard-style caution):

* **Ring heartbeats, O(1) per node.** Members are ordered by name on a ring; every node sends a
  heartbeat (HB) each ``heartbeat.interval`` to its ``fanout`` ring successors and answers the
  HBs it gets with an ACK. A node therefore sends and receives about ``2 * fanout`` small
  messages per interval whatever the cluster size, and each node is watched by ``fanout``
  others. Each watcher runs a :class:`~aionet.failure.PhiAccrualDetector` over the ACK arrivals.
* **Gossip piggybacked on heartbeats.** Membership updates (``[name, node_id, incarnation,
  state, addresses]``) ride on HB/ACK messages, each retransmitted ``3 * log2(n)`` times, and
  are also pushed once, immediately, to the ring neighbours of every node that learns something
  new (so a death reaches everyone in milliseconds, not intervals). Load reports ride along
  the same way: a node's own report on every HB/ACK it sends (when it changed) and a couple of
  other members' reports relayed per message, round-robin.
* **Suspicion is verified before anyone is declared dead.** A watcher suspects a peer when phi
  crosses ``phi_threshold`` or, on the fast path, when the connection to it drops without a
  goodbye (a killed process). Verification runs a direct probe (a fresh connection and a
  HELLO exchange: it proves the peer's event loop runs even when the data connection is
  back-pressured) and asks ``indirect_probes`` other members to probe too, so one bad link
  cannot kill a healthy node. A refused connection (nothing listens: the process is gone)
  or no proof of life with at least one other member confirming within ``probe_timeout`` is
  death. When nobody can confirm either way we may be the one cut off, so the suspicion is
  gossiped instead, the peer may refute it, and death waits for ``suspect_timeout``.
* **Incarnations.** A node's incarnation starts at its start time in milliseconds (a restarted
  process outranks its old self) and is bumped to refute a suspicion or a death it hears
  about itself (a node that was only frozen rejoins this way after SIGCONT). For one process,
  higher incarnation wins, and at equal incarnation left > dead > suspect > alive.
* **Local stalls are not peers' failures.** Detection runs on a :class:`~aionet.failure.LagClock`
  fed by a tiny task that measures how late it wakes: time this node's loop could not run does
  not count as peers' silence.

Everything hangs off one Node; the node is used through its service hooks (control handlers,
``send_control``, connection events, ``declare_dead``) plus a few internals for dialing.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .codecs import handshake
from .codecs.envelope import GOSSIP, HB, HB_ACK, PROBE_REQ, PROBE_RSP
from .errors import AionetError, ConfigError, PeerUnavailable, ProtocolError, TransportError
from .failure import LagClock, PhiAccrualDetector
from .load import LoadReport, LoadSampler
from .log import get_logger
from .transports.base import Address

ALIVE, SUSPECT, DEAD, LEFT = "alive", "suspect", "dead", "left"
STATES = (ALIVE, SUSPECT, DEAD, LEFT)  # wire code = index; also the precedence order
_RANK = {s: i for i, s in enumerate(STATES)}

SYNC_SERVICE = "aionet.membership.sync"  # joiner -> seed: my record; reply: the member table
MEMBERS_SERVICE = "aionet.members"  # the members() view, for `aionet status`

GOSSIP_MULT = 3  # retransmissions per update = GOSSIP_MULT * ceil(log2(n + 1))
LOADS_PER_MESSAGE = 2  # other members' load reports relayed per HB/ACK
MAX_ADDRESSES = 16
STALL_WARNING = 0.5  # s: log when this node's own loop was blocked this long
REVIVE_EVERY = 2.0  # s between heartbeats to one random member believed dead
SHOW_SUSPECT_AFTER = 0.1  # s: a suspicion a probe clears faster than this is not shown
# Bounds on what peers can make this node do (issue 11: a peer's PROBE_REQs made a node dial an
# arbitrary address 1,561 times). Probes are shared per address and spaced out, PROBE_REQs are
# served only for known members and one at a time per member, and the member table is capped.
MAX_MEMBERS = 16384  # member records kept; updates about further new names are ignored
MAX_PROBE_CONNECTIONS = 32  # probe connections open at once, all addresses together
MAX_SERVED_PROBES = 16  # members probed at once on other members' behalf (PROBE_REQ)
PROBE_REUSE = 0.1  # s: a probe result this fresh answers every later asker of that address
MAX_PROBE_PAUSE = 0.4  # s: cap of the doubling pause between one probe's retries


# ---------------------------------------------------------------------- pure pieces
@dataclass(frozen=True)
class Update:
    """One member's state as gossiped."""

    name: str
    node_id: str
    incarnation: int
    state: str
    addresses: tuple[str, ...] = ()

    def to_wire(self) -> list[Any]:
        return [self.name, self.node_id, self.incarnation, _RANK[self.state], list(self.addresses)]

    @classmethod
    def from_wire(cls, w: Any) -> Update:
        if type(w) is not list or len(w) != 5:
            raise ProtocolError("membership update is not a 5-element list")
        name, node_id, inc, code, addrs = w
        if not isinstance(name, str) or not 0 < len(name) <= 256:
            raise ProtocolError("membership update: bad name")
        if not isinstance(node_id, str) or len(node_id) > 256:
            raise ProtocolError("membership update: bad node id")
        if type(inc) is not int or inc < 0:
            raise ProtocolError("membership update: bad incarnation")
        if type(code) is not int or not 0 <= code < len(STATES):
            raise ProtocolError("membership update: bad state")
        if (
            not isinstance(addrs, list)
            or len(addrs) > MAX_ADDRESSES
            or not all(isinstance(a, str) and len(a) <= 1024 for a in addrs)
        ):
            raise ProtocolError("membership update: bad addresses")
        return cls(name, node_id, inc, STATES[code], tuple(addrs))


def supersedes(new: Update, old: Update | None) -> bool:
    """Does ``new`` replace ``old`` in the member table? (Same name assumed.)

    A higher incarnation always wins, also across processes (a restarted node starts above its
    old self). At equal incarnation of the same process the stronger state wins
    (left > dead > suspect > alive), so a suspicion is only lifted by the node itself
    refuting it with a higher incarnation. Equal incarnations of different processes: keep old.
    """
    if old is None:
        return True
    if new.incarnation != old.incarnation:
        return new.incarnation > old.incarnation
    if new.node_id != old.node_id:
        return False
    return _RANK[new.state] > _RANK[old.state]


def ring_successors(names: Iterable[str], me: str, k: int) -> list[str]:
    """The ``k`` members after ``me`` on the ring sorted by name (whom ``me`` heartbeats)."""
    ring = sorted(set(names) | {me})
    n, i = len(ring), ring.index(me)
    return [ring[(i + j) % n] for j in range(1, min(k, n - 1) + 1)]


def ring_predecessors(names: Iterable[str], me: str, k: int) -> list[str]:
    """The ``k`` members before ``me`` on the ring (who heartbeat ``me``)."""
    ring = sorted(set(names) | {me})
    n, i = len(ring), ring.index(me)
    return [ring[(i - j) % n] for j in range(1, min(k, n - 1) + 1)]


def verify_timeout(probe_timeout: float, recent_stall: float) -> float:
    """How long a verification round waits when stalls of ``recent_stall`` s keep happening:
    1.5x that on top of ``probe_timeout``, at most twice ``probe_timeout`` in all."""
    return probe_timeout + min(probe_timeout, 1.5 * max(recent_stall, 0.0))


def recurring_stall(samples: Iterable[float]) -> float:
    """The second-worst of recent per-second stall maxima: stalls that recur (a starved host)
    count, a single one (a node that was frozen once, then resumed) does not."""
    worst = sorted(samples, reverse=True)
    return worst[1] if len(worst) > 1 else 0.0


def gossip_budget(n_members: int) -> int:
    return GOSSIP_MULT * max(1, math.ceil(math.log2(n_members + 1)))


class GossipQueue:
    """Updates waiting to be piggybacked; the least-sent go first, each until its budget is spent.
    Only the newest update per member is kept (an older one is not worth sending)."""

    def __init__(self) -> None:
        self._items: dict[str, list[Any]] = {}  # name -> [Update, times_sent]

    def push(self, u: Update) -> None:
        self._items[u.name] = [u, 0]

    def take(self, limit: int, budget: int) -> list[Update]:
        if not self._items or limit <= 0:
            return []
        chosen = sorted(self._items.values(), key=lambda it: it[1])[:limit]
        out = []
        for it in chosen:
            out.append(it[0])
            it[1] += 1
            if it[1] >= budget:
                self._items.pop(it[0].name, None)
        return out

    def __len__(self) -> int:
        return len(self._items)


# ---------------------------------------------------------------------- records and events
@dataclass
class Member:
    """This node's view of one other member."""

    name: str
    node_id: str
    incarnation: int
    state: str  # as gossiped (alive/suspect/dead/left)
    addresses: list[str]
    since: float  # real monotonic time of the last state change
    suspected: str = ""  # reason of a local suspicion under verification (not gossiped)
    last_seen: float | None = None  # last direct proof of life (monotonic)
    load: LoadReport | None = None
    load_time: float | None = None  # when that report was made (monotonic, estimated)
    verified_at: float = -math.inf  # adjusted clock: last verification that found it alive
    suspect_at: float = 0.0  # adjusted clock: when the gossiped suspicion started

    @property
    def shown_state(self) -> str:
        return SUSPECT if self.state == ALIVE and self.suspected else self.state

    def update(self) -> Update:
        return Update(self.name, self.node_id, self.incarnation, self.state, tuple(self.addresses))


@dataclass(frozen=True)
class MemberEvent:
    """A membership change: ``kind`` is joined, alive, suspect, dead, left or restarted."""

    name: str
    kind: str
    state: str
    previous: str | None
    incarnation: int
    node_id: str
    reason: str = ""
    time: float = field(default_factory=time.time)


class MemberEventStream:
    """``async for ev in node.member_events(): ...``; subscribed from creation (nothing missed
    between creating and iterating). Bounded: when full the oldest event is dropped."""

    def __init__(self, owner: Membership, maxsize: int = 10_000):
        self._owner = owner
        self._q: asyncio.Queue[MemberEvent | None] = asyncio.Queue()
        self._maxsize = maxsize
        self.dropped = 0
        self.closed = False

    def _push(self, ev: MemberEvent | None) -> None:
        if self._q.qsize() >= self._maxsize:
            self._q.get_nowait()
            self.dropped += 1
        self._q.put_nowait(ev)

    def __aiter__(self) -> MemberEventStream:
        return self

    async def __anext__(self) -> MemberEvent:
        if self.closed and self._q.empty():
            raise StopAsyncIteration
        ev = await self._q.get()
        if ev is None:
            raise StopAsyncIteration
        return ev

    async def get(self, timeout: float | None = None) -> MemberEvent:
        """The next event (``asyncio.TimeoutError`` after ``timeout``)."""
        return await asyncio.wait_for(self.__anext__(), timeout)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._owner._streams.discard(self)
            self._q.put_nowait(None)

    async def __aenter__(self) -> MemberEventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _ProbeRound:
    target: str
    asked: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)
    acks: int = 0
    nacks: int = 0
    alive: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class MembershipStats:
    sent_msgs: int = 0
    sent_bytes: int = 0  # counted only when Membership.count_bytes is set (costs a serialization)
    recv_msgs: int = 0
    suspicions: int = 0
    refutations: int = 0
    deaths_declared: int = 0
    probes_sent: int = 0
    max_phi: float = 0.0


def _refused(exc: BaseException, url: str) -> bool:
    """True when nothing listens at ``url`` (the process is gone), as opposed to a timeout."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    with contextlib.suppress(AionetError):
        if Address.parse(url).scheme == "inproc" and isinstance(exc, TransportError):
            return not isinstance(exc, TimeoutError)
    return False


# ---------------------------------------------------------------------- the service
class Membership:
    """The membership and failure-detection service of one node (see the module docstring)."""

    def __init__(
        self,
        node: Any,
        cfg: Any,
        *,
        clock: Callable[[], float] = time.monotonic,
        load_sampler: LoadSampler | None = None,
    ):
        _validate(cfg)
        self.node = node
        self.cfg = cfg
        self.name: str = node.name
        self.log = get_logger("aionet.membership", node=node.name)
        # lateness beyond an eighth of an interval is a stall of ours; routine scheduling jitter
        # under load is not (the detectors' learned jitter covers it)
        self.clock = LagClock(clock, slack=cfg.interval / 8)
        self.incarnation = int(time.time() * 1000)
        self.load = load_sampler or LoadSampler(
            lag_ms=lambda: self.clock.lag * 1000.0,
            stall_ms=self._recent_stall_ms,
            devices=getattr(node, "devices", None),
        )
        self.stats = MembershipStats()
        self.count_bytes = False
        self._members: dict[str, Member] = {}
        self._detectors: dict[str, PhiAccrualDetector] = {}
        self._gossip = GossipQueue()
        self._verifying: dict[str, asyncio.Task[None]] = {}
        # url -> the probe exchange in flight (or finished < PROBE_REUSE ago): one per address
        self._exchanges: dict[str, asyncio.Task[tuple[str, str, str]]] = {}
        # member -> {requester: probe id}: PROBE_REQs waiting on the one probe we run for it
        self._served: dict[str, dict[str, int]] = {}
        self._capped_logged = False
        self._rounds: dict[int, _ProbeRound] = {}
        self._next_id = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._callbacks: list[Callable[[MemberEvent], Any]] = []
        self._streams: set[MemberEventStream] = set()
        self._sent_load: dict[str, int] = {}
        self._dial_after: dict[str, float] = {}  # member -> when we may dial it again
        self._addr_dial_after: dict[str, float] = {}  # address -> same, whichever member names it
        self._want_conn: dict[str, float] = {}  # member -> since when we lack a connection to it
        self._next_revive = 0.0
        self._stalls: deque[float] = deque(maxlen=10)
        self._notified: dict[str, float] = {}
        self._load_rr = 0
        self._running = False
        self._leaving = False
        node.add_control_handler(HB, self._on_hb)
        node.add_control_handler(HB_ACK, self._on_ack)
        node.add_control_handler(PROBE_REQ, self._on_probe_req)
        node.add_control_handler(PROBE_RSP, self._on_probe_rsp)
        node.add_control_handler(GOSSIP, self._on_gossip)
        node.on_connection_event(self._on_conn_event)
        node.add_service(SYNC_SERVICE, self._on_sync)
        node.add_service(MEMBERS_SERVICE, lambda _arg: self.snapshot())

    # ------------------------------------------------------------------ lifecycle
    async def start(self, sync_timeout: float = 5.0) -> None:
        """Start heartbeating; if the node is connected to seeds, fetch their member table."""
        if self._running:
            return
        self._running = True
        self._leaving = False
        self.load.sample()
        self._spawn(self._heartbeat_loop(), "aionet-heartbeat")
        self._spawn(self._watch_loop(), "aionet-lag-watch")
        # the node dialed its configured seeds before starting us: those are the connected peers
        seeds = [n for n, p in self.node.peers().items() if p.get("connected")] if self.node.config.node.join else []
        if seeds:
            await self._sync(seeds, sync_timeout)

    async def join(self, seeds: Iterable[str], timeout: float = 5.0) -> int:
        """Join through seed URLs after start (``Node(join=...)`` does this for you); returns
        how many members are known afterwards. Raises PeerUnavailable if no seed answers."""
        names = []
        errors = []
        for url in seeds:
            try:
                names.append(await self.node.connect(url))
            except (AionetError, OSError, TimeoutError) as exc:
                errors.append(f"{url}: {exc}")
        if not names or not await self._sync(names, timeout):
            raise PeerUnavailable("could not join through any seed: " + "; ".join(errors or ["no answer"]))
        return len(self._members) + 1

    async def _sync(self, peers: list[str], timeout: float) -> bool:
        arg = {"member": self._self_update().to_wire(), "load": self.load.last.to_wire()}
        results = await asyncio.gather(
            *(self.node.request(p, SYNC_SERVICE, arg, timeout=timeout) for p in peers), return_exceptions=True
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
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        await self.load.aclose()
        for s in list(self._streams):
            s.close()
        self._running = False

    def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        """Every task membership starts is owned here: cancelled and awaited by :meth:`stop`,
        and its exception (a bug) is logged rather than left "never retrieved"."""
        t = asyncio.get_running_loop().create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(t)
        t.add_done_callback(self._task_done)
        return t

    def _task_done(self, t: asyncio.Task[Any]) -> None:
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            self.log.error("membership task failed", task=t.get_name(), error=repr(t.exception()))

    # ------------------------------------------------------------------ public views
    def members(self) -> dict[str, dict[str, Any]]:
        """name -> state, address(es), incarnation, node id, load, devices, age; self included.

        ``load`` is always a map: all zeros with ``reported`` False until the member's first
        load report arrives (so callers can index it without a None check)."""
        now = self.clock.real()
        rep = self.load.last
        out: dict[str, dict[str, Any]] = {
            self.name: {
                "state": LEFT if self._leaving else ALIVE,
                "address": (self._my_addresses() or [None])[0],
                "addresses": self._my_addresses(),
                "incarnation": self.incarnation,
                "node_id": self.node.node_id,
                "load": {**rep.to_dict(), "reported": True},
                "devices": rep.devices(),
                "age": 0.0,
                "since": None,
                "self": True,
            }
        }
        unknown = LoadReport.unknown()
        for m in self._members.values():
            ages = [now - t for t in (m.last_seen, m.load_time) if t is not None]
            lr = m.load or unknown
            out[m.name] = {
                "state": m.shown_state,
                "address": m.addresses[0] if m.addresses else None,
                "addresses": list(m.addresses),
                "incarnation": m.incarnation,
                "node_id": m.node_id,
                "load": {**lr.to_dict(), "reported": m.load is not None},
                "devices": lr.devices(),
                "age": max(min(ages), 0.0) if ages else None,
                "since": now - m.since,
                "self": False,
            }
        return out

    def snapshot(self) -> dict[str, Any]:
        """What ``aionet status`` shows (served as ``aionet.members``)."""
        return {"node": self.name, "time": time.time(), "members": self.members(), "stats": self.stats_dict()}

    def stats_dict(self) -> dict[str, Any]:
        d = dict(self.stats.__dict__)
        d["targets"] = sorted(self._detectors)
        d["loop_lag_ms"] = self.clock.lag * 1000.0
        d["stalled_s"] = self.clock.stalled
        return d

    def state_of(self, name: str) -> str | None:
        if name == self.name:
            return LEFT if self._leaving else ALIVE
        m = self._members.get(name)
        return m.shown_state if m else None

    def on_member_change(self, fn: Callable[[MemberEvent], Any]) -> Callable[[], None]:
        """Call ``fn(event)`` on every change (inline; a returned coroutine is scheduled).
        Returns a function that unsubscribes."""
        self._callbacks.append(fn)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(fn)

        return unsubscribe

    def events(self, maxsize: int = 10_000) -> MemberEventStream:
        s = MemberEventStream(self, maxsize)
        self._streams.add(s)
        return s

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
            if late > STALL_WARNING:
                self.log.warning("event loop was blocked; not counting it against peers", seconds=round(late, 3))
            try:
                self._check()
            except Exception as exc:
                self.log.error("failure check failed", error=repr(exc))

    def _check(self) -> None:
        now = self.clock()
        thr = self.cfg.phi_threshold
        cooldown = max(1.0, 5 * self.cfg.interval)
        for name, det in list(self._detectors.items()):
            m = self._members.get(name)
            if m is None or m.state in (DEAD, LEFT) or name in self._verifying:
                continue
            phi = det.phi(now)
            if phi > self.stats.max_phi:
                self.stats.max_phi = phi
            # after a probe found it alive, give it a cooldown unless it answers heartbeats again
            if phi >= thr and (now - m.verified_at >= cooldown or det.last > m.verified_at):
                self._start_verify(m, f"no heartbeat reply for {det.elapsed(now):.2f} s (phi {phi:.1f})")
        real_now = self.clock.real()
        for m in list(self._members.values()):
            if m.state == SUSPECT and m.name not in self._verifying:
                if m.last_seen is not None and real_now - m.last_seen < 2 * self.cfg.interval:
                    self._notify(m.name, m)  # it answers us: make sure it knows so it can refute
                elif now - m.suspect_at >= self.cfg.suspect_timeout and now - m.verified_at >= cooldown:
                    self._start_verify(m, f"suspected for {self.cfg.suspect_timeout} s without refuting")
            elif m.state in (DEAD, LEFT) and real_now - m.since > self.cfg.forget_after:
                self._forget(m.name)
        self._revive_probe(real_now)

    def _forget(self, name: str) -> None:
        self._members.pop(name, None)
        for d in (self._sent_load, self._dial_after, self._notified, self._want_conn):
            d.pop(name, None)

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
        if not self._send(m.name, env) and self._may_dial(m.addresses, now):
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
        for t in targets:
            det = self._detectors.get(t)
            if det is None:
                det = self._detectors[t] = self._new_detector()
            self._next_id += 1
            env = [HB, self._next_id, self.incarnation, self._own_load_for(t), self._updates(), self._loads_for(t)]
            if self._send(t, env):
                if self._want_conn.pop(t, None) is not None and det.elapsed() > self.cfg.interval:
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

    def _own_load_for(self, peer: str) -> dict[str, Any] | None:
        rep = self.load.last
        if self._sent_load.get(peer) == rep.seq:
            return None
        self._sent_load[peer] = rep.seq
        return rep.to_wire()

    def _updates(self) -> list[Any]:
        n = len(self._members) + 1
        return [u.to_wire() for u in self._gossip.take(self.cfg.max_piggyback, gossip_budget(n))]

    def _loads_for(self, peer: str) -> list[Any]:
        names = [n for n, m in self._members.items() if m.load is not None and n != peer and m.state == ALIVE]
        if not names:
            return []
        now = self.clock.real()
        out = []
        for _ in range(min(LOADS_PER_MESSAGE, len(names))):
            self._load_rr = (self._load_rr + 1) % len(names)
            m = self._members[names[self._load_rr]]
            assert m.load is not None and m.load_time is not None
            out.append([m.name, m.node_id, int((now - m.load_time) * 1000), m.load.to_wire()])
        return out

    def _send(self, peer: str, env: list[Any]) -> bool:
        ok = bool(self.node.send_control(peer, env))
        if ok:
            self.stats.sent_msgs += 1
            if self.count_bytes:
                self.stats.sent_bytes += sum(
                    f.nbytes if isinstance(f, memoryview) else len(f) for f in self.node.serializer.dumps(env)
                )
        return ok

    def _ensure_connected(self, name: str) -> None:
        """Dial a member we must heartbeat. When both ends want a connection the one with the
        smaller name dials and the other waits a few intervals first: two crossing dials are
        wasted work (and a handshake race) where one would do."""
        now = self.clock.real()
        if not self._running:
            return
        since = self._want_conn.setdefault(name, now)
        if self.name > name and now - since < 3 * self.cfg.interval:
            return
        if self._dial_after.get(name, 0.0) > now:
            return
        self._dial_after[name] = now + max(1.0, 5 * self.cfg.interval)
        m = self._members.get(name)
        if m is not None and not self._may_dial(m.addresses, now):
            return
        self._spawn(self._dial(name), f"aionet-member-dial-{name}")

    def _may_dial(self, addresses: Iterable[str], now: float) -> bool:
        """At most one membership dial per address per ``max(1 s, 5 intervals)``, whatever
        member names it: gossiped members all naming one address must not multiply the dials
        to it (issue 11). The table is pruned of expired entries, so it stays small."""
        addrs = list(addresses)
        if any(self._addr_dial_after.get(a, 0.0) > now for a in addrs):
            return False
        if len(self._addr_dial_after) > 4 * MAX_PROBE_CONNECTIONS:
            self._addr_dial_after = {a: t for a, t in self._addr_dial_after.items() if t > now}
        until = now + max(1.0, 5 * self.cfg.interval)
        for a in addrs:
            self._addr_dial_after[a] = until
        return True

    async def _dial(self, name: str) -> None:
        node = self.node
        try:
            p = node._peers.get(name)
            link = p.link if p is not None else None
            if link is None or link.dead is not None:
                await node._link_to(name)
            elif link.current is None:
                await node._dial_peer(name)
        except Exception as exc:  # unreachable: the detector will notice
            self.log.debug("dial to member failed", peer=name, error=str(exc))

    # ------------------------------------------------------------------ receiving
    def _on_hb(self, peer: str, env: list[Any]) -> None:
        self.stats.recv_msgs += 1
        seq, inc, load, updates, loads = self._parse_beat(env)
        if self._leaving:  # keep answering while we drain, with our goodbye attached
            self._send(peer, [HB_ACK, seq, self.incarnation, None, [self._self_update().to_wire()], []])
            return
        self._heard_from(peer, inc, load)
        self._apply_wire(updates, loads, peer)
        self._send(
            peer, [HB_ACK, seq, self.incarnation, self._own_load_for(peer), self._updates(), self._loads_for(peer)]
        )

    def _on_ack(self, peer: str, env: list[Any]) -> None:
        self.stats.recv_msgs += 1
        _seq, inc, load, updates, loads = self._parse_beat(env)
        if self._leaving:
            return
        det = self._detectors.get(peer)
        m = self._members.get(peer)
        if det is not None and m is not None and m.node_id == self._peer_node_id(peer):
            det.heartbeat()
        self._heard_from(peer, inc, load)
        self._apply_wire(updates, loads, peer)

    def _on_gossip(self, peer: str, env: list[Any]) -> None:
        self.stats.recv_msgs += 1
        if len(env) != 3 or not isinstance(env[1], list) or not isinstance(env[2], list):
            raise ProtocolError("malformed GOSSIP")
        if not self._leaving:
            self._apply_wire(env[1], env[2], peer)

    @staticmethod
    def _parse_beat(env: list[Any]) -> tuple[int, int, LoadReport | None, list[Any], list[Any]]:
        if len(env) != 6:
            raise ProtocolError("malformed heartbeat")
        _, seq, inc, load, updates, loads = env
        if type(seq) is not int or type(inc) is not int or not isinstance(updates, list) or not isinstance(loads, list):
            raise ProtocolError("malformed heartbeat")
        try:
            rep = LoadReport.from_wire(load) if load is not None else None
        except (TypeError, ValueError, KeyError) as exc:
            raise ProtocolError(f"malformed load report: {exc}") from None
        return seq, inc, rep, updates, loads

    def _peer_node_id(self, name: str) -> str:
        p = self.node._peers.get(name)
        link = p.link if p is not None else None
        return link.peer_node_id if link is not None else ""

    def _heard_from(self, peer: str, inc: int, load: LoadReport | None) -> None:
        """A member spoke to us directly: proof of life, and maybe news about its incarnation."""
        m = self._members.get(peer)
        nid = self._peer_node_id(peer)
        if m is None or (nid and nid != m.node_id):
            if not nid:
                return
            addrs = tuple(self.node.known_peers().get(peer, ()) or (m.addresses if m else ()))
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
            if type(w) is not list or len(w) != 4 or not isinstance(w[0], str) or type(w[2]) is not int:
                raise ProtocolError("malformed load gossip")
            name, nid, age_ms, rep = w
            m = self._members.get(name)
            if m is None or m.node_id != nid or m.state != ALIVE:
                continue
            made = now - max(age_ms, 0) / 1000.0
            if m.load_time is None or made > m.load_time:
                try:
                    m.load = LoadReport.from_wire(rep)
                except (TypeError, ValueError, KeyError) as exc:
                    raise ProtocolError(f"malformed load report: {exc}") from None
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
        now = self.clock.real()
        members = [self._self_update().to_wire()] + [m.update().to_wire() for m in self._members.values()]
        loads = [
            [m.name, m.node_id, int((now - m.load_time) * 1000), m.load.to_wire()]
            for m in self._members.values()
            if m.load is not None and m.load_time is not None and m.state == ALIVE
        ]
        loads.append([self.name, self.node.node_id, 0, self.load.last.to_wire()])
        return {"members": members, "loads": loads}

    # ------------------------------------------------------------------ state changes
    def _self_update(self) -> Update:
        return Update(
            self.name,
            self.node.node_id,
            self.incarnation,
            LEFT if self._leaving else ALIVE,
            tuple(self._my_addresses()),
        )

    def _my_addresses(self) -> list[str]:
        adv = self.node.config.node.advertise
        if adv:
            return [adv]
        try:
            return list(self.node.addresses)
        except AionetError:
            return []

    def _apply(self, u: Update, source: str | None = None, reason: str = "", spread: bool = True) -> bool:
        """Merge one update into the table; emits events, kills links, spreads news (unless
        ``spread`` is off: a seed's table is news to us only). True if it changed."""
        if u.name == self.name:
            self._about_me(u, source)
            return False
        m = self._members.get(u.name)
        now = self.clock.real()
        if m is None:
            if len(self._members) >= MAX_MEMBERS:
                if not self._capped_logged:
                    self._capped_logged = True
                    self.log.warning(
                        "member table full; ignoring updates about new names", limit=MAX_MEMBERS, source=source
                    )
                return False
            m = Member(u.name, u.node_id, u.incarnation, u.state, list(u.addresses), since=now)
            if u.state == SUSPECT:
                m.suspect_at = self.clock()
            self._members[u.name] = m
            if u.addresses and u.state in (ALIVE, SUSPECT):
                self.node._learn_peers({u.name: list(u.addresses)}, hearsay=False)
            kind = "joined" if u.state in (ALIVE, SUSPECT) else u.state
            self._emit(m, kind, None, reason or (f"via {source}" if source else ""))
            if spread:
                self._disseminate(u, source)
            return True
        if not supersedes(u, m.update()):
            if (
                u.state == DEAD
                and u.node_id == m.node_id
                and m.state in (ALIVE, SUSPECT)
                and (m.last_seen is None or now - m.last_seen > self.cfg.probe_timeout)
            ):
                # dead by an older incarnation than ours: maybe we missed news; check ourselves
                self._start_verify(m, f"reported dead by {source or 'a peer'}")
            return False
        prev_shown, prev_state = m.shown_state, m.state
        restarted = u.node_id != m.node_id
        refuted = u.incarnation > m.incarnation
        m.node_id, m.incarnation, m.state = u.node_id, u.incarnation, u.state
        if u.addresses:
            m.addresses = list(u.addresses)
            if u.state in (ALIVE, SUSPECT):
                self.node._learn_peers({u.name: list(u.addresses)}, hearsay=False)
        if restarted:
            m.load = m.load_time = m.last_seen = None
            m.suspected = ""
            self._detectors.pop(u.name, None)
            self._sent_load.pop(u.name, None)
            t = self._verifying.get(u.name)
            if t is not None:
                t.cancel()
        elif refuted and u.state == ALIVE:
            m.suspected = ""
            self._wake_rounds(u.name, alive=True)
        if u.state != prev_state:
            m.since = now
            if u.state == SUSPECT:
                m.suspect_at = self.clock()
        if u.state == DEAD:
            m.suspected = ""
            self._kill_link(m, reason or f"gossip from {source}")
        if restarted:
            self._emit(m, "restarted" if prev_state in (ALIVE, SUSPECT) else "joined", prev_shown, reason)
        elif m.shown_state != prev_shown:
            self._emit(m, m.shown_state, prev_shown, reason or (f"via {source}" if source else ""))
        if spread:
            self._disseminate(u, source)
        return True

    def _about_me(self, u: Update, source: str | None) -> None:
        if self._leaving or not self._running:
            return
        if u.node_id != self.node.node_id:
            if u.incarnation >= self.incarnation and u.state in (ALIVE, SUSPECT):
                self.incarnation = u.incarnation + 1  # an older process of my name: outrank it
                self._announce_self(source)
            return
        if u.state != ALIVE and u.incarnation >= self.incarnation:
            self.incarnation = u.incarnation + 1
            self.stats.refutations += 1
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

    def _kill_link(self, m: Member, reason: str) -> None:
        nid = self._peer_node_id(m.name)
        if not nid or nid == m.node_id:
            self.node.declare_dead(m.name, reason)

    def _emit(self, m: Member, kind: str, previous: str | None, reason: str) -> None:
        ev = MemberEvent(m.name, kind, m.shown_state, previous, m.incarnation, m.node_id, reason)
        log = self.log.warning if kind == DEAD else self.log.info
        log("member " + kind, member=m.name, previous=previous, incarnation=m.incarnation, reason=reason)
        for fn in list(self._callbacks):
            try:
                res = fn(ev)
                if asyncio.iscoroutine(res):
                    self._spawn(res, "aionet-member-callback")
            except Exception as exc:  # a subscriber's bug must not break membership
                self.log.error("member change callback failed", error=repr(exc))
        for s in list(self._streams):
            s._push(ev)

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
            p = self.node._peers.get(peer)
            if p is not None and p.link is not None and p.link.current is not None:
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
        self._wake_rounds(name, alive=True)
        if m.suspected and name not in self._verifying:
            self._clear_suspicion(m, "proof of life")

    def _wake_rounds(self, name: str, alive: bool) -> None:
        for rnd in self._rounds.values():
            if rnd.target == name:
                rnd.alive = rnd.alive or alive
                rnd.wake.set()

    def _clear_suspicion(self, m: Member, why: str) -> None:
        if m.suspected:
            prev = m.shown_state
            m.suspected = ""
            if m.shown_state != prev:
                self._emit(m, m.shown_state, prev, why)

    def _start_verify(self, m: Member, reason: str, show_now: bool = False) -> None:
        """Verify a suspicion. It is shown (state suspect, an event) at once when ``show_now``,
        else only if the first probe does not answer quickly: a peer whose data connection is
        merely back-pressured answers a fresh probe in milliseconds and should not flap."""
        if m.name in self._verifying or not self._running or self._leaving or m.state in (DEAD, LEFT):
            return
        self.stats.suspicions += 1
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
            self._emit(m, SUSPECT, ALIVE, reason)

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
            timeout = self._probe_timeout_for(m)
            t0 = self.clock()
            outcome = await self._probe_round(m, timeout)
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
                self.stats.deaths_declared += 1
                self._apply(Update(name, node_id, m.incarnation, DEAD, tuple(m.addresses)), reason=reason)
                return
            if m.state == ALIVE:  # nobody could confirm either way: gossip the suspicion, let it refute
                self._apply(Update(name, node_id, m.incarnation, SUSPECT, tuple(m.addresses)), reason=reason)
            await asyncio.sleep(self.cfg.interval)

    def _recent_stall_ms(self) -> float:
        """Recurring lateness of our own loop over the last ~10 load samples (reported to peers)."""
        self._stalls.append(self.clock.reset_max())
        return recurring_stall(self._stalls) * 1000.0

    def _probe_timeout_for(self, m: Member) -> float:
        """More patience when a stall is likely to be starvation rather than death: the member
        recently reported its own loop stalling, or our own loop did (a starved host, as with
        Lifeguard's local health). An idle node that freezes is judged at the plain timeout."""
        theirs = m.load.max_stall_ms / 1000.0 if m.load is not None else 0.0
        ours = recurring_stall([self.clock.max_lag, *self._stalls])
        return verify_timeout(self.cfg.probe_timeout, max(theirs, ours))

    async def _probe_round(self, m: Member, timeout: float) -> str:
        """Direct probe plus indirect probes through other members -> ALIVE, DEAD or '' (unknown)."""
        cfg = self.cfg
        deadline = self.clock() + timeout
        self._next_id += 1
        pid = self._next_id
        rnd = self._rounds[pid] = _ProbeRound(m.name)
        direct = self._spawn(
            self._direct_probe(m.name, m.node_id, list(m.addresses), timeout), f"aionet-probe-{m.name}"
        )
        direct.add_done_callback(lambda _t: rnd.wake.set())
        for via in self._pick_intermediaries(m.name, cfg.indirect_probes):
            if self._send(via, [PROBE_REQ, pid, m.name, m.node_id, timeout * 0.8]):
                rnd.asked.add(via)
                self.stats.probes_sent += 1
        # intermediaries probe with 0.8 x the timeout and may answer late when busy: wait a
        # little past the deadline for a first confirmation rather than give up on them
        hard = deadline + timeout / 2
        try:
            while True:
                if rnd.alive or rnd.acks:
                    return ALIVE
                now = self.clock()
                if direct.done():
                    r = direct.result()
                    if r == "alive":
                        return ALIVE
                    if r in ("refused", "replaced"):
                        return DEAD
                    if len(rnd.answered) >= len(rnd.asked):
                        return DEAD if (rnd.nacks or not rnd.asked) else ""
                    if now >= deadline and 2 * rnd.nacks > len(rnd.asked):
                        return DEAD  # most of them could not reach it either
                if now >= hard:
                    break
                rnd.wake.clear()
                waiter = asyncio.ensure_future(rnd.wake.wait())
                try:
                    await self._wait_until(waiter, deadline if now < deadline else hard)
                finally:
                    waiter.cancel()
            if rnd.alive or rnd.acks or (direct.done() and not direct.cancelled() and direct.result() == "alive"):
                return ALIVE
            return DEAD if (rnd.nacks or not rnd.asked) else ""
        finally:
            self.log.debug(
                "probe round detail",
                member=m.name,
                asked=sorted(rnd.asked),
                answered=sorted(rnd.answered),
                acks=rnd.acks,
                nacks=rnd.nacks,
                direct=direct.result()
                if direct.done() and not direct.cancelled() and direct.exception() is None
                else "pending",
            )
            del self._rounds[pid]
            if not direct.done():
                direct.cancel()

    async def _wait_until(self, fut: asyncio.Future[Any], deadline: float) -> bool:
        """Wait for ``fut`` until ``deadline`` on the lag-adjusted clock (a stall of our own
        loop extends the wait instead of eating it). True if ``fut`` finished."""
        while not fut.done():
            remaining = deadline - self.clock()
            if remaining <= 0:
                return False
            expected = self.clock.real() + remaining
            await asyncio.wait([fut], timeout=remaining)
            if not fut.done():
                self.clock.note(expected)
        return True

    def _pick_intermediaries(self, target: str, k: int) -> list[str]:
        cands = [n for n, m in self._members.items() if n != target and m.state == ALIVE and not m.suspected]
        random.shuffle(cands)
        connected = []
        for n in cands:
            p = self.node._peers.get(n)
            if p is not None and p.link is not None and p.link.current is not None and p.link.dead is None:
                connected.append(n)
        return connected[:k]

    def _on_probe_req(self, peer: str, env: list[Any]) -> None:
        """Probe a member on ``peer``'s behalf. Bounded (issue 11): only members we know, at
        their addresses as we know them (never an address or name the asker supplies), one
        probe per member however many ask, at most MAX_SERVED_PROBES members at once; anything
        else is answered -1 ("could not try"), which counts neither way."""
        self.stats.recv_msgs += 1
        if (
            len(env) not in (4, 5)
            or type(env[1]) is not int
            or not isinstance(env[2], str)
            or not isinstance(env[3], str)
            or (len(env) == 5 and type(env[4]) not in (int, float))
        ):
            raise ProtocolError("malformed probe request")
        if not self._running or self._leaving:
            return
        pid, target, node_id = env[1], env[2], env[3]
        timeout = self.cfg.probe_timeout * 0.8
        if len(env) == 5:
            timeout = min(max(float(env[4]), 0.01), 4 * self.cfg.probe_timeout)
        m = self._members.get(target)
        if m is None or m.node_id != node_id or m.state not in (ALIVE, SUSPECT) or not m.addresses:
            self._send(peer, [PROBE_RSP, pid, -1])
            return
        waiting = self._served.get(target)
        if waiting is not None:  # already probing it: this asker gets the same answer
            waiting[peer] = pid
            return
        if len(self._served) >= MAX_SERVED_PROBES:
            self._send(peer, [PROBE_RSP, pid, -1])
            return
        self._served[target] = {peer: pid}
        self._spawn(self._serve_probe(target, node_id, list(m.addresses), timeout), f"aionet-probe-for-{target}")

    async def _serve_probe(self, target: str, node_id: str, addrs: list[str], timeout: float) -> None:
        result = -1
        try:
            r = await self._direct_probe(target, node_id, addrs, timeout)
            result = 1 if r == "alive" else 0
        finally:
            for requester, pid in self._served.pop(target, {}).items():
                self._send(requester, [PROBE_RSP, pid, result])

    def _on_probe_rsp(self, peer: str, env: list[Any]) -> None:
        self.stats.recv_msgs += 1
        if len(env) != 3 or type(env[1]) is not int or type(env[2]) is not int:
            raise ProtocolError("malformed probe response")
        rnd = self._rounds.get(env[1])
        if rnd is None or peer not in rnd.asked or peer in rnd.answered:
            return
        rnd.answered.add(peer)
        if env[2] == 1:
            rnd.acks += 1
        elif env[2] == 0:
            rnd.nacks += 1
        rnd.wake.set()

    async def _direct_probe(self, name: str, node_id: str, addresses: list[str], timeout: float) -> str:
        """Dial and exchange HELLOs only: 'alive', 'replaced' (another process answers to the
        name), 'refused' (nothing listens), 'hung' (connected, no answer) or 'unreachable'.
        Retries back off (PROBE_REUSE doubling to MAX_PROBE_PAUSE): a handful of connections
        per probe, not one every few milliseconds."""
        deadline = self.clock() + timeout
        result = "unreachable"
        pause = PROBE_REUSE
        while self.clock() < deadline and addresses:
            refused = 0
            for url in addresses:
                r = await self._probe_url(url, name, node_id, deadline)
                if r in ("alive", "replaced"):
                    return r
                if r == "refused":
                    refused += 1
                elif r == "hung":
                    result = "hung"
            if refused == len(addresses):
                return "refused"
            sleeping = asyncio.ensure_future(asyncio.sleep(pause))
            try:
                await self._wait_until(sleeping, deadline)
            finally:
                sleeping.cancel()
            pause = min(2 * pause, MAX_PROBE_PAUSE)
        return result

    async def _probe_url(self, url: str, name: str, node_id: str, deadline: float) -> str:
        """One probe of ``url`` expecting member ``name``/``node_id``. Callers probing the same
        address share one connection (and its result for PROBE_REUSE s after it ends), and at
        most MAX_PROBE_CONNECTIONS are open at once: no peer can make us open connections to an
        address faster than one per PROBE_REUSE s."""
        task = self._exchanges.get(url)
        if task is None:
            if sum(not t.done() for t in self._exchanges.values()) >= MAX_PROBE_CONNECTIONS:
                return "unreachable"
            task = self._spawn(self._probe_exchange(url, deadline), "aionet-probe-conn")
            self._exchanges[url] = task
            task.add_done_callback(lambda t, u=url: self._reuse_for_a_while(u, t))
        if not await self._wait_until(task, deadline):
            return "unreachable"
        if task.cancelled():
            return "error"
        status, reply_name, reply_node_id = task.result()
        if status != "answered":
            return status
        if reply_name != name:
            return "error"
        return "alive" if reply_node_id == node_id else "replaced"

    def _reuse_for_a_while(self, url: str, task: asyncio.Task[Any]) -> None:
        def forget() -> None:
            if self._exchanges.get(url) is task:
                del self._exchanges[url]

        if task.cancelled():
            forget()
        else:
            asyncio.get_running_loop().call_later(PROBE_REUSE, forget)

    async def _probe_exchange(self, url: str, deadline: float) -> tuple[str, str, str]:
        """Connect to ``url``, send a probe HELLO, check the answer proves the cluster token.
        -> (status, name, node id): status 'answered' (name and node id are the answerer's,
        token proven), 'refused', 'unreachable', 'hung' or 'error'. Owns its helper futures:
        whatever ends it (timeout, cancellation, a closed connection), none is left with an
        unretrieved exception and the connection is closed."""
        node = self.node
        try:
            transport = node._transport(url)
        except AionetError:
            return ("unreachable", "", "")
        connecting = asyncio.ensure_future(transport.connect(url, timeout=None))
        receiving: asyncio.Future[Any] | None = None
        conn = None
        try:
            if not await self._wait_until(connecting, deadline):
                return ("unreachable", "", "")
            try:
                conn = connecting.result()
            except (AionetError, OSError) as exc:
                return ("refused" if _refused(exc, url) else "error", "", "")
            nonce = handshake.new_nonce()
            hello = handshake.Hello(
                handshake.PROTOCOL_VERSION,
                node.name,
                node.node_id,
                self._my_addresses(),
                {"probe": True},
                {},
                nonce,
                b"",
                {},
            )
            await conn.send([hello.encode()])
            receiving = asyncio.ensure_future(conn.recv())
            if not await self._wait_until(receiving, deadline):
                return ("hung", "", "")
            reply = handshake.parse(receiving.result())
            token = node._token
            # the acceptor signs (its nonce order, acceptor name, dialer name): see Node._accept_handshake
            if token and not handshake.verify(
                handshake.mac(token, b"A", nonce, reply.nonce, reply.name, node.name), reply.mac
            ):
                self.log.warning("probe answer does not prove the cluster token", url=url, answerer=reply.name)
                return ("error", "", "")
            return ("answered", reply.name, reply.node_id)
        except (AionetError, OSError):
            return ("error", "", "")
        finally:
            for fut in (connecting, receiving):
                if fut is not None:
                    _drop(fut)
            if conn is None and connecting.done() and not connecting.cancelled() and connecting.exception() is None:
                conn = connecting.result()  # connected just as we gave up
            if conn is not None:
                conn.abort()


def _drop(fut: asyncio.Future[Any]) -> None:
    """Cancel a helper future we are done with, and swallow what it ends with (it may already
    have failed, e.g. the connection closed just as we stopped waiting)."""
    if fut.done():
        if not fut.cancelled():
            fut.exception()
        return
    fut.cancel()
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())


def _validate(cfg: Any) -> None:
    for key in ("interval", "min_std", "probe_timeout", "suspect_timeout", "load_interval"):
        if getattr(cfg, key) <= 0:
            raise ConfigError(f"heartbeat.{key} must be positive")
    if cfg.acceptable_pause < 0 or cfg.phi_threshold <= 0 or cfg.forget_after < 0:
        raise ConfigError("heartbeat.acceptable_pause/forget_after must be >= 0 and phi_threshold > 0")
    for key in ("fanout", "indirect_probes", "max_piggyback"):
        if getattr(cfg, key) < 0 or (key == "fanout" and cfg.fanout < 1):
            raise ConfigError(f"heartbeat.{key} must be {'at least 1' if key == 'fanout' else 'non-negative'}")


__all__ = [
    "ALIVE",
    "DEAD",
    "LEFT",
    "MEMBERS_SERVICE",
    "STATES",
    "SUSPECT",
    "GossipQueue",
    "Member",
    "MemberEvent",
    "MemberEventStream",
    "Membership",
    "MembershipStats",
    "Update",
    "gossip_budget",
    "recurring_stall",
    "ring_predecessors",
    "ring_successors",
    "supersedes",
    "verify_timeout",
]
