"""Membership's timing decisions on fed time (aionet.testing.FakeClock): silence into suspicion,
our own stalls not counted against peers, suspicion expiry, cooldowns, refutation and death
after ``suspect_timeout``. These replace live-cluster tests that slept 4-6 s each; the live
ones left in tests/system/test_membership.py check the wiring over real sockets.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aionet.config import HeartbeatSection
from aionet.membership import Membership
from aionet.membership.awareness import Awareness
from aionet.membership.detector import LagClock, PhiAccrualDetector
from aionet.membership.suspicion import CheckConfig, Notify, check
from aionet.membership.table import ALIVE, DEAD, SUSPECT, MemberTable, Refuted, StartVerify, Update
from aionet.testing import FakeClock

HB = 0.2  # heartbeat interval
CFG = CheckConfig(phi_threshold=8.0, interval=HB, suspect_timeout=5.0, forget_after=300.0)


class Watch:
    """One watcher's view of member ``b``: a table, b's detector, on a lag clock over fake time."""

    def __init__(self) -> None:
        self.fake = FakeClock(1000.0)
        self.lag = LagClock(self.fake, slack=HB / 8)
        self.table = MemberTable()
        self.table.merge(Update("b", "id-b", 1, ALIVE, ("tcp://b:1",)), now=self.fake(), adj_now=self.lag())
        self.det = PhiAccrualDetector(self.lag, expected_interval=HB, min_std=0.05, acceptable_pause=0.1)

    def beats(self, seconds: float) -> None:
        """b answers every heartbeat for ``seconds``."""
        for _ in range(round(seconds / HB)):
            self.fake.advance(HB)
            self.det.heartbeat()

    def stall(self, seconds: float) -> None:
        """Our own loop is blocked: the watch task wakes ``seconds`` late and notes it."""
        expected = self.fake() + 0.05
        self.fake.advance(seconds)
        self.lag.note(expected)

    def check(self) -> list[Any]:
        actions, _ = check(self.table.members, {"b": self.det}, set(), CFG, now=self.lag(), real_now=self.fake())
        return actions


def test_a_silent_peer_is_suspected_after_a_detection_time_not_before():
    w = Watch()
    w.beats(5.0)
    w.fake.advance(0.3)
    assert w.check() == []
    w.fake.advance(1.2)
    assert [type(a) for a in w.check()] == [StartVerify]


def test_our_blocked_loop_is_not_counted_against_peers():
    """Was test_blocked_event_loop_does_not_accuse_peers (4.5 s per transport): a 2.5 s stall of
    our own loop, noted by the lag-watch task, does not raise b's phi."""
    w = Watch()
    w.beats(5.0)
    w.stall(2.5)
    assert w.lag.stalled > 2.4
    assert w.check() == []
    # the same silence not explained by a stall of ours is a suspicion (the test can fail)
    w.fake.advance(2.5)
    assert [type(a) for a in w.check()] == [StartVerify]


def test_a_gossiped_suspicion_expires_into_a_verification_on_the_adjusted_clock():
    w = Watch()
    w.table.merge(Update("b", "id-b", 1, SUSPECT, ("tcp://b:1",)), now=w.fake(), adj_now=w.lag())
    w.beats(4.8)  # b keeps answering someone's heartbeats, not ours: no last_seen
    assert w.check() == []
    w.stall(3.0)  # our stall does not bring the expiry closer
    assert w.check() == []
    w.beats(0.4)
    assert [(type(a), a.reason) for a in w.check()] == [(StartVerify, "suspected for 5.0 s without refuting")]
    # a suspect that answers us directly is told so it can refute, not verified
    w.table.members["b"].last_seen = w.fake()
    assert [type(a) for a in w.check()] == [Notify]


def test_a_peer_proven_alive_is_re_verified_only_after_the_cooldown():
    """Was test_backpressured_peer_is_not_declared_dead's logic: b's heartbeats are stuck
    behind a full data connection, but each probe proves it alive; between probes silence
    alone starts nothing, and after the cooldown it is probed again rather than declared."""
    w = Watch()
    w.beats(5.0)
    w.fake.advance(2.0)
    assert [type(a) for a in w.check()] == [StartVerify]
    w.table.members["b"].verified_at = w.lag()  # the probe answered
    w.fake.advance(CFG.cooldown - 0.1)
    assert w.check() == []
    w.fake.advance(0.1)
    assert [type(a) for a in w.check()] == [StartVerify]


def test_a_refutation_lifts_suspicion_and_death():
    w = Watch()
    _, eff = w.table.merge(Update("b", "id-b", 1, SUSPECT), now=w.fake(), adj_now=w.lag())
    w.fake.advance(1.0)
    changed, eff = w.table.merge(Update("b", "id-b", 2, ALIVE), now=w.fake(), adj_now=w.lag())
    assert changed and any(isinstance(e, Refuted) for e in eff)
    assert w.table.members["b"].state == ALIVE and w.table.members["b"].since == w.fake()
    w.table.merge(Update("b", "id-b", 2, DEAD), now=w.fake(), adj_now=w.lag())
    w.fake.advance(1.0)
    changed, eff = w.table.merge(Update("b", "id-b", 3, ALIVE), now=w.fake(), adj_now=w.lag())
    assert changed and w.table.members["b"].state == ALIVE


def test_recurring_stalls_of_ours_lengthen_verification_a_single_one_does_not():
    fake = FakeClock()
    aw = Awareness(LagClock(fake, slack=0.025))

    def period(stall: float) -> None:
        expected = fake() + 0.05
        fake.advance(0.05 + stall)
        aw.clock.note(expected)
        aw.sample_stall_ms()

    period(0.8)
    for _ in range(3):
        period(0.0)
    assert aw.probe_timeout(0.5, 0.0) == 0.5
    period(0.3)
    period(0.3)
    assert aw.probe_timeout(0.5, 0.0) > 0.9


