"""What a data-parallel user gets wrong, over real sockets (tcp://127.0.0.1:0, 3 ranks so the
recursive doubling folds a rank in): inputs whose shape or dtype differ between ranks, arguments
only one rank refuses, a cancelled call, a rank that never calls, a bad ``out=``, a stopped node.

The rule each test holds: every rank raises a typed error (never hangs, never returns garbage),
and the group goes on being usable afterwards (or says ``shrink()`` where it broke)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from aionet import CollectiveError, Node
from aionet.collectives import Group
from aionet.testing import cluster
from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(90)
N = 3
CFG = {"collectives": {"small_bytes": 4096, "segment_bytes": 16384}}  # the ring and its segments at small sizes


@pytest.fixture
async def nodes() -> AsyncIterator[list[Node]]:
    async with cluster(N, "tcp", config=CFG) as ns:
        yield ns


async def outcomes(groups: list[Group], fn: Any, bound: float = 10) -> list[Any]:
    """Each rank's result or exception; a hang fails the test after ``bound`` seconds."""
    return await asyncio.wait_for(asyncio.gather(*(fn(g) for g in groups), return_exceptions=True), bound)


async def still_usable(groups: list[Group]) -> None:
    outs = await outcomes(groups, lambda g: g.allreduce(np.arange(5.0) + g.rank))
    assert all(np.array_equal(o, np.arange(5.0) * N + N) for o in outs), outs
    outs = await outcomes(groups, lambda g: g.allreduce(np.ones(20_000, np.float32)))  # the ring
    assert all(np.array_equal(o, np.full(20_000, N, np.float32)) for o in outs), outs


def mine(rank: int, mismatch: Any, other: Any) -> Any:
    return mismatch if rank == 0 else other


MISMATCHES = {
    # small (raw bytes, callback-driven doubling): equal byte counts used to decode as garbage
    "float32 x4 vs float64 x2": lambda g: g.allreduce(mine(g.rank, np.ones(4, np.float32), np.ones(2))),
    "scalar 1.5 vs 1": lambda g: g.allreduce(mine(g.rank, 1.5, 1)),
    "small shape": lambda g: g.allreduce(mine(g.rank, np.ones(8), np.ones(4))),  # hung at n = 3
    # generic doubling (ndarray payloads) and the ring: broadcast errors, silent casts, hangs
    "doubling shape": lambda g: g.allreduce(mine(g.rank, np.ones(300), np.ones(200)), algorithm="doubling"),
    "ring shape": lambda g: g.allreduce(mine(g.rank, np.ones(15_000), np.ones(10_000))),
    "ring float32 vs float64": lambda g: g.allreduce(np.ones(10_000, mine(g.rank, np.float32, np.float64))),
    "ring int64 vs float64": lambda g: g.allreduce(np.ones(10_000, mine(g.rank, np.int64, np.float64))),
    "ring one element short": lambda g: g.allreduce(np.ones(mine(g.rank, 9_999, 10_000)), algorithm="ring"),
    "direct dtype": lambda g: g.allreduce(np.ones(100, mine(g.rank, np.int32, np.float32)), algorithm="direct"),
    "tree shape": lambda g: g.allreduce(np.ones(mine(g.rank, 7, 5)), algorithm="tree"),
    "reduce_scatter": lambda g: g.reduce_scatter(np.ones(mine(g.rank, 12, 8))),
    "fused list": lambda g: g.allreduce([np.ones(3), np.ones(mine(g.rank, 4, 3))]),
    "compression on one rank": lambda g: g.allreduce(np.ones(4, np.float32), compression=mine(g.rank, "fp16", None)),
    "ring compression on one rank": lambda g: g.allreduce(
        np.ones(10_000, np.float32), compression=mine(g.rank, "bf16", None)
    ),
}


