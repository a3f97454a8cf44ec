"""Lease table: tokens rise per name, a lease ends at its ttl (not before), replicas that
take over never free a lock early."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.cache import LeaseTable
from aionet.cache.locks import Busy, Granted
from aionet.testing.clock import FakeClock


def test_grant_busy_expiry_and_rising_tokens() -> None:
    clock = FakeClock()
    t = LeaseTable(clock)
    g = t.acquire("L", "a", 10)
    assert isinstance(g, Granted) and g.token == 1
    clock.advance(9.9)
    b = t.acquire("L", "b", 10)
    assert isinstance(b, Busy) and b.remaining == pytest.approx(0.1) and b.token == 1
    assert t.valid("L", 1)
    clock.advance(0.2)  # the holder died silently: its lease ends now, not before
    assert not t.valid("L", 1)
    g2 = t.acquire("L", "b", 10)
    assert isinstance(g2, Granted) and g2.token == 2
    assert not t.renew("L", 1, 10)  # the old holder cannot come back
    assert t.renew("L", 2, 10)
    assert t.release("L", 2) and not t.release("L", 2)
    assert t.acquire("L", "c", 1).token == 3  # type: ignore[union-attr]
    assert t.acquire("M", "c", 1).token == 1  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        t.acquire("N", "c", 0)


def test_renewal_keeps_the_lease() -> None:
    clock = FakeClock()
    t = LeaseTable(clock)
    t.acquire("L", "a", 3)
    for _ in range(10):
        clock.advance(1)
        assert t.renew("L", 1, 3)
    assert isinstance(t.acquire("L", "b", 3), Busy)


def test_replica_takes_over_without_freeing_early() -> None:
    primary_clock, replica_clock = FakeClock(100.0), FakeClock(5.0)
    primary, replica = LeaseTable(primary_clock), LeaseTable(replica_clock)
    primary.acquire("L", "a", 10)
    primary_clock.advance(2)
    replica_clock.advance(0.5)  # the record took time to arrive
    replica.apply(primary.record("L"))  # 8 s left as the primary sent it
    replica_clock.advance(7.9)
    assert isinstance(replica.acquire("L", "b", 10), Busy)
    replica_clock.advance(0.2)
    g = replica.acquire("L", "b", 10)
    assert isinstance(g, Granted) and g.token == 2
    replica.apply([*primary.record("L")[:2], "", -1.0])  # an old record never lowers the token
    assert replica.tokens["L"] == 2 and replica.valid("L", 2)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["acq", "renew", "rel", "tick"]), st.sampled_from("ab")), max_size=60))
def test_tokens_strictly_rise_and_one_holder(ops) -> None:
    clock = FakeClock()
    t = LeaseTable(clock)
    mine: dict[str, int] = {}
    last = 0
    for op, who in ops:
        if op == "tick":
            clock.advance(0.7)
        elif op == "acq":
            r = t.acquire("L", who, 1.0)
            if isinstance(r, Granted):
                assert r.token > last
                last = r.token
                mine[who] = r.token
        elif op == "renew" and who in mine:
            t.renew("L", mine[who], 1.0)
        elif op == "rel" and who in mine:
            t.release("L", mine[who])
        live = [w for w, tok in mine.items() if t.valid("L", tok)]
        assert len(live) <= 1
