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
    RC_LEFT_CLOSED,
    RC_MISMATCH,
    RC_OK,
    NativeRing,
    load_native,
)

_LIB = load_native()
pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(isinstance(_LIB, str), reason=str(_LIB))]
REDUCE = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def ring(
    lib: NativeRing, xs: list[np.ndarray], op: str, inplace: bool, seg: int, seqs: list[int] | None = None
) -> tuple[list[np.ndarray], list[tuple[int, int, tuple[int, ...]]]]:
    """Every rank's call at once, each in a thread, over socket pairs r -> r + 1. With ``seqs``
    (ranks at different calls) the ranks still waiting after the others returned are aborted, as
    the group does when a call fails on a peer."""
    n = len(xs)
    pairs = [socket.socketpair() for _ in range(n)]
    aborts = [os.pipe() for _ in range(n)]
    outs = [x if inplace else np.empty_like(x) for x in xs]
    rcs: list[Any] = [None] * n

    def go(r: int) -> None:
        scratch = np.empty(seg, xs[r].dtype) if inplace else None
        right, left = pairs[r][0].fileno(), pairs[(r - 1) % n][1].fileno()
        seq = 7 if seqs is None else seqs[r]
        rcs[r] = lib.allreduce(
            left, right, aborts[r][0], xs[r], outs[r], scratch, DTYPES[xs[r].dtype], OPS[op], n, r, seg, seq
        )

    try:
        threads = [threading.Thread(target=go, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30 if seqs is None else 2)
        if seqs is not None:
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
    return outs, rcs


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
