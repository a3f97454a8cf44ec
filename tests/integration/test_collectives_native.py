"""The native ring (aionet/collectives/native.py, _ring.c) between real nodes over
tcp://127.0.0.1:0: exact results for every dtype and op it takes, in place and out of place; the
fallback to the ring of the links where a group cannot use it; and the failure rules (inputs that
disagree, a timeout, a cancelled call, a stranger at the setup's listener), where every rank must
raise a typed error and never hang."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from aionet import CollectiveError
from aionet.collectives import Group, is_aligned
from aionet.collectives.native import NativeSupport, load_native
from aionet.testing import cluster
from tests.conftest import wait_for

_LIB = load_native()  # the compiled ring, or why there is none
pytestmark = [pytest.mark.timeout(90), pytest.mark.skipif(isinstance(_LIB, str), reason=str(_LIB))]
N = 4
CFG = {"collectives": {"native_bytes": 4096}}  # the native ring at small sizes


@pytest.fixture
async def groups() -> AsyncIterator[list[Group]]:
    async with cluster(N, "tcp", config=CFG) as nodes:
        yield [n.group() for n in nodes]


async def each(groups: list[Group], fn: Any, bound: float = 20) -> list[Any]:
    return await asyncio.wait_for(asyncio.gather(*(fn(g) for g in groups), return_exceptions=True), bound)


REDUCE = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
async def test_every_dtype_op_and_out_is_exact_and_the_same_bits_everywhere(groups: list[Group], dtype: str) -> None:
    rng = np.random.default_rng(11)
    for size in (4096, 4099, 100_003):  # a multiple of the group size, and not
        xs = [rng.integers(-3, 4, size).astype(dtype) for _ in groups]
        for op in ("sum", "prod", "min", "max", "mean"):
            outs = await each(groups, lambda g, xs=xs, op=op: g.allreduce(xs[g.rank], op=op))
            want = np.mean(np.stack(xs), axis=0) if op == "mean" else REDUCE[op](np.stack(xs), axis=0).astype(dtype)
            assert all(isinstance(o, np.ndarray) for o in outs), outs
            assert all(np.array_equal(o, outs[0]) for o in outs), (op, size)  # the same bits everywhere
            assert np.array_equal(outs[0], want), (op, size, dtype)
        # out= another array, and out= the input itself
        before = [x.copy() for x in xs]
        dests = [np.empty_like(x) for x in xs]
        got = await each(groups, lambda g, xs=xs, dests=dests: g.allreduce(xs[g.rank], out=dests[g.rank]))
        assert all(o is d for o, d in zip(got, dests, strict=True))
        assert all(np.array_equal(d, np.sum(np.stack(before), axis=0).astype(dtype)) for d in dests)
        assert all(np.array_equal(x, b) for x, b in zip(xs, before, strict=True))  # inputs untouched
        await each(groups, lambda g, xs=xs: g.allreduce(xs[g.rank], out=xs[g.rank]))
        assert all(np.array_equal(x, np.sum(np.stack(before), axis=0).astype(dtype)) for x in xs)
    assert all(g._native_state is True for g in groups)


@pytest.mark.parametrize("native_bytes", [4096, 0])
async def test_a_result_aionet_allocates_starts_on_a_page(native_bytes: int) -> None:
    """Without out=, the result array (native ring, or ring of the links with the native ring off)
    is aionet's own and starts on a page, where the kernel receives into it fastest here;
    numpy's own large arrays start 16 bytes past one."""
    async with cluster(2, "tcp", config={"collectives": {"native_bytes": native_bytes}}) as nodes:
        groups = [n.group() for n in nodes]
        for size, op in ((1 << 18, "sum"), (100_003, "mean")):
            outs = await each(groups, lambda g, size=size, op=op: g.allreduce(np.ones(size, np.float32), op=op))
            assert all(isinstance(o, np.ndarray) and is_aligned(o) for o in outs), [o.ctypes.data % 4096 for o in outs]
            assert all(float(o[-1]) == (1.0 if op == "mean" else 2.0) for o in outs)
        assert all((g._native_state is True) == (native_bytes > 0) for g in groups)


