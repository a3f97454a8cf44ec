"""A peer that asks a node for its resources before the node's scheduler has started waits for
them (found by tests/system/test_multihost.py: four nodes starting at once, each listing all as
seeds, learned an empty pool for a peer that had joined the membership but not yet started its
scheduler, and never placed a task there)."""

from __future__ import annotations

import asyncio

import pytest

from aionet import Node


@pytest.mark.timeout(30)
async def test_resources_asked_before_the_scheduler_starts_are_answered_once_it_has():
    node = Node(name="late", listen="tcp://127.0.0.1:0")
    early = asyncio.create_task(node.scheduler._svc_resources(None))  # what a peer's request runs
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not early.done(), "answered before the scheduler knew its resources"
    await node.start()
    try:
        info = await asyncio.wait_for(early, 10)
        assert info["total"].get("cpu", 0) >= 1 and info["run_tasks"] is True
    finally:
        await node.stop()