@pytest.mark.parametrize("case", list(MISMATCHES))
async def test_inputs_that_disagree_raise_on_every_rank_and_the_group_goes_on(nodes: list[Node], case: str) -> None:
    groups = [n.group() for n in nodes]
    got = await outcomes(groups, MISMATCHES[case])
    assert all(isinstance(o, CollectiveError) for o in got), got
    assert all("same shape and dtype" in str(o) for o in got), got  # the rank that saw it, or its abort
    await still_usable(groups)


async def test_arguments_one_rank_refuses_fail_that_call_on_the_others_too(nodes: list[Node]) -> None:
    """A ValueError raised before the call started (a root's short scatter list, a float64
    input with fp16 compression) used to leave the other ranks waiting for ever, and this
    rank one call behind them."""
    groups = [n.group() for n in nodes]
    got = await outcomes(groups, lambda g: g.scatter([1] if g.rank == 0 else None, root=0))
    assert isinstance(got[0], ValueError) and "one item per rank" in str(got[0])
    for o in got[1:]:
        assert isinstance(o, CollectiveError) and o.member == "n0" and "one item per rank" in str(o), o
    await still_usable(groups)
    got = await outcomes(
        groups, lambda g: g.allreduce(np.ones(9, mine(g.rank, np.float64, np.float32)), compression="fp16")
    )
    assert isinstance(got[0], ValueError) and all(isinstance(o, CollectiveError) for o in got[1:]), got
    await still_usable(groups)
    # the same mistake on every rank: each raises its own error, and the sequence stays aligned
    got = await outcomes(groups, lambda g: g.allreduce(np.ones(3), op="median"))
    assert all(isinstance(o, ValueError) and "unknown reduction op" in str(o) for o in got), got
    await still_usable(groups)
    # one rank's word of the mistake reaches the others before their own call: nothing stays behind
    with pytest.raises(ValueError):
        await groups[0].allreduce(np.ones(3), op="median")
    await wait_for(lambda: all(g._aborted for g in groups[1:]), 5)
    got = await outcomes(groups[1:], lambda g: g.allreduce(np.ones(3), op="median"))
    assert all(isinstance(o, ValueError) for o in got), got
    assert not any(g._aborted for g in groups)
    await still_usable(groups)


async def test_a_cancelled_call_fails_the_peers_call_and_the_group_goes_on(nodes: list[Node]) -> None:
    """Rank 0 gives up (cancels) a large allreduce mid-ring: the others' call used to wait for
    its segments for ever. Now they raise, naming it, and the next call is right everywhere."""
    groups = [n.group() for n in nodes]
    call = asyncio.ensure_future(groups[0].allreduce(np.ones(400_000)))
    await wait_for(lambda: bool(groups[0]._waiting), 10)  # it sent its first segments, waits for its left
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    got = await outcomes(groups[1:], lambda g: g.allreduce(np.ones(400_000)))
    assert all(isinstance(o, CollectiveError) and o.member == "n0" and "cancelled" in str(o) for o in got), got
    await still_usable(groups)
    assert not any(g._waiting or g._steps or g._aborted for g in groups)  # nothing left behind


async def test_a_rank_that_never_calls_is_named_by_the_timeout(nodes: list[Node]) -> None:
    """The timeout says whom the call waited for; the ranks it broke the group on are told, so
    every member shrinks (the rank that never called too) and goes on."""
    groups = [n.group() for n in nodes]
    for x in (np.ones(4), np.ones(20_000)):  # the small driver and the ring
        got = await outcomes(groups[:2], lambda g, x=x: g.allreduce(x, timeout=0.5))
        assert all(isinstance(o, CollectiveError) and "timed out" in str(o) for o in got), got
        assert any("'n2'" in str(o) and "same members and name" in str(o) for o in got), got
        lazy = groups[2]
        await wait_for(lambda lazy=lazy: lazy._broken is not None, 5)  # told, though it never called
        groups = [g.shrink() for g in groups]
        await still_usable(groups)