async def test_a_fused_list_takes_the_native_ring_bucket_by_bucket(groups: list[Group]) -> None:
    """allreduce of a list (tensor fusion): the float32 bucket (many small arrays, above
    native_bytes) and the float64 one go native, a small int64 one does not; every result is exact,
    the same bits everywhere, in the list's order and shapes."""
    rng = np.random.default_rng(5)
    shapes = [(3, 50), (1000,), (7,), (40, 40)]
    lists = [
        [rng.integers(-5, 6, s).astype(np.float32) for s in shapes]
        + [rng.integers(-5, 6, 2000).astype(np.float64), np.arange(3, dtype=np.int64) + g]
        for g in range(N)
    ]
    for op in ("sum", "mean", "max"):
        outs = await each(groups, lambda g, op=op: g.allreduce(lists[g.rank], op=op))
        for i, col in enumerate(zip(*lists, strict=True)):
            st = np.stack(col)
            want = st.mean(axis=0) if op == "mean" else (st.sum(axis=0) if op == "sum" else st.max(axis=0))
            for o in outs:
                assert o[i].shape == col[0].shape and np.array_equal(o[i], want.astype(o[i].dtype)), (op, i)
                assert np.array_equal(o[i], outs[0][i])
    assert all(g._native_state is True for g in groups)
    assert all(np.array_equal(x, y) for x, y in zip(lists[0], lists[0], strict=True))


async def test_floats_min_max_carry_nan_as_numpy_does(groups: list[Group]) -> None:
    xs = [np.arange(8192, dtype=np.float64) for _ in groups]
    xs[2][5] = np.nan
    for op in ("min", "max", "sum"):
        outs = await each(groups, lambda g, op=op: g.allreduce(xs[g.rank], op=op))
        assert all(np.isnan(o[5]) and not np.isnan(o[6]) for o in outs), op


async def test_a_group_that_cannot_use_it_goes_over_the_links() -> None:
    """inproc:// nodes have no TCP listener: the first eligible call finds out, every rank
    agrees, and this call and the next go over the ring of the links, exact."""
    async with cluster(3, "inproc", config=CFG) as nodes:
        groups = [n.group() for n in nodes]
        for _ in range(2):
            outs = await each(groups, lambda g: g.allreduce(np.full(10_000, g.rank + 1.0)))
            assert all(np.array_equal(o, np.full(10_000, 6.0)) for o in outs)
        assert all(g._native_state is False and "tcp://" in g._native_why for g in groups)
    async with cluster(2, "tcp", config={"collectives": {"native_bytes": 0}}) as nodes:
        groups = [n.group() for n in nodes]
        outs = await each(groups, lambda g: g.allreduce(np.full(1 << 20, 1.0)))
        assert all(np.array_equal(o, np.full(1 << 20, 2.0)) for o in outs)
        assert all(g._native_state is None for g in groups)  # off: never set up


async def test_arguments_it_does_not_take_are_refused_on_every_rank_and_the_group_goes_on(
    groups: list[Group],
) -> None:
    outs = await each(groups, lambda g: g.allreduce(np.ones(8192, np.int8), algorithm="native"))
    assert all(isinstance(o, ValueError) and "algorithm='native'" in str(o) for o in outs), outs
    outs = await each(groups, lambda g: g.allreduce([np.ones(8192)], algorithm="native"))
    assert all(isinstance(o, ValueError) for o in outs), outs
    outs = await each(groups, lambda g: g.allreduce(np.ones(8192, np.float32), algorithm="native"))
    assert all(np.array_equal(o, np.full(8192, float(N), np.float32)) for o in outs), outs


async def test_ranks_whose_inputs_differ_all_raise_and_shrink_goes_on(groups: list[Group]) -> None:
    outs = await each(groups, lambda g: g.allreduce(np.ones(8192 if g.rank else 8196, np.float32)))
    assert all(isinstance(o, CollectiveError) for o in outs), outs
    assert any("called allreduce" in str(o) and "8196" in str(o) for o in outs), outs
    again = await each(groups, lambda g: g.allreduce(np.ones(8192, np.float32)))
    assert all(isinstance(o, CollectiveError) and "shrink()" in str(o) for o in again), again
    small = [g.shrink() for g in groups]
    outs = await each(small, lambda g: g.allreduce(np.ones(8192, np.float32)))
    assert all(np.array_equal(o, np.full(8192, float(N), np.float32)) for o in outs), outs
    assert all(g._native_state is True for g in small)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
async def test_reduce_scatter_goes_native_exact_for_any_shape_op_and_dtype(groups: list[Group], dtype: str) -> None:
    """Rank r gets block r of the reduction, the first axis cut as numpy.array_split cuts it: rows
    that do not divide evenly, rows of several elements, fewer rows than ranks."""
    rng = np.random.default_rng(3)
    for shape in ((4099,), (10, 700), (3, 3000), (1001, 7)):
        xs = [rng.integers(-3, 4, shape).astype(dtype) for _ in groups]
        for op in ("sum", "prod", "min", "max", "mean"):
            outs = await each(groups, lambda g, xs=xs, op=op: g.reduce_scatter(xs[g.rank], op=op))
            st = np.stack(xs)
            full = st.mean(axis=0) if op == "mean" else REDUCE[op](st, axis=0).astype(dtype)
            for r, (o, want) in enumerate(zip(outs, np.array_split(full, N), strict=True)):
                assert isinstance(o, np.ndarray) and o.shape == want.shape and o.dtype == want.dtype, (r, o)
                assert np.array_equal(o, want), (shape, op, r)
    assert all(g._native_state is True for g in groups)


