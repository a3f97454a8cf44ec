"""Pure failure-detection pieces: phi-accrual, the lag-aware clock, gossip precedence and
queueing, the heartbeat ring. No sockets, no sleeps: time is a number we move by hand."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.errors import ProtocolError
from aionet.membership import (
    ALIVE,
    DEAD,
    LEFT,
    SUSPECT,
    GossipQueue,
    Update,
    gossip_budget,
    recurring_stall,
    ring_predecessors,
    ring_successors,
    supersedes,
    verify_timeout,
)
from aionet.membership.detector import LagClock, PhiAccrualDetector, phi_of
from aionet.membership.load import GpuLoad, LoadReport


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def detector(clock, interval=0.2, min_std=0.05, pause=0.0):
    return PhiAccrualDetector(clock, expected_interval=interval, min_std=min_std, acceptable_pause=pause)


# ---------------------------------------------------------------- phi
def test_phi_is_low_right_after_a_heartbeat_and_grows_with_silence():
    clk = FakeClock()
    d = detector(clk)
    for _ in range(20):
        clk.t += 0.2
        d.heartbeat()
    assert d.phi() < 0.01
    phis = []
    for _ in range(20):
        clk.t += 0.05
        phis.append(d.phi())
    assert phis == sorted(phis)
    assert phis[-1] > 8


def test_regular_peer_crosses_threshold_where_the_normal_model_says():
    clk = FakeClock()
    d = detector(clk, pause=0.1)
    for _ in range(50):
        clk.t += 0.2
        d.heartbeat()
    # perfectly regular: std is the floor, so phi 8 is mean + pause + ~5.6 sigma
    t8 = d.silence_for(8.0)
    assert 0.2 + 0.1 + 5.0 * 0.05 < t8 < 0.2 + 0.1 + 6.0 * 0.05
    clk.t += t8 - 0.01
    assert d.phi() < 8
    clk.t += 0.02
    assert d.phi() > 8


def test_jittery_peer_gets_more_slack_than_a_regular_one():
    clk_a, clk_b = FakeClock(), FakeClock()
    regular, jittery = detector(clk_a), detector(clk_b)
    for i in range(100):
        clk_a.t += 0.2
        regular.heartbeat()
        clk_b.t += 0.2 + (0.15 if i % 2 else -0.15)
        jittery.heartbeat()
    assert jittery.std > regular.std
    assert jittery.silence_for(8) > regular.silence_for(8) + 0.3


def test_new_detector_judges_against_the_configured_interval():
    clk = FakeClock()
    d = detector(clk)
    assert d.mean == pytest.approx(0.2)
    clk.t += 0.1
    assert d.phi() < 1
    clk.t += 2.0
    assert d.phi() > 8  # a peer that never answers is eventually suspected


def test_history_is_a_sliding_window():
    clk = FakeClock()
    d = PhiAccrualDetector(clk, expected_interval=0.2, min_std=0.01, window=10)
    for _ in range(50):
        clk.t += 1.0
        d.heartbeat()
    assert d.mean == pytest.approx(1.0)
    assert d.std == pytest.approx(0.0, abs=1e-6)


def test_phi_is_finite_for_absurd_silences():
    assert math.isfinite(phi_of(1e6, 0.2, 0.05))
    assert phi_of(1e6, 0.2, 0.05) > phi_of(1e3, 0.2, 0.05) > 8
    assert phi_of(0.0, 0.2, 0.05) == pytest.approx(0.0, abs=1e-3)


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError):
        PhiAccrualDetector(FakeClock(), expected_interval=0, min_std=0.05)
    with pytest.raises(ValueError):
        phi_of(1.0, 0.2, 0.0)


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.floats(0.001, 5.0), min_size=1, max_size=60),
    t1=st.floats(0.0, 100.0),
    t2=st.floats(0.0, 100.0),
)
def test_phi_is_non_negative_finite_and_monotone_in_silence(gaps, t1, t2):
    clk = FakeClock()
    d = detector(clk)
    for g in gaps:
        clk.t += g
        d.heartbeat()
    base = clk.t
    lo, hi = sorted((t1, t2))
    p_lo, p_hi = d.phi(base + lo), d.phi(base + hi)
    assert 0.0 <= p_lo <= p_hi
    assert math.isfinite(p_hi)


# ---------------------------------------------------------------- lag clock
def test_lag_clock_subtracts_a_stall_once_even_when_two_tasks_report_it():
    real = FakeClock(0.0)
    clk = LagClock(real, slack=0.0)
    real.t = 3.0  # the loop was blocked from 1.0 to 3.0
    clk.note(1.0)  # task A wanted to wake at 1.0
    clk.note(1.05)  # task B at 1.05: the same stall
    assert clk.stalled == pytest.approx(2.0)
    assert clk() == pytest.approx(1.0)
    real.t = 3.2
    clk.note(3.2)  # on time
    assert clk.stalled == pytest.approx(2.0)


def test_lag_clock_ignores_lateness_within_slack_and_tracks_lag():
    real = FakeClock(0.0)
    clk = LagClock(real, slack=0.002)
    for i in range(1, 11):
        real.t = i * 0.05 + 0.001
        clk.note(i * 0.05)
    assert clk.stalled == 0.0
    assert 0 < clk.lag < 0.002
    assert clk.reset_max() == pytest.approx(0.001)
    assert clk.max_lag == 0.0


def test_a_node_whose_own_loop_was_blocked_does_not_accuse_its_peer():
    """Heartbeats stop arriving because *we* were frozen: the adjusted clock does not move."""
    real = FakeClock(0.0)
    clk = LagClock(real)
    d = detector(clk)
    for _ in range(20):
        real.t += 0.2
        clk.note(real.t)
        d.heartbeat()
    real.t += 3.0  # our loop blocked for 3 s; the watch task wakes late
    clk.note(real.t - 3.0 + 0.05)
    assert d.phi() < 1.0
    # but a peer that stays silent after we recovered is still caught
    for _ in range(30):
        real.t += 0.05
        clk.note(real.t)
    assert d.phi() > 8


# ---------------------------------------------------------------- gossip rules
def U(state, inc=5, node="n1", name="x"):
    return Update(name, node, inc, state, ("tcp://h:1",))


def test_higher_incarnation_wins_whatever_the_state():
    assert supersedes(U(ALIVE, 6), U(DEAD, 5))
    assert supersedes(U(ALIVE, 6), U(LEFT, 5))
    assert not supersedes(U(DEAD, 4), U(ALIVE, 5))


def test_equal_incarnation_stronger_state_wins():
    assert supersedes(U(SUSPECT), U(ALIVE))
    assert supersedes(U(DEAD), U(SUSPECT))
    assert supersedes(U(LEFT), U(DEAD))
    assert not supersedes(U(ALIVE), U(SUSPECT))  # only the node itself lifts a suspicion
    assert not supersedes(U(ALIVE), U(ALIVE))


def test_restarted_process_replaces_the_old_one_by_incarnation():
    old = U(DEAD, 1000, node="old")
    assert supersedes(U(ALIVE, 2000, node="new"), old)
    assert not supersedes(U(ALIVE, 1000, node="new"), old)  # a tie between processes keeps the old
    assert supersedes(U(ALIVE), None)


@given(
    st.integers(0, 10),
    st.sampled_from([ALIVE, SUSPECT, DEAD, LEFT]),
    st.integers(0, 10),
    st.sampled_from([ALIVE, SUSPECT, DEAD, LEFT]),
)
def test_precedence_is_a_strict_order(i1, s1, i2, s2):
    a, b = U(s1, i1), U(s2, i2)
    assert not (supersedes(a, b) and supersedes(b, a))
    if (i1, s1) != (i2, s2):
        assert supersedes(a, b) or supersedes(b, a)


def test_update_wire_roundtrip_and_validation():
    u = Update("x", "id", 7, SUSPECT, ("tcp://a:1", "tcp://b:2"))
    assert Update.from_wire(u.to_wire()) == u
    for bad in (
        None,
        [],
        ["x", "id", 7, 9, []],
        ["", "id", 1, 0, []],
        ["x", "id", -1, 0, []],
        ["x", "id", 1, 0, "tcp://a"],
        ["x", 5, 1, 0, []],
        ["x", "id", 1.5, 0, []],
    ):
        with pytest.raises(ProtocolError):
            Update.from_wire(bad)


def test_gossip_queue_sends_least_sent_first_and_retires_after_budget():
    q = GossipQueue()
    q.push(U(ALIVE, name="a"))
    q.push(U(ALIVE, name="b"))
    assert {u.name for u in q.take(2, budget=2)} == {"a", "b"}
    q.push(U(DEAD, name="c"))
    first = q.take(1, budget=2)
    assert [u.name for u in first] == ["c"]
    q.take(2, budget=2)  # all three were sent once: two of them reach their budget of 2
    assert len(q) == 1
    q.push(U(SUSPECT, name="c"))  # newer news about c replaces the old and starts over
    assert q.take(5, budget=2)[0].state == SUSPECT
    assert gossip_budget(1) < gossip_budget(30) < gossip_budget(1000)


def test_ring_gives_every_node_fanout_watchers():
    names = [f"n{i:02d}" for i in range(10)]
    watchers = {n: 0 for n in names}
    for me in names:
        succ = ring_successors(names, me, 3)
        assert len(succ) == 3 and me not in succ
        for s in succ:
            watchers[s] += 1
        assert set(ring_predecessors(names, me, 3)) == {n for n in names if me in ring_successors(names, n, 3)}
    assert set(watchers.values()) == {3}
    assert ring_successors(["b"], "a", 3) == ["b"]
    assert ring_successors([], "a", 3) == []


# ---------------------------------------------------------------- load reports
def test_load_report_wire_roundtrip():
    rep = LoadReport(
        seq=3,
        cpu_percent=12.5,
        process_cpu_percent=3.0,
        cpu_count=2,
        memory_used=10,
        memory_total=20,
        rss=5,
        tasks=7,
        loop_lag_ms=1.25,
        max_stall_ms=30.0,
        load_avg=0.5,
        gpus=(GpuLoad(0, "A100", 1, 2, 50.0, 64.0, 250.5), GpuLoad(1, "A100", 1, 2, None)),
        extra={"queued": 4},
    )
    back = LoadReport.from_wire(rep.to_wire())
    assert back == rep
    assert back.devices()["gpus"][1]["utilization"] is None
    assert back.devices()["gpus"][0]["temperature_c"] == 64.0 and back.devices()["gpus"][0]["power_w"] == 250.5
    # a node from before temperature and power sends five fields per GPU
    assert GpuLoad.from_wire([0, "A100", 1, 2, 50.0]) == GpuLoad(0, "A100", 1, 2, 50.0, None, None)
    assert LoadReport().devices()["gpus"] == []
    with pytest.raises((TypeError, KeyError, ValueError)):
        LoadReport.from_wire({"s": 1})


def test_a_member_that_recently_stalled_gets_more_time_to_answer_a_probe():
    assert verify_timeout(0.5, 0.0) == pytest.approx(0.5)  # idle: the plain timeout
    assert verify_timeout(0.5, 0.2) == pytest.approx(0.8)
    assert verify_timeout(0.5, 30.0) == pytest.approx(1.0)  # at most twice the timeout
    # one long stall (a node frozen once and resumed) is not starvation; recurring ones are
    assert recurring_stall([0.01, 2.0, 0.02]) == pytest.approx(0.02)
    assert recurring_stall([0.4, 0.01, 0.6, 0.3]) == pytest.approx(0.4)
    assert recurring_stall([]) == 0.0