async def test_groups_whose_members_differ_time_out_naming_the_missing_rank(nodes: list[Node]) -> None:
    a = nodes[0].group(["n0", "n1"], name="g")
    b = nodes[1].group(["n1", "n0"], name="g")  # another order: another rank numbering, another channel
    got = await outcomes([a, b], lambda g: g.allreduce(np.ones(4), timeout=0.5))
    assert all(isinstance(o, CollectiveError) and "same members and name" in str(o) for o in got), got


async def test_out_is_checked_before_anything_is_sent(nodes: list[Node]) -> None:
    groups = [n.group() for n in nodes]
    got = await outcomes(groups, lambda g: g.allreduce(np.ones(4), out=np.zeros(3)))
    assert all(isinstance(o, ValueError) and "out has 3 elements, the input 4" in str(o) for o in got), got
    ro = np.zeros(4)
    ro.flags.writeable = False
    got = await outcomes(groups, lambda g: g.allreduce(np.ones(4), out=ro))
    assert all(isinstance(o, ValueError) and "read-only" in str(o) for o in got), got
    got = await outcomes(groups, lambda g: g.allreduce(np.arange(4), op="mean", out=np.zeros(4, np.int64)))
    assert all(isinstance(o, TypeError) and "float64" in str(o) for o in got), got
    await still_usable(groups)
    # a strided out= gets the result (it was refused as "not contiguous"), small and ring sizes
    for n in (4, 20_000):
        outs = [np.zeros(2 * n)[::2] for _ in groups]
        got = await outcomes(groups, lambda g, n=n, outs=outs: g.allreduce(np.ones(n), out=outs[g.rank]))
        assert all(o is b and np.array_equal(b, np.full(n, N)) for o, b in zip(got, outs, strict=True)), got


async def test_bools_reduce_as_numpy_reduces_them_over_the_ranks(nodes: list[Node]) -> None:
    """max/min are any/all; sum, prod and mean count (np.add on bools is `or`: the mean of
    [True, False, False] over 3 ranks came out 1/3 for any number of Trues)."""
    groups = [n.group() for n in nodes]
    xs = [np.array([True, g.rank == 0, False]) for g in groups]
    stack = np.stack(xs)
    for op, ref in (("sum", np.sum), ("prod", np.prod), ("mean", np.mean), ("max", np.max), ("min", np.min)):
        for algorithm in ("auto", "ring", "tree"):
            got = await outcomes(groups, lambda g, op=op, a=algorithm: g.allreduce(xs[g.rank], op=op, algorithm=a))
            expect = ref(stack, axis=0)
            assert all(o.dtype == expect.dtype and np.array_equal(o, expect) for o in got), (op, algorithm, got)
    assert await outcomes(groups, lambda g: g.allreduce(g.rank != 1)) == [2] * N  # Python bools count too


async def test_a_stopped_node_says_so() -> None:
    async with cluster(2, "tcp") as ns:
        old = ns[0].group()
        await ns[0].stop()
        with pytest.raises(CollectiveError, match="'n0' is stopped"):
            ns[0].group(["n0", "n1"])
        with pytest.raises(CollectiveError, match="closed \\(its node stopped\\)"):
            await old.allreduce(1)


async def test_the_same_group_made_in_every_step_is_one_group(nodes: list[Node]) -> None:
    """``node.group()`` inside the training loop: each call used to make a second group on the
    same channel at sequence number 0, which dropped the messages peers sent it as stale (they
    were behind the first group's numbers), and ranks at different speeds hung within a step."""

    async def train(node: Node, pause: float) -> list[float]:
        seen = []
        for step in range(20):
            grp = node.group()
            seen.append(float((await grp.allreduce(np.full(3, float(step))))[0]))
            await grp.allreduce(np.ones(20_000, np.float32))
            if pause:
                await asyncio.sleep(pause)
        return seen

    got = await asyncio.wait_for(asyncio.gather(*(train(n, 0.002 * (i == 0)) for i, n in enumerate(nodes))), 30)
    assert got == [[float(N * s) for s in range(20)]] * N
    assert nodes[0].group() is nodes[0].group() and nodes[0].group(name="other") is not nodes[0].group()
    assert len(nodes[0].collectives._groups) == 2


