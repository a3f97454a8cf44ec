"""Heartbeat round trips from fed-in send and echo times (virtual time, no sockets)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aionet.membership.rtt import GAIN, MAX_OUTSTANDING, RttEstimator
from aionet.testing.clock import FakeClock


def test_an_echo_gives_the_time_since_its_heartbeat_was_sent():
    clock = FakeClock()
    r = RttEstimator()
    r.sent("b", 7, clock())
    clock.advance(0.004)
    assert r.echoed("b", 7, clock()) == pytest.approx(0.004)
    assert r.smoothed() == {"b": pytest.approx(0.004)}  # the first sample is the estimate


def test_smoothing_follows_rfc6298_and_one_outlier_moves_it_an_eighth():
    clock = FakeClock()
    r = RttEstimator()
    for seq in range(20):
        r.sent("b", seq, clock())
        clock.advance(0.002)
        r.echoed("b", seq, clock())
    assert r.smoothed()["b"] == pytest.approx(0.002)
    r.sent("b", 99, clock())
    clock.advance(0.102)
    assert r.echoed("b", 99, clock()) == pytest.approx(0.102)
    assert r.smoothed()["b"] == pytest.approx(0.002 + GAIN * 0.1)
    assert r.peers["b"].samples == 21 and r.peers["b"].last == pytest.approx(0.102)


def test_unknown_duplicate_and_given_up_echoes_are_ignored():
    r = RttEstimator()
    assert r.echoed("b", 1, 5.0) is None  # never sent (e.g. an echo of a revive heartbeat)
    r.sent("b", 1, 5.0)
    assert r.echoed("c", 1, 5.1) is None  # another peer's number
    assert r.echoed("b", 1, 5.1) == pytest.approx(0.1)
    assert r.echoed("b", 1, 5.2) is None  # answered already
    for seq in range(2, 2 + MAX_OUTSTANDING + 1):
        r.sent("b", seq, 6.0)
    assert r.echoed("b", 2, 6.5) is None  # the oldest was given up on: memory stays bounded
    assert r.echoed("b", 3, 6.5) == pytest.approx(0.5)


def test_echoes_out_of_order_each_match_their_own_heartbeat():
    r = RttEstimator()
    r.sent("b", 1, 0.0)
    r.sent("b", 2, 0.5)
    assert r.echoed("b", 2, 0.6) == pytest.approx(0.1)
    assert r.echoed("b", 1, 0.7) == pytest.approx(0.7)


def test_forget_drops_the_series():
    r = RttEstimator()
    r.sent("b", 1, 0.0)
    r.echoed("b", 1, 0.01)
    r.forget("b")
    assert r.smoothed() == {}


@given(st.lists(st.floats(min_value=0.0, max_value=5.0), min_size=1, max_size=50))
def test_smoothed_stays_within_the_samples_seen(samples):
    r = RttEstimator()
    t = 0.0
    for seq, s in enumerate(samples):
        r.sent("b", seq, t)
        t += s
        assert r.echoed("b", seq, t) == pytest.approx(s)
    assert min(samples) - 1e-9 <= r.smoothed()["b"] <= max(samples) + 1e-9
