"""Rendezvous placement: same answer everywhere, distinct replicas, minimal movement."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.cache import Placement
from aionet.cache.placement import owners_in

NODES = st.lists(st.sampled_from([f"n{i}" for i in range(12)]), min_size=1, max_size=12, unique=True)
KEYS = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=30)


@settings(max_examples=100, deadline=None)
@given(NODES, KEYS, st.integers(1, 4))
def test_replicas_distinct_and_order_independent(nodes, keys, n) -> None:
    a, b = Placement(nodes, n), Placement(list(reversed(nodes)), n)
    for k in keys:
        owners = a.owners(k)
        assert owners == b.owners(k)
        assert len(owners) == min(n, len(nodes)) == len(set(owners))
        assert set(owners) <= set(nodes)


@settings(max_examples=100, deadline=None)
@given(NODES, KEYS, st.integers(1, 3), st.data())
def test_a_leaving_node_moves_only_its_keys(nodes, keys, n, data) -> None:
    """A node leaving changes only the replica lists it was on, and the others keep their
    order (so the surviving replica of a dead primary becomes the primary)."""
    gone = data.draw(st.sampled_from(nodes))
    rest = [x for x in nodes if x != gone]
    if not rest:
        return
    for k in keys:
        before, after = owners_in(k, nodes, n), owners_in(k, rest, n)
        if gone not in before:
            assert before == after
        else:
            survivors = tuple(x for x in before if x != gone)
            assert after[: len(survivors)] == survivors


def test_update_clears_the_memo_and_spreads_keys() -> None:
    p = Placement(["a", "b", "c"], 2)
    assert not p.update(["c", "b", "a"])
    firsts = {p.primary(f"k{i}") for i in range(300)}
    assert firsts == {"a", "b", "c"}
    assert p.update(["a", "b"])
    assert all("c" not in p.owners(f"k{i}") for i in range(300))