async def test_torch_bfloat16_and_strided_out_tensors(nodes: list[Node]) -> None:
    """bfloat16, the usual gradient dtype, raised numpy's "Unsupported dtype in DLTensor" (numpy
    has no bfloat16): it is reduced in float32 and rounded back once. A strided out= tensor was
    refused; it takes the result (torch's copy_)."""
    torch = pytest.importorskip("torch", reason="torch not installed (CI: pip install torch==2.13.0, CPU wheel)")
    groups = [n.group() for n in nodes]
    xs = [torch.full((3, 50_000), 0.1 * (g.rank + 1)).to(torch.bfloat16) for g in groups]  # small and ring sizes
    for x in (lambda g: xs[g.rank][:, :4], lambda g: xs[g.rank]):
        got = await outcomes(groups, lambda g, x=x: g.allreduce(x(g)))
        ref = sum(x(g).float() for g in groups).to(torch.bfloat16)
        assert all(o.dtype == torch.bfloat16 and torch.equal(o, ref) for o in got), got
    outs = [torch.zeros(3, 8)[:, ::2] for _ in groups]
    got = await outcomes(groups, lambda g: g.allreduce(torch.ones(3, 4), out=outs[g.rank]))
    assert all(o is b and torch.equal(b, torch.full((3, 4), float(N))) for o, b in zip(got, outs, strict=True)), got
    got = await outcomes(groups, lambda g: g.allreduce(torch.tensor([True, g.rank == 0])))
    assert all(torch.equal(o, torch.tensor([N, 1])) for o in got), got


async def test_an_object_too_big_to_send_fails_the_call_everywhere(nodes: list[Node]) -> None:
    """A root broadcasting a Python object whose header passes limits.max_header_bytes gets the
    serializer's error (it names the fix); the other ranks used to wait for it for ever."""
    groups = [n.group() for n in nodes]
    huge = list(range(5_000_000))  # ~25 MB of msgpack header: not out of band
    got = await outcomes(groups, lambda g: g.broadcast(huge if g.rank == 0 else None), bound=30)
    assert "max_header_bytes" in str(got[0]) and not isinstance(got[0], CollectiveError), got
    assert all(isinstance(o, CollectiveError) and o.member == "n0" and "max_header_bytes" in str(o) for o in got[1:])
    await still_usable(groups)


def other_call(rank: int, mismatch: Any, other: Any) -> Any:
    """Rank 0's call is ``mismatch``, every other rank's ``other`` (each a ``g -> awaitable``)."""
    return mismatch if rank == 0 else other