# ---------------------------------------------------------------- the service, on fed time
class Ports:
    """Fake Messaging, ControlChannel and PeerConnectivity: records what membership does."""

    name, node_id = "a", "id-a"
    token = None

    def __init__(self) -> None:
        self.declared: list[tuple[str, str]] = []
        self.sent: list[tuple[str, list[Any]]] = []

    def add_service(self, name: str, fn: Any, *, cancellable: bool = True) -> None: ...
    def add_control_handler(self, kind: int, fn: Any) -> None: ...
    def on_connection_event(self, fn: Any) -> None: ...
    def send_control(self, peer: str, env: list[Any]) -> bool:
        self.sent.append((peer, env))
        return True

    def known_peers(self) -> dict[str, list[str]]:
        return {}

    def connected(self, name: str) -> bool:
        return True

    def peer_node_id(self, name: str) -> str:
        return ""

    def learn_peers(self, table: dict[str, list[str]], hearsay: bool = True) -> None: ...
    def declare_dead(self, peer: str, reason: str) -> None:
        self.declared.append((peer, reason))

    def member_left(self, peer: str, reason: str) -> None: ...

    def advertised(self) -> list[str]:
        return ["inproc://a"]


def _service(clock: FakeClock) -> tuple[Membership, Ports]:
    ports = Ports()
    cfg = HeartbeatSection(interval=0.001, probe_timeout=0.5, suspect_timeout=5.0)
    ms = Membership(cfg, messaging=ports, control=ports, peers=ports, clock=clock)  # type: ignore[arg-type]
    ms._apply(Update("b", "id-b", 1, ALIVE, ("inproc://b",)), reason="test")
    return ms, ports


async def test_an_unconfirmable_suspicion_is_death_after_suspect_timeout_of_fed_time():
    """Nobody can confirm b either way: the verifier gossips the suspicion, keeps probing, and
    declares b dead once ``suspect_timeout`` has passed on the injected clock (no real wait)."""
    clock = FakeClock(50.0)
    ms, ports = _service(clock)
    events: list[Any] = []
    ms.on_member_change(events.append)
    rounds = 0

    async def unknown(m: Any, timeout: float, indirect: int) -> str:
        nonlocal rounds
        rounds += 1
        clock.advance(timeout)
        return ""

    ms.prober.probe_round = unknown  # type: ignore[method-assign]
    await asyncio.wait_for(ms._verify_rounds("b", "id-b", "silent"), 5)
    assert [e.kind for e in events] == ["suspect", "dead"]
    assert ms.state_of("b") == "dead" and ports.declared == [("b", "silent")]
    assert rounds == 10 and clock() == 55.0  # 5 s of 0.5 s rounds, on the fake clock only
    assert ms.stats().deaths_declared == 1


async def test_a_probe_that_answers_ends_the_verification_alive():
    clock = FakeClock(50.0)
    ms, ports = _service(clock)
    outcomes = iter(["", "", ALIVE])

    async def round_(m: Any, timeout: float, indirect: int) -> str:
        clock.advance(timeout)
        return next(outcomes)

    ms.prober.probe_round = round_  # type: ignore[method-assign]
    await asyncio.wait_for(ms._verify_rounds("b", "id-b", "silent"), 5)
    m = ms.table.members["b"]
    assert m.state == SUSPECT and m.verified_at == ms.clock() == 51.5  # told to refute, never dead
    assert ports.declared == [] and ms.stats().deaths_declared == 0
    assert any(peer == "b" for peer, _ in ports.sent)  # b heard it is suspected (so it refutes)


async def test_a_probe_that_finds_nothing_listening_is_death_in_the_first_round(monkeypatch):
    """The SIGKILL path: the connection dropped, the direct probe is refused (GONE) and the
    responder is silent (it exits soon after its node). Dead in one round, on no fed time and
    no responder grace (an hour here: waiting for it would break the 5 s bound)."""
    from aionet.membership import liveness
    from aionet.membership.probe import GONE

    monkeypatch.setattr(liveness, "PING_GRACE", 3600.0)
    clock = FakeClock(50.0)
    ms, ports = _service(clock)
    rounds = 0

    async def gone(m: Any, timeout: float, indirect: int) -> str:
        nonlocal rounds
        rounds += 1
        return GONE

    async def silent(extra: Any, timeout: float) -> None:
        await asyncio.Event().wait()

    ms.prober.probe_round = gone  # type: ignore[method-assign]
    ms.liveness.check = silent  # type: ignore[method-assign]
    await asyncio.wait_for(ms._verify_rounds("b", "id-b", "connection closed"), 5)
    assert ms.state_of("b") == "dead" and rounds == 1 and clock() == 50.0
    assert ports.declared == [("b", liveness.NOTHING_LISTENS)]


async def test_a_refused_direct_probe_is_conclusive_a_hung_one_is_not():
    """probe_round's outcomes: nothing listening (refused) or another process under the name
    (replaced) -> GONE; a connection that hangs, nobody else to ask -> DEAD, which a verifier
    still lets the member's responder overrule (a loop blocked by user code hangs probes)."""
    from aionet.membership.probe import GONE

    ms, _ports = _service(FakeClock(50.0))
    for direct, want in (("refused", GONE), ("replaced", GONE), ("hung", DEAD), ("alive", ALIVE)):

        async def probe(name: str, node_id: str, addresses: list[str], timeout: float, r: str = direct) -> str:
            return r

        ms.prober._direct_probe = probe  # type: ignore[method-assign]
        out = await asyncio.wait_for(ms.prober.probe_round(ms.table.members["b"], 0.5, 3), 5)
        assert out == want, direct
