"""HostScratch: host working copies lent for device collectives and reused by size."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.devices.buffers import PlainAllocator
from aionet.devices.scratch import GRANULE, HostScratch


class CountingAllocator(PlainAllocator):
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def alloc(self, nbytes: int) -> np.ndarray:
        self.sizes.append(nbytes)
        return super().alloc(nbytes)


def test_the_same_size_reuses_the_same_memory() -> None:
    alloc = CountingAllocator()
    s = HostScratch(alloc, 1 << 30)
    a = s.take(3_000_000)
    assert a.nbytes == 3_000_000 and a.dtype == np.uint8
    addr = a.ctypes.data
    s.give(a.view(np.float32).reshape(1000, 750))  # any view from its first byte
    b = s.take(3_000_000)
    assert b.ctypes.data == addr
    assert (s.reused, s.allocated) == (1, 1)
    assert alloc.sizes == [-(-3_000_000 // GRANULE) * GRANULE]


def test_a_lent_buffer_is_never_lent_twice() -> None:
    s = HostScratch(PlainAllocator(), 1 << 30)
    a = s.take(1 << 20)
    b = s.take(1 << 20)
    assert not np.shares_memory(a, b)
    assert s.allocated == 2


def test_the_smallest_fit_is_taken_but_never_one_more_than_twice_the_size() -> None:
    s = HostScratch(PlainAllocator(), 1 << 30)
    big, small = s.take(8 << 20), s.take(3 << 20)
    s.give(big)
    s.give(small)
    assert s.take(2 << 20).ctypes.data == small.ctypes.data  # 3 MiB fits 2 MiB, 8 MiB is too wide
    c = s.take(1 << 20)  # the 8 MiB buffer is idle but more than twice 1 MiB
    assert c.ctypes.data != big.ctypes.data
    assert s.allocated == 3


def test_idle_buffers_are_bounded_oldest_dropped_first() -> None:
    s = HostScratch(PlainAllocator(), 3 << 20)
    bufs = [s.take(1 << 20) for _ in range(4)]
    for b in bufs:
        s.give(b)
    assert s.idle_bytes == 3 << 20
    # the oldest given back (bufs[0]) was dropped; the three newest are served again
    again = {s.take(1 << 20).ctypes.data for _ in range(3)}
    assert again == {b.ctypes.data for b in bufs[1:]}


def test_an_array_over_the_bound_gets_plain_memory_and_is_not_kept() -> None:
    alloc = CountingAllocator()
    s = HostScratch(alloc, 1 << 20)
    a = s.take(2 << 20)
    assert a.nbytes == 2 << 20 and alloc.sizes == []
    s.give(a)
    assert s.idle_bytes == 0


def test_foreign_arrays_and_double_gives_are_ignored() -> None:
    s = HostScratch(PlainAllocator(), 1 << 30)
    s.give(np.zeros(10))
    a = s.take(100)
    s.give(a)
    s.give(a)
    assert s.idle_bytes == GRANULE
    assert s.take(0).nbytes == 0


@settings(max_examples=200)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5 << 20)), max_size=40), st.integers(0, 8 << 20))
def test_lent_buffers_never_overlap_and_idle_stays_bounded(ops: list[tuple[bool, int]], bound: int) -> None:
    s = HostScratch(PlainAllocator(), bound)
    lent: list[np.ndarray] = []
    for give, n in ops:
        if give and lent:
            s.give(lent.pop(n % len(lent)))
        else:
            a = s.take(n)
            assert a.nbytes == n
            assert not any(np.shares_memory(a, b) for b in lent if a.nbytes and b.nbytes)
            lent.append(a)
        assert s.idle_bytes <= bound