async def test_reduce_scatters_cut_differently_all_raise_and_shrink_goes_on(groups: list[Group]) -> None:
    """The same element count in different shapes cuts the blocks differently: every rank raises
    (the header's digest of the cuts), none mixes blocks; the group is broken, shrink() goes on."""
    await each(groups, lambda g: g.allreduce(np.ones(8192)))  # set up
    # 8400 elements each: 7 rows cut 2, 2, 2, 1; 12 rows cut 3, 3, 3, 3
    outs = await each(groups, lambda g: g.reduce_scatter(np.ones((7, 1200) if g.rank else (12, 700))))
    assert all(isinstance(o, CollectiveError) for o in outs), outs
    assert any(str(o).count("called reduce_scatter #") == 2 for o in outs), outs  # theirs, and this rank's
    small = [g.shrink() for g in groups]
    outs = await each(small, lambda g: g.reduce_scatter(np.ones((7, 1200))))
    assert [o.shape for o in outs] == [(2, 1200), (2, 1200), (2, 1200), (1, 1200)], outs
    assert all(bool((o == N).all()) for o in outs), outs


async def test_a_rank_that_never_calls_times_the_others_out_and_names_it(groups: list[Group]) -> None:
    await each(groups, lambda g: g.allreduce(np.ones(8192)))  # set up
    outs = await each(groups[:3], lambda g: g.allreduce(np.ones(8192), timeout=1.0), bound=15)
    assert all(isinstance(o, CollectiveError) and "timed out" in str(o) for o in outs), outs
    late = await each(groups[3:], lambda g: g.allreduce(np.ones(8192)), bound=15)
    assert isinstance(late[0], CollectiveError), late  # the group broke on every member


