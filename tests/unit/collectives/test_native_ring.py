"""The compiled ring (aionet/collectives/_ring.c) on its own: n ranks as threads over socket
pairs, every dtype and op it takes, any element count and segment size, in place or not, against
numpy; and the ways a call ends early (the abort pipe, a peer that calls another allreduce, a
stream that closes), each with its own code and never a hang."""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aionet.collectives.native import (
    DTYPES,
    OPS,
    RC_ABORTED,
    RC_BAD_ARGS,
    RC_LEFT_CLOSED,
    RC_MISMATCH,
    RC_OK,
    NativeRing,
    load_native,
)

_LIB = load_native()
pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(isinstance(_LIB, str), reason=str(_LIB))]
REDUCE = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def ranks(n: int, call: Any, early: bool = False) -> list[Any]:
    """``call(r, left, right, abort)`` for every rank at once, each in a thread, over socket pairs
    r -> r + 1. ``early``: ranks still waiting 2 s after the others returned are aborted, as the
    group does when a call fails on a peer."""
    pairs = [socket.socketpair() for _ in range(n)]
    aborts = [os.pipe() for _ in range(n)]
    rcs: list[Any] = [None] * n

    def go(r: int) -> None:
        rcs[r] = call(r, pairs[(r - 1) % n][1].fileno(), pairs[r][0].fileno(), aborts[r][0])

    try:
        threads = [threading.Thread(target=go, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(2 if early else 30)
        if early:
            for _r, w in aborts:
                os.write(w, b"x")
            for t in threads:
                t.join(30)
        assert not any(t.is_alive() for t in threads), "a rank's call did not return"
    finally:
        for a, b in pairs:
            a.close()
            b.close()
        for fds in aborts:
            for fd in fds:
                os.close(fd)
    return rcs


def ring(
    lib: NativeRing, xs: list[np.ndarray], op: str, inplace: bool, seg: int, seqs: list[int] | None = None
) -> tuple[list[np.ndarray], list[tuple[int, int, tuple[int, ...]]]]:
    """Every rank's allreduce at once; ``seqs``: ranks at different calls."""
    n = len(xs)
    outs = [x if inplace else np.empty_like(x) for x in xs]

    def call(r: int, left: int, right: int, abort: int) -> Any:
        scratch = np.empty(seg, xs[r].dtype) if inplace else None
        seq = 7 if seqs is None else seqs[r]
        return lib.allreduce(left, right, abort, xs[r], outs[r], scratch, DTYPES[xs[r].dtype], OPS[op], n, r, seg, seq)

    return outs, ranks(n, call, early=seqs is not None)


def scatter(
    lib: NativeRing, xs: list[np.ndarray], op: str, seg: int, cuts: list[np.ndarray], checks: list[int]
) -> tuple[list[np.ndarray], list[tuple[int, int, tuple[int, ...]]]]:
    """Every rank's reduce-scatter at once, rank r cutting at ``cuts[r]`` with digest ``checks[r]``."""
    n = len(xs)
    outs = [np.full_like(x, 99) for x in xs]

    def call(r: int, left: int, right: int, abort: int) -> Any:
        return lib.reduce_scatter(
            left, right, abort, xs[r], outs[r], DTYPES[xs[r].dtype], OPS[op], n, r, seg, 7, cuts[r], checks[r]
        )

    return outs, ranks(n, call, early=len(set(checks)) > 1)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 5),
    count=st.integers(5, 3000),
    dtype=st.sampled_from(["float32", "float64", "int32", "int64"]),
    op=st.sampled_from(["sum", "prod", "min", "max"]),
    inplace=st.booleans(),
    seg=st.integers(1, 700),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_ring_equals_numpy_for_any_count_segment_dtype_and_op(
    n: int, count: int, dtype: str, op: str, inplace: bool, seg: int, seed: int
) -> None:
    assert not isinstance(_LIB, str)
    count = max(count, n)
    rng = np.random.default_rng(seed)
    xs = [rng.integers(-4, 5, count).astype(dtype) for _ in range(n)]
    want = REDUCE[op].reduce(np.stack(xs))
    outs, rcs = ring(_LIB, xs, op, inplace, seg)
    assert [rc[0] for rc in rcs] == [RC_OK] * n
    assert all(np.array_equal(o, want) for o in outs)


def test_integers_wrap_as_numpy_does_and_float_min_carries_nan() -> None:
    assert not isinstance(_LIB, str)
    big = [np.full(64, np.iinfo(np.int32).max, np.int32) for _ in range(3)]
    outs, _ = ring(_LIB, big, "sum", False, 16)
    assert np.array_equal(outs[0], np.add.reduce(np.stack(big), dtype=np.int32))
    xs = [np.arange(64, dtype=np.float32) for _ in range(3)]
    xs[1][3] = np.nan
    outs, _ = ring(_LIB, xs, "min", False, 16)
    assert np.isnan(outs[2][3]) and outs[2][4] == 4.0


def test_a_peer_at_another_call_is_a_mismatch_with_its_header() -> None:
    assert not isinstance(_LIB, str)
    xs = [np.ones(100, np.float32) for _ in range(3)]
    _outs, rcs = ring(_LIB, xs, "sum", False, 10, seqs=[7, 8, 7])
    # rank 2 reads rank 1's header (seq 8): a mismatch naming it; rank 1 reads rank 0's (seq 7);
    # rank 0 reads rank 2's (seq 7, as its own) and waits for data that never comes: aborted
    assert rcs[2][0] == RC_MISMATCH and rcs[2][2][:2] == (8, 100)
    assert rcs[1][0] == RC_MISMATCH and rcs[1][2][0] == 7
    assert rcs[0][0] == RC_ABORTED


def test_the_abort_pipe_ends_a_call_that_waits_and_a_closed_stream_is_said() -> None:
    assert not isinstance(_LIB, str)
    a, b = socket.socketpair()  # right (sends to nobody who reads), and one whose other end closes
    c, d = socket.socketpair()
    r_fd, w_fd = os.pipe()
    x = np.ones(1000)
    got: list[Any] = []
    try:

        def call() -> None:
            out = np.empty_like(x)
            got.append(_LIB.allreduce(c.fileno(), a.fileno(), r_fd, x, out, None, DTYPES[x.dtype], 0, 2, 0, 100, 1))

        t = threading.Thread(target=call)
        t.start()
        t.join(0.2)
        assert t.is_alive()  # waiting for the left neighbour's header
        os.write(w_fd, b"x")
        t.join(10)
        assert got and got[0][0] == RC_ABORTED
        os.read(r_fd, 1)
        d.close()  # the left neighbour is gone
        out = np.empty_like(x)
        rc = _LIB.allreduce(c.fileno(), a.fileno(), r_fd, x, out, None, DTYPES[x.dtype], 0, 2, 0, 100, 1)
        assert rc[0] == RC_LEFT_CLOSED
    finally:
        for s in (a, b, c):
            s.close()
        os.close(r_fd)
        os.close(w_fd)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 5),
    sizes=st.lists(st.integers(0, 900), min_size=5, max_size=5),
    dtype=st.sampled_from(["float32", "float64", "int32", "int64"]),
    op=st.sampled_from(["sum", "prod", "min", "max"]),
    seg=st.integers(1, 400),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_reduce_scatter_leaves_each_rank_its_own_block_reduced(
    n: int, sizes: list[int], dtype: str, op: str, seg: int, seed: int
) -> None:
    """Any cut (empty blocks too), dtype, op and segment: rank r's block r of the result is the
    reduction of everyone's block r, as numpy computes it."""
    assert not isinstance(_LIB, str)
    cut = np.concatenate([[0], np.cumsum(sizes[:n])]).astype(np.int64)
    rng = np.random.default_rng(seed)
    xs = [rng.integers(-4, 5, int(cut[-1])).astype(dtype) for _ in range(n)]
    want = REDUCE[op].reduce(np.stack(xs))
    outs, rcs = scatter(_LIB, xs, op, seg, [cut] * n, [5] * n)
    assert [rc[0] for rc in rcs] == [RC_OK] * n
    for r in range(n):
        a, b = cut[r], cut[r + 1]
        assert np.array_equal(outs[r][a:b], want[a:b]), r


