"""Device (CuPy-like) inputs to collectives: reduced through the node's staging backend's host
copies, results returned as device arrays. On the CPU with the simulated device backend and a
``__cuda_array_interface__`` test double; the same path runs CuPy on a GPU node."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from aionet import Node
from aionet.devices import SimulatedDeviceBackend
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
