"""Big messages (``BIG_MESSAGE`` bytes or more): the caller may reuse its buffer once
``send`` returns, and they are delivered exactly once with the bytes of the call, across
connection cuts before their ack; with copying on (``link.big_copy_max_bytes``), how far
sends run ahead of acks is bounded; with it off (default), a big send waits for its ack."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np
import pytest

from aionet import Node
from aionet.config import Config
from aionet.core.link import BIG_MESSAGE
from aionet.core.replay_copies import COPY_BUDGET, COPY_MAX
from aionet.errors import ConfigError
from aionet.testing import FaultProxy

MiB = 2**20


def _copying(**tcp: int) -> Config:
    sections: dict = {"link": {"big_copy_max_bytes": COPY_MAX}}
    if tcp:
        sections["transport"] = {"tcp": tcp}
    return Config.from_dict(sections, env={})


@contextlib.asynccontextmanager
async def proxied(cfg_b: Config | None = None) -> AsyncIterator[tuple[Node, Node, FaultProxy]]:
    """``b`` dials ``a`` through a proxy that can stall and cut; ``b`` sends to ``a``."""
    a = Node(name="a", listen="tcp://127.0.0.1:0")
    b = Node(name="b", listen="tcp://127.0.0.1:0", config=cfg_b)
    await a.start()
    await b.start()
    pa = FaultProxy.to(a.addresses[0])
    try:
        await pa.start()
        await b.connect(pa.address)
        await b.send("a", "hello", 0)
        await a.recv("hello", timeout=10)
        yield a, b, pa
    finally:
        pa.stall(False)
        await b.stop()
        await a.stop()
        await pa.stop()


async def _recv_n(node: Node, channel: str, n: int, timeout: float = 30) -> list:
    got: list = []
    async with asyncio.timeout(timeout):
        while len(got) < n:
            got.extend(await node.recv_batch(channel))
    return got


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [BIG_MESSAGE, 3 * MiB, COPY_MAX + MiB], ids=["1MiB", "3MiB", "over-copy-max"])
@pytest.mark.parametrize("copying", [False, True], ids=["ack-paced", "copying"])
async def test_the_buffer_may_be_reused_when_send_returns(size, copying):
    """One array, refilled before every send (the pattern the promise exists for)."""
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0") as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address], config=_copying() if copying else None) as b,
    ):
        arr = np.empty(size, np.uint8)
        n = 12
        reader = asyncio.ensure_future(_recv_n(a, "big", n))
        for i in range(n):
            arr[:] = i
            await b.send("a", "big", arr)
        got = await reader
        assert [int(x[0]) for x in got] == list(range(n))
        assert all(len(x) == size and (x == i).all() for i, x in enumerate(got))


@pytest.mark.timeout(60)
async def test_cut_before_the_ack_delivers_the_original_bytes_exactly_once():
    async with proxied(_copying()) as (a, b, pa):
        link = b._peers["a"].link
        arr = np.empty(MiB, np.uint8)
        pa.stall()  # nothing reaches a, so nothing is acknowledged
        for i in (1, 2, 3):
            arr[:] = i
            await asyncio.wait_for(b.send("a", "big", arr), 10)  # returns before any ack
        arr[:] = 99  # the caller reuses its buffer
        assert len(link.state.unacked) >= 3, "acknowledged already: the test proved nothing"
        pa.cut(reset=True)  # what was in flight is lost with the connection
        pa.stall(False)
        got = await _recv_n(a, "big", 3)
        assert [bytes(np.unique(x)) for x in got] == [b"\x01", b"\x02", b"\x03"]
        await b.send("a", "big", "end")
        assert await a.recv("big", timeout=10) == "end"  # and nothing twice before it


@pytest.mark.timeout(60)
async def test_sends_run_ahead_of_acks_by_at_most_the_copy_budget():
    # a transport buffer large enough that only the copy budget can hold the sender back
    async with proxied(_copying(write_high_water=256 * MiB)) as (a, b, pa):
        link = b._peers["a"].link
        arr = np.ones(MiB, np.uint8)
        pa.stall()
        done = 0

        async def flood() -> None:
            nonlocal done
            while True:
                await b.send("a", "big", arr)
                done += 1

        task = asyncio.ensure_future(flood())
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), 1.0)
            # ran ahead by the budget (envelope headers make 8 x 1 MiB just exceed it), then waited
            assert COPY_BUDGET // MiB <= done <= COPY_BUDGET // MiB + 1
            assert link._copies.inflight_bytes <= COPY_BUDGET + 2 * (MiB + 4096)  # + the newest two
        finally:
            pa.stall(False)
            got = await _recv_n(a, "big", done + 4)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert all((x == 1).all() for x in got)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("size", "copying"), [(COPY_MAX + MiB, True), (MiB, False)], ids=["over-copy-max", "default"])
async def test_a_send_not_copied_returns_only_once_acknowledged(size, copying):
    async with proxied(_copying() if copying else None) as (a, b, pa):
        arr = np.full(size, 7, np.uint8)
        pa.stall()
        task = asyncio.ensure_future(b.send("a", "big", arr))
        await asyncio.sleep(0.5)
        assert not task.done()  # zero-copy: the replay buffer still needs the caller's memory
        pa.stall(False)
        await asyncio.wait_for(task, 20)
        got = await a.recv("big", timeout=20)
        assert len(got) == size and (got == 7).all()


def test_a_negative_copy_bound_is_refused_with_the_fix_named():
    with pytest.raises(ConfigError, match="big_copy_max_bytes must be >= 0"):
        Config.from_dict({"link": {"big_copy_max_bytes": -1}}, env={})
