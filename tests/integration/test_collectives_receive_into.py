"""Receive-into for the ring allreduce over real tcp:// connections: the allgather's segments
land straight in the result (no copy), results stay exact for every dtype and placement, every
registration is withdrawn when a call ends, and a call that failed gets nothing more written
into its ``out`` afterwards."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from aionet import CollectiveError
from aionet.testing import cluster

pytestmark = pytest.mark.timeout(60)
CFG = {"collectives": {"small_bytes": 4096, "segment_bytes": 1 << 18}}  # several 256 KiB segments per chunk


def targets(node: Any) -> Any:
    return node._receive_targets  # the node's registry (core/receive_targets.py)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int8"])
async def test_segments_land_in_the_result_and_stay_exact(n: int, dtype: str) -> None:
    size = (3 << 20) // np.dtype(dtype).itemsize + 5  # 3 MiB and a ragged tail: uneven chunks
    rng = np.random.default_rng(n)
    async with cluster(n, "tcp", config=CFG) as nodes:
        grps = [node.group() for node in nodes]
        for placement in ("out", "inplace", "fresh"):
            if dtype.startswith("int"):
                xs = [rng.integers(-50, 50, size).astype(dtype) for _ in range(n)]
            else:
                xs = [rng.standard_normal(size).astype(dtype) for _ in range(n)]
            expect = np.sum(np.stack(xs), axis=0, dtype=dtype) if dtype.startswith("int") else None
            before = [targets(node).hits for node in nodes]
            ins = [x.copy() for x in xs] if placement == "inplace" else xs
            outs = [np.empty_like(x) for x in xs] if placement == "out" else ins if placement == "inplace" else None

            def call(g: Any, ins: Any = ins, outs: Any = outs) -> Any:
                return g.allreduce(ins[g.rank], algorithm="ring", out=None if outs is None else outs[g.rank])

            res = await asyncio.wait_for(asyncio.gather(*(call(g) for g in grps)), 30)
            if outs is not None:
                assert all(r is o for r, o in zip(res, outs, strict=True))
            assert all(np.array_equal(r, res[0]) for r in res), placement  # the same bits everywhere
            if expect is not None:
                assert np.array_equal(res[0], expect), placement
            else:
                assert np.allclose(res[0], np.sum(np.stack(xs), axis=0), rtol=1e-5, atol=1e-4), placement
            landed = [targets(node).hits - b for node, b in zip(nodes, before, strict=True)]
            assert all(h > 0 for h in landed), (placement, landed)  # received in place, not copied
            assert all(targets(node).pending() == 0 for node in nodes)  # nothing left registered


async def test_a_failed_call_gets_nothing_written_into_its_out_afterwards() -> None:
    """Rank 0 times out waiting (rank 1 had not called yet), then rank 1 runs its part and sends
    rank 0 the allgather segments rank 0 had offered places for: they must not land there."""
    async with cluster(2, "tcp", config=CFG) as nodes:
        g0, g1 = (node.group() for node in nodes)
        x = np.ones(1 << 20, np.float32)
        out0 = np.full_like(x, -7.0)
        with pytest.raises(CollectiveError, match="timed out"):
            await g0.allreduce(x, algorithm="ring", out=out0, timeout=0.5)
        assert targets(nodes[0]).pending() == 0
        with pytest.raises(CollectiveError):
            await g1.allreduce(x, algorithm="ring", out=np.empty_like(x), timeout=1.0)
        await nodes[1].request(nodes[0].name, "aionet.echo", None, timeout=5)  # all of rank 1's messages arrived
        assert (out0 == -7.0).all()
        assert targets(nodes[0]).hits == 0


async def test_inproc_has_no_hook_and_copies_as_before() -> None:
    async with cluster(2, "inproc", config=CFG) as nodes:
        grps = [node.group() for node in nodes]
        x = np.arange(1 << 20, dtype=np.float32)
        res = await asyncio.wait_for(asyncio.gather(*(g.allreduce(x, algorithm="ring") for g in grps)), 30)
        assert all(np.array_equal(r, 2 * x) for r in res)
        assert all(targets(node).hits == 0 and targets(node).pending() == 0 for node in nodes)
