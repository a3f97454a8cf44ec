"""Membership's pure policies, fed times and records: the suspicion check, dial spacing,
load relays, local health and message validation. No sockets, no sleeps."""

import math

import pytest

from aionet.errors import ProtocolError
from aionet.membership.awareness import Awareness
from aionet.membership.detector import LagClock, PhiAccrualDetector
from aionet.membership.gossip import LOADS_PER_MESSAGE, LoadRelay
from aionet.membership.load import LoadReport
from aionet.membership.probe import DialPolicy
from aionet.membership.suspicion import CheckConfig, Forget, Notify, check
from aionet.membership.table import ALIVE, DEAD, LEFT, SUSPECT, Member, StartVerify
from aionet.membership.wire import (
    HB,
    PROBE_REQ,
    parse_beat,
    parse_gossip,
    parse_load_entry,
    parse_probe_req,
    parse_probe_rsp,
)

CFG = CheckConfig(phi_threshold=8.0, interval=0.2, suspect_timeout=3.0, forget_after=60.0)


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def member(name, state=ALIVE, **kw):
    return Member(name, f"id-{name}", 1, state, ["tcp://x:1"], since=kw.pop("since", 100.0), **kw)


def detector(clock):
    return PhiAccrualDetector(clock, expected_interval=0.2, min_std=0.05)


def test_a_silent_heartbeat_target_is_verified_once():
    clock = Clock()
    members = {"b": member("b")}
    dets = {"b": detector(clock)}
    assert check(members, dets, set(), CFG, now=clock(), real_now=clock())[0] == []
    clock.t += 3.0
    actions, max_phi = check(members, dets, set(), CFG, now=clock(), real_now=clock())
    assert [type(a) for a in actions] == [StartVerify] and actions[0].name == "b"
    assert max_phi >= CFG.phi_threshold
    assert check(members, dets, {"b"}, CFG, now=clock(), real_now=clock())[0] == []  # already verifying


def test_a_member_found_alive_gets_a_cooldown_unless_it_answers_again():
    clock = Clock()
    m = member("b")
    dets = {"b": detector(clock)}
    clock.t += 3.0
    m.verified_at = clock.t - 0.5  # a probe just found it alive
    assert check({"b": m}, dets, set(), CFG, now=clock(), real_now=clock())[0] == []
    clock.t += CFG.cooldown
    assert [type(a) for a in check({"b": m}, dets, set(), CFG, now=clock(), real_now=clock())[0]] == [StartVerify]


def test_gossiped_suspects_are_told_when_they_answer_and_verified_when_they_do_not():
    talking = member("b", SUSPECT, last_seen=99.9)
    silent = member("c", SUSPECT, suspect_at=90.0)
    fresh = member("d", SUSPECT, suspect_at=99.0)
    actions, _ = check({"b": talking, "c": silent, "d": fresh}, {}, set(), CFG, now=100.0, real_now=100.0)
    assert actions == [Notify("b"), StartVerify("c", "suspected for 3.0 s without refuting")]


def test_a_suspect_the_detector_just_flagged_is_not_verified_twice():
    clock = Clock()
    m = member("b", SUSPECT, suspect_at=0.0)
    dets = {"b": detector(clock)}
    clock.t += 3.0
    actions, _ = check({"b": m}, dets, set(), CFG, now=clock(), real_now=clock())
    assert [type(a) for a in actions] == [StartVerify]


def test_dead_and_left_members_are_forgotten_after_forget_after():
    members = {"b": member("b", DEAD, since=0.0), "c": member("c", LEFT, since=50.0), "d": member("d", DEAD)}
    actions, _ = check(members, {}, set(), CFG, now=100.0, real_now=100.0)
    assert actions == [Forget("b")]


def test_the_larger_name_waits_for_the_smaller_to_dial():
    small, large = DialPolicy("a", 0.2), DialPolicy("z", 0.2)
    assert small.want("m", ["tcp://m:1"], 10.0)
    assert not large.want("m", ["tcp://m:1"], 10.0)
    assert not large.want("m", ["tcp://m:1"], 10.5)
    assert large.want("m", ["tcp://m:1"], 10.61)
    assert not small.want("m", ["tcp://m:1"], 10.5)  # one dial per max(1 s, 5 intervals)
    assert small.want("m", ["tcp://m:1"], 11.01)
    assert small.connected("m") and not small.connected("m")


def test_members_naming_one_address_share_its_dial_budget():
    """Issue 11: made-up members all naming one address must not multiply the dials to it."""
    p = DialPolicy("a", 0.2)
    assert p.want("fake-1", ["tcp://victim:1"], 10.0)
    assert not any(p.want(f"fake-{i}", ["tcp://victim:1"], 10.0) for i in range(2, 100))
    assert p.want("fake-2", ["tcp://victim:1"], 11.5)


def test_load_relay_sends_our_report_once_per_version_and_rotates_others():
    relay = LoadRelay()
    rep = LoadReport.unknown()
    assert relay.own_for("b", rep) is not None
    assert relay.own_for("b", rep) is None
    assert relay.own_for("c", rep) is not None
    members = {}
    for n in "bcde":
        m = member(n)
        m.load, m.load_time = rep, 99.0
        members[n] = m
    members["e"].state = DEAD
    seen = set()
    for _ in range(4):
        out = relay.others_for("b", members, 100.0)
        assert len(out) == LOADS_PER_MESSAGE
        assert all(e[0] in ("c", "d") and e[2] == 1000 for e in out)  # not b itself, not the dead
        seen |= {e[0] for e in out}
    assert seen == {"c", "d"}


def test_recurring_stalls_buy_more_time_a_single_one_does_not():
    t = Clock(0.0)
    lag = LagClock(t)
    aw = Awareness(lag)
    assert aw.probe_timeout(1.0, 0.0) == 1.0
    lag.note(0.0, 0.4)  # one 0.4 s stall
    aw.sample_stall_ms()
    assert aw.probe_timeout(1.0, 0.0) == pytest.approx(1.0)
    lag.note(1.0, 1.4)  # it recurs
    assert aw.sample_stall_ms() == pytest.approx(400.0)
    assert aw.probe_timeout(1.0, 0.0) == pytest.approx(1.6)
    assert aw.probe_timeout(1.0, 5000.0) == 2.0  # at most twice the plain timeout


@pytest.mark.parametrize(
    "env",
    [[HB], [HB, "1", 2, None, [], []], [HB, 1, 2, None, {}, []], [HB, 1, 2, {"bad": 1}, [], []]],
)
def test_malformed_heartbeats_are_protocol_errors(env):
    with pytest.raises(ProtocolError):
        parse_beat(env)


def test_message_validation():
    assert parse_beat([HB, 1, 2, None, [], []]) == (1, 2, None, [], [])
    assert parse_probe_req([PROBE_REQ, 1, "b", "id", 2]) == (1, "b", "id", 2.0)
    assert parse_probe_req([PROBE_REQ, 1, "b", "id"]) == (1, "b", "id", None)
    assert parse_probe_rsp([14, 1, -1]) == (1, -1)
    assert parse_gossip([15, [], []]) == ([], [])
    for bad in (
        lambda: parse_probe_req([PROBE_REQ, 1, "b", "id", "2"]),
        lambda: parse_probe_rsp([14, 1]),
        lambda: parse_gossip([15, {}, []]),
        lambda: parse_load_entry(["b", "id", 1.5, {}]),
    ):
        with pytest.raises(ProtocolError):
            bad()
    assert math.isinf(member("b").verified_at)
