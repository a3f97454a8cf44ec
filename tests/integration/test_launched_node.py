"""A launched node in-process: it waits for its world, names a missing rank, and moves off a
computed port that something else took (it joins through the seeds either way)."""

from __future__ import annotations

import asyncio
import socket

import pytest

import aionet
from aionet.config import Config
from tests.conftest import wait_for


def _launched(rank: int, world: int, **launch: object) -> Config:
    return Config.from_dict({"node": {"rank": rank, "world_size": world}, "launch": launch}, env={})


async def test_start_waits_for_the_world_and_group_is_the_world_in_rank_order() -> None:
    b = aionet.Node(name="rank-0", listen="tcp://127.0.0.1:0", config=_launched(0, 2, wait_timeout=10))
    first = asyncio.ensure_future(b.start())  # rank 0 listens, then waits for rank 1
    await wait_for(lambda: bool(b._listeners))
    a = aionet.Node(name="rank-1", listen="tcp://127.0.0.1:0", join=[b.address], config=_launched(1, 2))
    try:
        assert not first.done()  # still waiting for its world
        await asyncio.wait_for(asyncio.gather(first, a.start()), 15)
        assert (a.rank, a.world_size, a.world()) == (1, 2, ["rank-0", "rank-1"])
        assert list(a.group().members) == ["rank-0", "rank-1"] and a.group().rank == 1
    finally:
        await a.stop()
        await b.stop()


async def test_a_missing_rank_is_named_when_the_world_wait_times_out() -> None:
    n = aionet.Node(name="rank-0", listen="tcp://127.0.0.1:0", config=_launched(0, 3, wait_timeout=0.3))
    with pytest.raises(aionet.PeerUnavailable, match="rank-1, rank-2"):
        await n.start()


async def test_a_taken_launch_port_moves_to_a_free_one() -> None:
    seed = aionet.Node(name="rank-0", listen="tcp://127.0.0.1:0")
    await seed.start()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    node = aionet.Node(name="rank-1", listen=f"tcp://127.0.0.1:{port}", join=[seed.address], config=_launched(1, 2))
    try:
        await node.start()
        assert not node.address.endswith(f":{port}")
        assert sorted(node.members()) == ["rank-0", "rank-1"]
    finally:
        await node.stop()
        await seed.stop()
        taken.close()
    plain = aionet.Node(name="solo", listen=f"tcp://127.0.0.1:{seed.address.rsplit(':', 1)[1]}")
    await plain.start()  # not launched: a taken port stays an error (checked below with a held port)
    try:
        with pytest.raises(aionet.TransportError, match="address already in use"):
            await aionet.Node(name="solo2", listen=plain.address).start()
    finally:
        await plain.stop()