async def test_a_cancelled_call_fails_the_others_at_once_and_leaves_no_writer(
    groups: list[Group], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 cancels its call while the others wait for it: their calls raise, and rank 0's
    compiled call (which writes into its out=) had returned before its cancelled call did."""
    from aionet.collectives.native import NativeRing

    await each(groups, lambda g: g.allreduce(np.ones(1 << 20)))  # set up
    out0 = np.zeros(1 << 20)
    started, ended = threading.Event(), threading.Event()
    real = NativeRing.allreduce

    def watched(self: NativeRing, *args: Any) -> Any:
        mine = args[4].ctypes.data == out0.ctypes.data  # (left, right, abort, x, res, ...): rank 0's
        if mine:
            started.set()
        try:
            return real(self, *args)
        finally:
            if mine:
                ended.set()

    monkeypatch.setattr(NativeRing, "allreduce", watched)
    calls = [
        asyncio.ensure_future(g.allreduce(np.ones(1 << 20), out=out0 if g.rank == 0 else None)) for g in groups[:3]
    ]  # rank 3 never calls: the ring waits on it
    await wait_for(started.is_set, 10)  # rank 0 is in its compiled call, waiting for rank 3
    assert not ended.is_set()
    calls[0].cancel()
    results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
    assert isinstance(results[0], asyncio.CancelledError)
    assert ended.is_set()  # stopped before the cancelled call returned: nothing writes into out0 after
    assert all(isinstance(r, CollectiveError) for r in results[1:]), results


async def test_a_stranger_at_the_setup_listener_is_refused_and_the_ring_still_comes_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Someone connects to a rank's listener during the setup, first, with 52 bytes that are not
    the group's secret: that connection is closed with one log line, and the real one is taken."""
    real = NativeSupport.offer

    def offer(self: NativeSupport, log: Any) -> Any:
        streams, rec = real(self, log)
        if rec.get("ok"):
            stranger = socket.create_connection((rec["host"], rec["port"]))
            stranger.sendall(b"x" * 52)
            strangers.append(stranger)
        return streams, rec

    strangers: list[socket.socket] = []
    monkeypatch.setattr(NativeSupport, "offer", offer)
    caplog.set_level(logging.WARNING, logger="aionet.collectives")
    async with cluster(2, "tcp", config=CFG) as nodes:
        groups = [n.group() for n in nodes]
        outs = await each(groups, lambda g: g.allreduce(np.full(8192, g.rank + 1.0)))
        assert all(np.array_equal(o, np.full(8192, 3.0)) for o in outs), outs
        assert all(g._native_state is True for g in groups)
    for s in strangers:
        s.close()
    assert len(strangers) == 2
    assert caplog.text.count("native ring: refused a connection") == 2


async def test_a_silent_stranger_at_the_setup_listener_does_not_hold_up_the_ring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Someone connects first and sends nothing: each connection is checked on its own, so the real
    dial is taken at once (not after the stranger's 5 s), and the stranger's connection is closed
    when the setup ends."""
    real = NativeSupport.offer

    def offer(self: NativeSupport, log: Any) -> Any:
        streams, rec = real(self, log)
        if rec.get("ok"):
            strangers.append(socket.create_connection((rec["host"], rec["port"])))
        return streams, rec

    strangers: list[socket.socket] = []
    monkeypatch.setattr(NativeSupport, "offer", offer)
    async with cluster(2, "tcp", config=CFG) as nodes:
        groups = [n.group() for n in nodes]
        t0 = asyncio.get_running_loop().time()
        outs = await each(groups, lambda g: g.allreduce(np.full(8192, g.rank + 1.0)))
        took = asyncio.get_running_loop().time() - t0
        assert all(np.array_equal(o, np.full(8192, 3.0)) for o in outs), outs
        assert all(g._native_state is True for g in groups)
        assert took < 4.0, took  # a stranger checked first would have held each rank for 5 s
        for s in strangers:  # closed by the rank it dialled, not left open
            s.settimeout(5)
            assert await asyncio.to_thread(s.recv, 1) == b""
    for s in strangers:
        s.close()
    assert len(strangers) == 2


async def test_stopped_nodes_leave_no_ring_thread() -> None:
    async with cluster(2, "tcp", config=CFG) as nodes:
        groups = [n.group() for n in nodes]
        await each(groups, lambda g: g.allreduce(np.ones(8192)))
        assert any(t.name.startswith("aionet-ring") for t in threading.enumerate())
    await wait_for(lambda: not any(t.name.startswith("aionet-ring") for t in threading.enumerate()), 10)


async def test_two_groups_over_the_same_members_run_at_once_on_streams_of_their_own() -> None:
    async with cluster(N, "tcp", config=CFG) as nodes:
        a = [n.group() for n in nodes]
        b = [n.group(name="second") for n in nodes]
        outs = await each(a + b, lambda g: g.allreduce(np.full(8192, 2.0 if g.name == "second" else 1.0)), bound=30)
        assert all(np.array_equal(o, np.full(8192, float(N))) for o in outs[:N]), outs
        assert all(np.array_equal(o, np.full(8192, 2.0 * N)) for o in outs[N:]), outs
        assert all(g._native_state is True for g in a + b)


async def test_a_rank_whose_stream_cannot_connect_makes_every_rank_use_the_links(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0's dial to its right neighbour fails (a firewall, say): rank 1 gives up waiting for
    it, every rank learns that the ring did not come up, and the call goes over the links."""
    from aionet.collectives import group_native
    from aionet.collectives.native import RingStreams

    real = RingStreams._dial

    async def dial(self: RingStreams, host: str, port: int, secret: bytes, rank: int) -> socket.socket:
        if rank == 0:
            raise ConnectionRefusedError("refused by the test")
        return await real(self, host, port, secret, rank)

    monkeypatch.setattr(RingStreams, "_dial", dial)
    monkeypatch.setattr(group_native, "SETUP_TIMEOUT", 1.0)
    async with cluster(3, "tcp", config=CFG) as nodes:
        groups = [n.group() for n in nodes]
        outs = await each(groups, lambda g: g.allreduce(np.full(8192, g.rank + 1.0)))
        assert all(np.array_equal(o, np.full(8192, 6.0)) for o in outs), outs
        assert all(g._native_state is False for g in groups)
        assert "refused by the test" in groups[0]._native_why
        outs = await each(groups, lambda g: g.allreduce(np.full(8192, 1.0)))  # and the next one too
        assert all(np.array_equal(o, np.full(8192, 3.0)) for o in outs), outs


async def test_a_malformed_record_from_a_peer_is_refused_before_anything_is_dialed() -> None:
    """The right neighbour's record comes from the network: a secret that is not 32 bytes (an
    int, which bytes() would have turned into that many zero bytes) or a bad port is a ValueError."""
    from aionet.collectives.native import RingStreams

    assert not isinstance(_LIB, str)
    streams = RingStreams(_LIB, logging.getLogger("test"))
    try:
        for secret, port in ((10**12, 1000), (b"short", 1000), (b"s" * 32, 0), (b"s" * 32, 70000)):
            with pytest.raises(ValueError, match="malformed"):
                await streams.connect("127.0.0.1", port, secret, 0, 1, 1.0)  # type: ignore[arg-type]
    finally:
        streams.close()
