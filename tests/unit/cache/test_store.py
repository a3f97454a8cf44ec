"""Store: versions never go back, the byte budget holds (LRU eviction of unpinned entries),
TTLs on a fed clock."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.cache import CacheFull, Store
from aionet.cache.store import ENTRY_OVERHEAD, freeze
from aionet.testing.clock import FakeClock

KEYS = st.sampled_from([f"k{i}" for i in range(8)])
OPS = st.lists(
    st.tuples(st.sampled_from(["put", "pin", "del", "tick"]), KEYS, st.binary(max_size=300)),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_budget_holds_and_versions_rise(ops) -> None:
    """Any sequence of writes, deletes and time: the bytes stay in budget (pinned entries
    aside), and each key's next version is above every version it ever had."""
    clock = FakeClock()
    store = Store(2000, clock)
    highest: dict[str, int] = {}
    for op, key, value in ops:
        if op == "tick":
            clock.advance(1.0)
            continue
        v = store.next_version(key)
        assert v > highest.get(key, 0)
        highest[key] = v
        if op == "del":
            store.remove(key, v)
            assert key not in store
            continue
        try:
            store.apply(key, value, v, ttl=2.5 if len(value) % 2 else None, pinned=op == "pin")
        except CacheFull:
            continue
        assert store.nbytes <= max(store.max_bytes, store.pinned_bytes)
        held = [*store._lru.values(), *store._pinned.values()]  # expired ones included until dropped
        assert store.nbytes == sum(e.nbytes for e in held)
        assert store.expiring == sum(e.expires is not None for e in held)  # sweep skips its scan at 0


def test_lru_evicts_least_recently_used_unpinned() -> None:
    store = Store(3 * (100 + ENTRY_OVERHEAD), FakeClock())
    store.apply("a", b"x" * 100, 1, pinned=True)
    store.apply("b", b"x" * 100, 1)
    store.apply("c", b"x" * 100, 1)
    store.get("b")  # c is now the least recently used unpinned entry
    store.apply("d", b"x" * 100, 1)
    assert "a" in store and "b" in store and "d" in store and "c" not in store
    assert store.evictions == 1
    # an evicted key's version does not restart: the floor remembers it
    assert store.next_version("c") > 1


def test_pinned_entries_make_room_errors_name_the_key() -> None:
    store = Store(2 * (100 + ENTRY_OVERHEAD), FakeClock())
    store.apply("a", b"x" * 100, 1, pinned=True)
    store.apply("b", b"x" * 100, 1, pinned=True)
    with pytest.raises(CacheFull, match="cache.max_bytes"):
        store.apply("c", b"x", 1)
    assert "a" in store and "b" in store


def test_replica_never_goes_back_a_version() -> None:
    store = Store(10_000, FakeClock())
    assert store.apply("k", "new", 5)
    assert not store.apply("k", "old", 4)
    assert not store.apply("k", "same", 5)
    assert store.peek("k").value == "new"
    assert not store.remove("k", 3)  # an older delete does not remove a newer value
    assert store.remove("k", 6) and "k" not in store
    assert store.next_version("k") == 7


def test_ttl_expires_on_the_fed_clock() -> None:
    clock = FakeClock()
    store = Store(10_000, clock)
    store.apply("k", 1, 1, ttl=5.0)
    clock.advance(4.9)
    assert store.get("k") is not None
    clock.advance(0.2)
    assert store.get("k") is None and store.expirations == 1
    assert store.next_version("k") == 2
    store.apply("j", 1, 3, ttl=1.0)
    clock.advance(2)
    assert store.sweep() == 1 and len(store) == 0 and store.nbytes == 0


def test_arrays_are_stored_read_only() -> None:
    a = np.arange(10)
    kept = freeze(a, copy=True)
    assert not kept.flags.writeable and not np.shares_memory(a, kept)
    a[0] = 99
    assert kept[0] == 0
    view = freeze(np.arange(4), copy=False)
    assert not view.flags.writeable
    store = Store(10_000, FakeClock())
    store.apply("a", kept, 1)
    assert store.peek("a").nbytes == kept.nbytes + ENTRY_OVERHEAD


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_in_place_update_matches_a_fresh_write(ops) -> None:
    """The primary's common put (no TTL, unpinned) changes the entry in place (``update``);
    any sequence of writes ends in the same state as writing every value anew with ``apply``:
    same keys, versions, values, expiries, byte count, LRU order and evictions, fences kept."""
    clock = FakeClock()
    fast, ref = Store(2000, clock), Store(2000, clock)
    for op, key, value in ops:
        if op == "tick":
            clock.advance(1.0)
            continue
        v = ref.next_version(key)
        assert fast.next_version(key) == v
        if op == "del":
            fast.remove(key, v)
            ref.remove(key, v)
            continue
        e = fast.peek(key)
        ttl = 2.5 if len(value) % 2 else None  # a write with a TTL takes apply in both stores
        outcomes = []
        for store in (fast, ref):
            try:
                if store is fast and op == "put" and ttl is None and e is not None and not e.pinned:
                    store.update(key, e, value, v)
                else:
                    old = store.peek(key)
                    fences = dict(old.fences) if old is not None else {"lock": v}
                    store.apply(key, value, v, ttl=ttl, pinned=op == "pin", fences=fences)
                outcomes.append(None)
            except CacheFull as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]
        for attr in ("nbytes", "pinned_bytes", "floor", "evictions", "expirations"):
            assert getattr(fast, attr) == getattr(ref, attr), attr
        assert list(fast._lru) == list(ref._lru) and list(fast._pinned) == list(ref._pinned)
        assert fast.expiring == sum(e.expires is not None for e in [*fast._lru.values(), *fast._pinned.values()])
        for k, x in ref._lru.items():
            y = fast._lru[k]
            assert (y.value, y.version, y.nbytes, y.expires, y.fences) == (
                x.value,
                x.version,
                x.nbytes,
                x.expires,
                x.fences,
            )
