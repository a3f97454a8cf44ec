"""The cache across processes: a SIGKILLed node loses no key (2 replicas), and a SIGKILLed
lock holder keeps its lock until its lease ends; its token is then stale."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import pytest

from aionet import Node
from aionet.cache import Lease, StaleFenceError
from aionet.config import Config
from tests.conftest import wait_for
from tests.etcd_server import etcd_server

ENV = {"AIONET_HEARTBEAT_INTERVAL": "0.1"}
CFG = {"heartbeat": {"interval": 0.1}}


async def _cluster(spawn, coordination: str = "") -> tuple[object, list[Node]]:
    env = {**ENV, "AIONET_CACHE_COORDINATION": coordination}
    proc, info = spawn("--name", "w0", "--listen", "tcp://127.0.0.1:0", "--app", "tests.cache_apps:setup", env=env)
    cfg = {**CFG, "cache": {"coordination": coordination}}
    nodes = []
    for name in ("a", "b"):
        n = Node(name=name, listen="tcp://127.0.0.1:0", join=[info["addresses"][0]], config=Config.from_dict(cfg))
        await n.start()
        nodes.append(n)
    await wait_for(lambda: all(len(n.cache.service.placement.members) == 3 for n in nodes), timeout=20)
    return proc, nodes


async def test_killing_one_of_three_nodes_loses_no_key(spawn) -> None:
    proc, (a, b) = await _cluster(spawn)
    try:
        n = 10_000
        for start in range(0, n, 1000):
            await asyncio.gather(*(a.cache.put(f"key{i}", i) for i in range(start, start + 1000)))
        on_w0 = await a.request("w0", "test.cache.count", None, timeout=5)
        assert len(a.cache.store) + len(b.cache.store) + on_w0 == 2 * n  # every key on 2 nodes
        assert on_w0 > n // 2  # w0 held its share (about 2/3 of the keys)
        os.kill(proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        await wait_for(lambda: len(a.cache.store) == n and len(b.cache.store) == n, timeout=20)
        healed = time.monotonic() - t0
        got = await asyncio.gather(*(b.cache.get(f"key{i}") for i in range(n)))
        assert got == list(range(n))
        assert healed < 15
    finally:
        for node in (b, a):
            await node.stop()


# embedded: "res" has its lock state on w0 itself (a replica takes over), "guard" on a survivor;
# etcd: the lock is an etcd key on an etcd lease
@pytest.mark.parametrize(("backend", "name"), [("embedded", "res"), ("embedded", "guard"), ("etcd", "res")])
async def test_sigkilled_lock_holder_keeps_the_lock_until_its_lease_ends(spawn, backend: str, name: str) -> None:
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(etcd_server()) if backend == "etcd" else ""
        await _lock_holder_killed(spawn, url, name)


async def _lock_holder_killed(spawn, url: str, name: str) -> None:
    proc, (a, b) = await _cluster(spawn, url)
    if not url:
        assert a.cache.service.placement.primary("\x00lock\x00" + name) == ("w0" if name == "res" else "a")
    ttl = 1.0
    try:
        old = await a.request("w0", "test.cache.hold", [name, ttl, "guarded"], timeout=10)
        assert await b.cache.get("guarded") == "from holder"
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        # the dead holder's lease still runs: nobody gets the lock yet
        with pytest.raises(TimeoutError):
            async with a.lock(name, ttl=ttl, timeout=0.3):
                pass
        async with b.lock(name, ttl=ttl, timeout=10) as lease:
            waited = time.monotonic() - killed
            assert lease.token > old
            # its lease was renewed at most ttl/3 before the kill: it ended no earlier than this
            assert waited >= ttl - ttl / 3 - 0.05
            stale = Lease(name, old, ttl)  # the old holder's token, arriving late
            with pytest.raises(StaleFenceError):
                await a.cache.put("guarded", "late write", fence=stale)
            await a.cache.put("guarded", "new holder", fence=lease)
        assert await a.cache.get("guarded") == "new holder"
    finally:
        for node in (b, a):
            await node.stop()