CALLS_THAT_DIFFER = {
    # (what every rank's error names: both calls), rank 0's call, the others' call
    "ring vs direct": (
        ("algorithm='ring'", "algorithm='direct'"),
        lambda g: g.allreduce(np.ones(20_000), algorithm="ring", timeout=20),
        lambda g: g.allreduce(np.ones(20_000), algorithm="direct", timeout=20),
    ),
    "doubling vs ring": (
        ("algorithm='doubling'", "algorithm='ring'"),
        lambda g: g.allreduce(np.ones(20_000), algorithm="doubling", timeout=20),
        lambda g: g.allreduce(np.ones(20_000), algorithm="ring", timeout=20),
    ),
    "tree vs ring": (
        ("algorithm='tree'", "algorithm='ring'"),
        lambda g: g.allreduce(np.ones(20_000), algorithm="tree", timeout=20),
        lambda g: g.allreduce(np.ones(20_000), timeout=20),  # auto: the ring at this size
    ),
    "small max vs sum": (
        ("op='max'", "op='sum'"),
        lambda g: g.allreduce(np.ones(4), op="max", timeout=20),
        lambda g: g.allreduce(np.ones(4), timeout=20),
    ),
    "ring max vs sum": (
        ("op='max'", "op='sum'"),
        lambda g: g.allreduce(np.ones(20_000), op="max", timeout=20),
        lambda g: g.allreduce(np.ones(20_000), timeout=20),
    ),
    "mean vs sum": (
        ("op='mean'", "op='sum'"),
        lambda g: g.allreduce(np.ones(4), op="mean", timeout=20),
        lambda g: g.allreduce(np.ones(4), timeout=20),
    ),
    "reduce_scatter min vs sum": (
        ("op='min'", "op='sum'"),
        lambda g: g.reduce_scatter(np.ones(30), op="min", timeout=20),
        lambda g: g.reduce_scatter(np.ones(30), timeout=20),
    ),
    "allreduce vs broadcast": (
        ("allreduce(", "broadcast(root=0)"),
        lambda g: g.allreduce(np.ones(4), timeout=20),
        lambda g: g.broadcast(None, root=0, timeout=20),
    ),
    "allreduce vs allgather": (
        ("allreduce(", "allgather()"),
        lambda g: g.allreduce(np.ones(4), timeout=20),
        lambda g: g.allgather(np.ones(4), timeout=20),
    ),
    # every rank waits and nobody sends (rank 0 waits for root 1, the others for root 0): the
    # stalled calls ask the peers they wait for what those call at that number (wire.PROBE)
    "broadcast from roots that wait": (
        ("broadcast(root=1)", "broadcast(root=0)"),
        lambda g: g.broadcast(None, root=1, timeout=20),
        lambda g: g.broadcast(None, root=0, timeout=20),
    ),
    # the barrier's messages were an allreduce of an int64 zero's: the two passed for each other
    "barrier vs allreduce": (
        ("barrier()", "allreduce("),
        lambda g: g.barrier(timeout=20),
        lambda g: g.allreduce(np.zeros((), np.int64), timeout=20),
    ),
}


@pytest.mark.parametrize("case", list(CALLS_THAT_DIFFER))
async def test_ranks_that_call_different_things_at_one_number_all_raise_at_once(nodes: list[Node], case: str) -> None:
    """A forced algorithm, an op or a collective that differs between ranks used to wait for
    tags that never came (for ever, at collectives.timeout's default) or reduce garbage. Every
    rank now raises, naming both calls, long before the 20 s timeout; the group goes on."""
    names, theirs, others = CALLS_THAT_DIFFER[case]
    groups = [n.group() for n in nodes]
    t0 = asyncio.get_running_loop().time()
    got = await outcomes(groups, lambda g: other_call(g.rank, theirs, others)(g), bound=15)
    assert asyncio.get_running_loop().time() - t0 < 5, got
    for g, o in zip(groups, got, strict=True):
        assert isinstance(o, CollectiveError), (g.rank, got)
        assert "timed out" not in str(o) and "same arguments on every rank" in str(o), o
        assert all(name in str(o) for name in names), (names, o)
        assert o.member is not None and o.member != g.members[g.rank], o  # names the other rank
    assert not any(g.broken for g in groups)
    await still_usable(groups)
    assert not any(g._waiting or g._steps or g._aborted or g._wants for g in groups)  # nothing left behind


async def test_a_broadcast_from_another_root_raises_where_its_message_lands(nodes: list[Node]) -> None:
    """Ranks 0 and 1 broadcast from root 1, rank 2 from root 0: rank 2 used to wait for rank 0,
    which sends nothing, for ever. It now raises on rank 1's message, naming both roots. Ranks 0
    and 1 agree with each other and finish before any message could tell them otherwise: a rank
    returns once its own part is done (docs/collectives.md)."""
    groups = [n.group() for n in nodes]
    got = await outcomes(
        groups, lambda g: g.broadcast(f"from {g.rank}", root=1 if g.rank < 2 else 0, timeout=20), bound=15
    )
    assert got[:2] == ["from 1", "from 1"], got
    assert isinstance(got[2], CollectiveError) and got[2].member == "n1", got
    assert "broadcast(root=1)" in str(got[2]) and "broadcast(root=0)" in str(got[2]), got
    await still_usable(groups)
