"""Device (CuPy-like) inputs to collectives: reduced through the node's staging backend's host
copies, results returned as device arrays. On the CPU with the simulated device backend and a
``__cuda_array_interface__`` test double; the same path runs CuPy on a GPU node."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from aionet import CollectiveError, Node
from aionet.devices import Devices, SimulatedDeviceBackend
from tests.unit.devices.test_staging import CAIArray


async def _nodes(n: int) -> list[Node]:
    nodes: list[Node] = []
    for i in range(n):
        join = [nodes[0].address] if nodes else None
        node = Node(name=f"d{i}", listen="tcp://127.0.0.1:0", join=join, device_backend=SimulatedDeviceBackend())
        await node.start()
        nodes.append(node)
    for node in nodes:
        await node.wait_members(n, timeout=10)
    return nodes


async def test_device_arrays_are_reduced_and_come_back_on_the_device() -> None:
    nodes = await _nodes(3)
    try:
        groups = [node.group() for node in nodes]
        xs = [np.arange(100_000, dtype=np.float32) * (i + 1) for i in range(3)]
        outs = await asyncio.gather(*(g.allreduce(CAIArray(x)) for g, x in zip(groups, xs, strict=True)))
        for out, x in zip(outs, xs, strict=True):
            assert isinstance(out, np.ndarray)  # the simulated backend's "device" memory
            assert not np.shares_memory(out, x)
            np.testing.assert_array_equal(out, xs[0] * 6)
        fused = await asyncio.gather(
            *(g.allreduce([CAIArray(x[:10]), x[10:20].astype(np.int64)]) for g, x in zip(groups, xs, strict=True))
        )
        np.testing.assert_array_equal(fused[0][0], xs[0][:10] * 6)
        np.testing.assert_array_equal(fused[0][1], (xs[0][10:20] * 6).astype(np.int64))
        blocks = await asyncio.gather(*(g.reduce_scatter(CAIArray(x[:9])) for g, x in zip(groups, xs, strict=True)))
        np.testing.assert_array_equal(np.concatenate(blocks), xs[0][:9] * 6)
        with pytest.raises(TypeError, match="out="):
            await groups[0].allreduce(CAIArray(xs[0]), out=np.empty_like(xs[0]))
    finally:
        for node in reversed(nodes):
            await node.stop()


async def test_repeated_device_allreduces_reuse_one_host_copy_per_rank() -> None:
    """A training loop allreduces the same gradient size every step: each rank copies it into
    one host buffer (pinned on a GPU) that later calls reuse, reduced in place there, with
    correct results every step; a list input and ``reduce`` hand theirs back too."""
    nodes = await _nodes(3)
    try:
        groups = [node.group() for node in nodes]
        for step in range(4):
            xs = [np.arange(300_001, dtype=np.float64) * (i + 1) + step for i in range(3)]
            outs = await asyncio.gather(*(g.allreduce(CAIArray(x)) for g, x in zip(groups, xs, strict=True)))
            for out in outs:
                np.testing.assert_array_equal(out, sum(xs))
        for node in nodes:
            scratch = node._device.stager.scratch
            assert (scratch.allocated, scratch.reused) == (1, 3)
            assert scratch.idle_bytes >= 300_001 * 8
        xs = [np.arange(300_001, dtype=np.float64) * (i + 1) for i in range(3)]
        got = await asyncio.gather(*(g.reduce(CAIArray(x), root=1) for g, x in zip(groups, xs, strict=True)))
        assert got[0] is None and got[2] is None
        np.testing.assert_array_equal(got[1], sum(xs))
        lists = await asyncio.gather(
            *(g.allreduce([CAIArray(x), CAIArray(x[:5])]) for g, x in zip(groups, xs, strict=True))
        )
        np.testing.assert_array_equal(lists[0][0], sum(xs))
        np.testing.assert_array_equal(lists[2][1], sum(xs)[:5])
        for node in nodes:
            scratch = node._device.stager.scratch
            assert scratch.reused == 5  # reduce's copy and the list's big one reused the buffer
            assert scratch.allocated == 2  # the list's second, small array needed its own
    finally:
        for node in reversed(nodes):
            await node.stop()


async def test_a_failed_device_allreduce_keeps_its_host_copy_out_of_reuse() -> None:
    """A call that times out may still have sends referencing its host copy: the buffer is not
    lent again, so a later call cannot overwrite bytes a replay would send."""
    nodes = await _nodes(2)
    try:
        g0 = nodes[0].group()
        with pytest.raises(CollectiveError, match="timed out"):
            await g0.allreduce(CAIArray(np.ones(200_000)), timeout=0.2)  # rank 1 never joins the call
        scratch = nodes[0]._device.stager.scratch
        assert (scratch.allocated, scratch.idle_bytes) == (1, 0)
    finally:
        for node in reversed(nodes):
            await node.stop()


@pytest.mark.timeout(90)
@pytest.mark.skipif(not Devices(use_nvml=False).cuda_available(), reason="no CUDA device")
async def test_cupy_arrays_on_a_real_gpu() -> None:
    """Real CuPy inputs (the node's own CuPy backend, pinned staging): results come back as CuPy
    arrays in new device memory, equal to the host computation, for every op that takes arrays."""
    import cupy as cp

    nodes: list[Node] = []
    try:
        for i in range(3):
            node = Node(name=f"g{i}", listen="tcp://127.0.0.1:0", join=[nodes[0].address] if nodes else None)
            await node.start()
            nodes.append(node)
        for node in nodes:
            await node.wait_members(3, timeout=10)
        groups = [node.group() for node in nodes]
        xs = [(cp.arange(5_000_003, dtype=cp.float32) % 1024) * (i + 1) for i in range(3)]  # sums exact
        pairs = list(zip(groups, xs, strict=True))
        outs = await asyncio.gather(*(g.allreduce(x) for g, x in pairs))
        for out, x in zip(outs, xs, strict=True):
            assert isinstance(out, cp.ndarray) and out.data.ptr != x.data.ptr
            assert bool((out == xs[0] * 6).all())
        again = await asyncio.gather(*(g.allreduce(x) for g, x in pairs))  # the pinned host copy is reused
        assert all(bool((out == xs[0] * 6).all()) for out in again)
        for node in nodes:
            scratch = node._device.stager.scratch
            assert scratch.pinned and (scratch.allocated, scratch.reused) == (1, 1)
        means = await asyncio.gather(
            *(g.allreduce([x[:7], x[7:99]], op="mean") for g, x in zip(groups, xs, strict=True))
        )
        assert bool(cp.allclose(means[2][1], xs[0][7:99] * 2))
        got = await asyncio.gather(
            *(g.broadcast(x if g.rank == 0 else None, root=0) for g, x in zip(groups, xs, strict=True))
        )
        assert all(bool((b == xs[0]).all()) for b in got)
        parts = await asyncio.gather(*(g.allgather(x[:1000]) for g, x in pairs))
        assert all(bool((p[i] == xs[i][:1000]).all()) for p in parts for i in range(3))
    finally:
        for node in reversed(nodes):
            await node.stop()
