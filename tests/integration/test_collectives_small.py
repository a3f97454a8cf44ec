"""The small allreduce (arrays under RAW_MAX bytes, driven from the channel callback): it agrees
bit for bit with ranks on the generic driver, takes messages that came before the call, turns a
peer's wrong-sized bytes into a CollectiveError on the call (the connection stays up), and a
timed-out or broken call leaves nothing registered behind."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from aionet import CollectiveError
from aionet.collectives import Group
from aionet.testing import cluster
from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(60)


async def each(groups: list[Group], fn: Any) -> list[Any]:
    return await asyncio.wait_for(asyncio.gather(*(fn(g) for g in groups)), 20)


@pytest.mark.parametrize("n", [3, 4, 5])
async def test_ranks_on_the_generic_driver_and_the_small_one_agree_bit_for_bit(n: int) -> None:
    """A non-contiguous input takes the generic driver; the messages are the same, so a group
    where some ranks use each path gets the same bits everywhere (folded ranks included)."""
    rng = np.random.default_rng(n)
    async with cluster(n, "tcp") as nodes:
        groups = [node.group() for node in nodes]
        for generic in ({0}, {n - 1}, set(range(0, n, 2))):
            xs = [rng.standard_normal(14).astype(np.float32) for _ in range(n)]

            def arg(g: Group, xs: list[np.ndarray] = xs, generic: set[int] = generic) -> np.ndarray:
                if g.rank in generic:
                    wide = np.zeros(28, np.float32)
                    wide[::2] = xs[g.rank]
                    return wide[::2]  # a strided view: the generic path
                return xs[g.rank]

            for op in ("sum", "prod", "max", "mean"):
                outs = await each(groups, lambda g, op=op: g.allreduce(arg(g), op=op))
                assert all(o.tobytes() == outs[0].tobytes() for o in outs), (op, generic)
                expect = np.mean(np.stack(xs), axis=0) if op == "mean" else None
                if expect is not None:
                    np.testing.assert_allclose(outs[0], expect, rtol=1e-5)


async def test_messages_that_came_before_the_call_are_taken() -> None:
    async with cluster(4, "tcp") as nodes:
        groups = [node.group() for node in nodes]
        late = groups[0]
        others = [asyncio.ensure_future(g.allreduce(np.int64(g.rank) + np.zeros(3, np.int64))) for g in groups[1:]]
        await wait_for(lambda: bool(late._early), 10)  # rank 1's round-0 message is waiting
        mine = await asyncio.wait_for(late.allreduce(np.zeros(3, np.int64)), 10)
        outs = [mine, *await asyncio.wait_for(asyncio.gather(*others), 10)]
        assert all(np.array_equal(o, np.full(3, 6)) for o in outs)
        assert not late._early and not late._steps and not late._runs


async def test_a_peer_with_another_shape_fails_the_call_not_the_connection() -> None:
    async with cluster(2, "tcp") as nodes:
        ga, gb = (node.group() for node in nodes)
        results = await asyncio.wait_for(
            asyncio.gather(ga.allreduce(np.ones(2, np.float32)), gb.allreduce(np.ones(3, np.float32)),
                           return_exceptions=True), 10)  # fmt: skip
        assert all(isinstance(r, CollectiveError) and "same shape and dtype" in str(r) for r in results)
        # the links are fine: a new group of the same members goes on
        fresh = [ga.shrink(), gb.shrink()]
        outs = await each(fresh, lambda g: g.allreduce(np.ones(2, np.float32)))
        assert all(np.array_equal(o, [2, 2]) for o in outs)


async def test_a_cancelled_or_timed_out_call_leaves_no_step_registered() -> None:
    async with cluster(4, "tcp") as nodes:
        groups = [node.group() for node in nodes]
        call = asyncio.ensure_future(groups[0].allreduce(np.ones(2)))
        await wait_for(lambda: bool(groups[0]._steps), 10)  # waiting for its round-0 partner
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert not groups[0]._steps and not groups[0]._runs
        with pytest.raises(CollectiveError, match="timed out"):
            await groups[0].allreduce(np.ones(2), timeout=0.2)  # the others never join
        assert not groups[0]._steps and not groups[0]._runs
        with pytest.raises(CollectiveError, match="timed out"):
            await groups[0].allreduce(np.ones(2))  # broken until shrunk, at once
        fresh = [g.shrink() for g in groups]
        assert await each(fresh, lambda g: g.barrier()) == [None] * 4
        outs = await each(fresh, lambda g: g.allreduce(np.full((2, 2), g.rank), out=np.empty((2, 2), np.int64)))
        assert all(np.array_equal(o, np.full((2, 2), 6)) for o in outs)