def test_a_reduce_scatter_cut_differently_is_a_mismatch_and_bad_cuts_are_refused() -> None:
    assert not isinstance(_LIB, str)
    xs = [np.ones(90, np.float32) for _ in range(3)]
    cut = np.array([0, 30, 60, 90], np.int64)
    other = np.array([0, 40, 60, 90], np.int64)
    _outs, rcs = scatter(_LIB, xs, "sum", 10, [cut, other, cut], [1, 2, 1])
    # rank 2 reads rank 1's digest (2): a mismatch; rank 1 reads rank 0's (1); rank 0 waits: aborted
    assert rcs[2][0] == RC_MISMATCH and rcs[2][2][:2] == (7, 90) and rcs[2][2][3] == OPS["sum"] + 256
    assert rcs[1][0] == RC_MISMATCH
    assert rcs[0][0] == RC_ABORTED
    r, w = os.pipe()
    try:
        y = np.empty_like(xs[0])
        for bad in (np.array([0, 30, 60, 80], np.int64), np.array([0, 50, 40, 90], np.int64)):
            assert _LIB.reduce_scatter(-1, -1, r, xs[0], y, 0, 0, 3, 0, 10, 1, bad, 0)[0] == RC_BAD_ARGS
        assert _LIB.reduce_scatter(-1, -1, r, xs[0], xs[0], 0, 0, 3, 0, 10, 1, cut, 0)[0] == RC_BAD_ARGS  # in place
    finally:
        os.close(r)
        os.close(w)


def test_an_allreduce_and_a_reduce_scatter_at_one_number_are_a_mismatch() -> None:
    assert not isinstance(_LIB, str)
    n, xs = 2, [np.ones(64, np.float64) for _ in range(2)]
    cut = np.array([0, 32, 64], np.int64)
    outs = [np.empty_like(x) for x in xs]

    def call(r: int, left: int, right: int, abort: int) -> Any:
        if r == 0:
            return _LIB.allreduce(left, right, abort, xs[0], outs[0], None, DTYPES[xs[0].dtype], 0, n, 0, 8, 7)
        return _LIB.reduce_scatter(left, right, abort, xs[1], outs[1], DTYPES[xs[1].dtype], 0, n, 1, 8, 7, cut, 0)

    rcs = ranks(n, call, early=True)
    assert rcs[0][0] == RC_MISMATCH and rcs[0][2][3] == 256  # rank 0 read rank 1's reduce-scatter header
    assert rcs[1][0] == RC_MISMATCH and rcs[1][2][3] == 0
