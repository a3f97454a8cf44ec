"""The distributed cache on in-process clusters: versions, cas, local replicas, zero-copy
arrays, single-flight loads, watches, fenced locks, re-replication after a join."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

import aionet.testing
from aionet import ConfigError
from aionet.cache import CacheFull, StaleFenceError
from aionet.config import Config
from tests.conftest import wait_for
from tests.etcd_server import etcd_server

FAST = {"heartbeat": {"interval": 0.1}}


@pytest.fixture(scope="module")
def etcd_url():
    with etcd_server() as url:
        yield url


@pytest.fixture(params=["embedded", "etcd"])
def backend(request) -> dict:
    """Cluster config for each coordination backend (the lock and cas suites run on both)."""
    if request.param == "embedded":
        return FAST
    return {**FAST, "cache": {"coordination": request.getfixturevalue("etcd_url")}}


async def test_versions_cas_delete_and_local_replica_reads(backend) -> None:
    async with aionet.testing.cluster(n=3, config=backend) as nodes:
        a, b, c = nodes
        v1 = await a.cache.put("k", "one")
        assert [await n.cache.get_versioned("k") for n in nodes] == [("one", v1)] * 3
        assert not await c.cache.cas("k", "x", v1 - 1)
        assert await c.cache.cas("k", "two", v1)
        value, v2 = await b.cache.get_versioned("k")
        assert value == "two" and v2 > v1
        assert await a.cache.cas("new", 1, 0) and not await b.cache.cas("new", 2, 0)
        # a replica answers from its own copy: the key sits on exactly its owners
        owners = a.cache.owners("k")
        assert len(owners) == 2 and {n.name for n in nodes if "k" in n.cache.store} == set(owners)
        assert await a.cache.delete("k") and not await b.cache.delete("k")
        assert await c.cache.get("k", "gone") == "gone"
        assert await b.cache.get_versioned("k") == (None, 0)
        v3 = await c.cache.put("k", "back")
        assert v3 > v2  # a deleted key's versions do not restart


async def test_array_on_a_replica_is_the_same_memory_read_only() -> None:
    async with aionet.testing.cluster(n=3, config=FAST) as nodes:
        src = np.arange(1 << 16, dtype=np.float32)
        await nodes[0].cache.put("arr", src)
        src[0] = -1  # the cache took its own copy
        holder = next(n for n in nodes if n.name in n.cache.owners("arr"))
        x, y = await holder.cache.get("arr"), await holder.cache.get("arr")
        assert np.shares_memory(x, y) and not x.flags.writeable and x[0] == 0
        with pytest.raises(ValueError):
            x[1] = 5
        z = await holder.cache.get("arr", copy=True)
        assert z.flags.writeable and not np.shares_memory(x, z)
        other = next((n for n in nodes if n.name not in n.cache.owners("arr")), None)
        if other is not None:
            assert np.array_equal(await other.cache.get("arr"), x)


async def test_get_or_load_runs_the_loader_once_in_the_cluster() -> None:
    async with aionet.testing.cluster(n=3, config=FAST) as nodes:
        calls: list[str] = []

        def make(who: str):
            async def loader() -> str:
                calls.append(who)
                await asyncio.sleep(0.05)
                return f"by {who}"

            return loader

        got = await asyncio.gather(*(n.cache.get_or_load("slow", make(n.name)) for n in nodes for _ in range(4)))
        assert len(calls) == 1 and set(got) == {f"by {calls[0]}"}

        async def broken() -> str:
            raise RuntimeError("backend down")

        with pytest.raises(RuntimeError, match="backend down"):
            await nodes[1].cache.get_or_load("flaky", broken)
        # the failed claim was released: the next asker loads
        assert await nodes[2].cache.get_or_load("flaky", lambda: "ok") == "ok"


async def test_watch_sees_every_change_in_version_order() -> None:
    async with aionet.testing.cluster(n=3, config=FAST) as nodes:
        w = await nodes[2].cache.watch("jobs/").ready()
        other = nodes[2].cache.watch("zzz/")

        async def writer(n, i: int) -> None:
            for j in range(20):
                await n.cache.put(f"jobs/{j % 4}", (i, j))

        await asyncio.gather(*(writer(n, i) for i, n in enumerate(nodes)))
        await nodes[0].cache.delete("jobs/0")
        await nodes[0].cache.put("elsewhere", 1)
        got = [await w.get(5) for _ in range(61)]
        per_key: dict[str, list[int]] = {}
        for c in got:
            per_key.setdefault(c.key, []).append(c.version)
        assert sum(map(len, per_key.values())) == 61 and w.dropped == 0
        for versions in per_key.values():
            assert versions == sorted(versions) and len(set(versions)) == len(versions)
        assert got[-1].kind == "delete" and got[-1].key == "jobs/0"
        assert other._q.empty()
        w.close()
        other.close()


async def test_lock_fences_writes_and_tokens_rise(backend) -> None:
    async with aionet.testing.cluster(n=3, config=backend) as nodes:
        a, b, c = nodes
        # leases end here by release, never by expiry: a TTL far above any loop stall of a
        # loaded CI box (seconds), so a stalled renewal cannot end `second` before its write
        async with a.lock("res", ttl=20) as first:
            await c.cache.put("data", 1, fence=first)
        async with b.lock("res", ttl=20) as second:
            assert second.token > first.token
            with pytest.raises(StaleFenceError):
                await c.cache.put("data", 2, fence=first)  # the old holder, late
            await a.cache.put("data", 3, fence=second)
        with pytest.raises(StaleFenceError):
            await a.cache.put("data", 4, fence=second)  # released: no longer live
        assert await b.cache.get("data") == 3


async def test_plain_remote_puts_replicate_keep_fences_and_raise_typed_errors() -> None:
    """The common put (no ttl, pin or fence) at a remote primary takes the short request and
    updates the entry in place: every replica sees each version, a TTL or pin from an earlier
    write is replaced as any put replaces it, the lock tokens that wrote the key are kept
    (so a late holder is still refused), and a value too big fails as CacheFull here."""
    cfg = {**FAST, "cache": {"max_bytes": 64 * 1024}}
    async with aionet.testing.cluster(n=3, config=cfg) as nodes:
        key = next(k for k in (f"p{i}" for i in range(200)) if nodes[0].name not in nodes[0].cache.owners(k))
        a = nodes[0]
        primary = next(n for n in nodes if n.name == a.cache.owners(key)[0])
        async with a.lock("res", ttl=5) as lease:
            v0 = await a.cache.put(key, "fenced", ttl=30, pin=True, fence=lease)
        versions = [await a.cache.put(key, i) for i in range(5)]
        assert versions == sorted(versions) and versions[0] > v0 and len(set(versions)) == 5
        for n in nodes:
            assert await n.cache.get_versioned(key) == (4, versions[-1])
        e = primary.cache.store.peek(key)
        assert e.fences == {"res": lease.token} and not e.pinned and e.expires is None
        with pytest.raises(StaleFenceError):
            await a.cache.put(key, "late", fence=lease)
        with pytest.raises(CacheFull):
            await a.cache.put(key, b"x" * (128 * 1024))
        assert await a.cache.get(key) == 4


async def test_lock_is_mutually_exclusive_and_renewed(backend) -> None:
    async with aionet.testing.cluster(n=3, config=backend) as nodes:
        held: list[int] = []

        async def worker(n) -> None:
            for _ in range(5):
                async with n.lock("counter", ttl=5) as lease:  # released, never expired
                    held.append(lease.token)
                    value = await n.cache.get("n", 0)
                    await asyncio.sleep(random.random() * 0.01)
                    await n.cache.put("n", value + 1, fence=lease)

        await asyncio.gather(*(worker(n) for n in nodes))
        assert await nodes[0].cache.get("n") == 15 and held == sorted(held)
        # a lease held past its ttl is kept by renewals (the ttl leaves room for loop stalls
        # of a loaded CI box; the hold outlasts it by half)
        async with nodes[1].lock("long", ttl=1.2) as lease:
            await asyncio.sleep(1.8)  # the scenario: holding the lock past its ttl
            assert not lease.lost.is_set()
            await nodes[0].cache.put("x", 1, fence=lease)
        with pytest.raises(TimeoutError):
            async with nodes[0].lock("busy", ttl=5), nodes[1].lock("busy", ttl=5, timeout=0.2):
                pass


async def test_1000_concurrent_cas_increments_from_4_nodes(backend) -> None:
    async with aionet.testing.cluster(n=4, transport="tcp", config=backend) as nodes:
        await nodes[0].cache.put("counter", 0)

        async def incr(n) -> int:
            tries = 0
            delay = 0.002
            while True:
                tries += 1
                value, version = await n.cache.get_versioned("counter")
                if await n.cache.cas("counter", value + 1, version):
                    return tries
                await asyncio.sleep(random.random() * delay)
                delay = min(delay * 2, 0.2)  # back off: fewer doomed round trips under contention

        tries = await asyncio.gather(*(incr(nodes[i % 4]) for i in range(1000)))
        assert await nodes[3].cache.get("counter") == 1000
        assert max(tries) >= 2  # they did contend


async def test_keys_move_to_a_joining_node_and_stay_readable() -> None:
    async with aionet.testing.cluster(n=2, config=FAST) as nodes:
        a, b = nodes
        await asyncio.gather(*(a.cache.put(f"k{i}", i) for i in range(500)))
        cfg = Config.from_dict(FAST, env={})
        c = aionet.Node(name="n2", listen="inproc://", join=[a.address], config=cfg)
        await c.start()
        try:
            everyone = [a, b, c]

            await wait_for(lambda: all(len(n.cache.service.placement.members) == 3 for n in everyone), 10)
            await wait_for(
                lambda: all(sum(f"k{i}" in n.cache.store for n in everyone) == 2 for i in range(500)), timeout=10
            )
            for i in range(500):
                assert {n.name for n in everyone if f"k{i}" in n.cache.store} == set(c.cache.owners(f"k{i}"))
            assert [await c.cache.get(f"k{i}") for i in range(500)] == list(range(500))
            assert c.cache.stats()["entries"] > 0
        finally:
            await c.stop()


async def test_ttl_expires_everywhere() -> None:
    async with aionet.testing.cluster(n=2, config=FAST) as nodes:
        await nodes[0].cache.put("t", 1, ttl=0.1)
        assert await nodes[1].cache.get("t") == 1
        await asyncio.sleep(0.15)
        assert await nodes[0].cache.get("t") is None and await nodes[1].cache.get("t") is None


def test_cache_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="cache.replicas"):
        Config.from_dict({"cache": {"replicas": 0}}, env={})
    with pytest.raises(ConfigError, match="etcd://host:port"):
        Config.from_dict({"cache": {"coordination": "redis://127.0.0.1:2379"}}, env={})
    assert Config.from_dict({"cache": {"coordination": "etcd://10.0.0.1:2379"}}, env={}).cache.coordination
    cfg = Config.from_dict({"cache": {"max_bytes": "64MiB", "replicas": 3}}, env={})
    assert cfg.cache.max_bytes == 64 * 2**20 and cfg.cache.replicas == 3


async def test_malformed_watch_batches_and_subscriptions_are_refused_not_fatal() -> None:
    async with aionet.testing.cluster(n=2, config=FAST) as nodes:
        a, b = nodes
        key = next(f"w/{i}" for i in range(100) if a.cache.owners(f"w/{i}")[0] == "n0")
        async with b.cache.watch("w/") as w:
            await a.send("n1", "aionet.cache.changes", ["garbage"])  # not a list of changes
            await a.send("n1", "aionet.cache.changes", [[1, "x", 1, None]])  # wrong field types
            await a.cache.put(key, 1)
            c = await w.get(5)
            assert (c.key, c.value) == (key, 1)  # the watch consumer survived both
        with pytest.raises(aionet.RemoteError):
            await a.request("n1", "aionet.cache.watch", ["n0", 5, True])
        with pytest.raises(aionet.RemoteError):
            await a.request("n1", "aionet.cache.write", ["short"])


async def test_etcd_garbage_replies_are_typed_errors() -> None:
    from aionet.cache.etcd import EtcdClient, EtcdError

    replies = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nnope!",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]",
        b"HTTP/1.1 500 Oops\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: 999999999\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"garbage without headers",
    ]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(replies.pop(0))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = EtcdClient(f"etcd://127.0.0.1:{port}", timeout=2.0)
    try:
        for _ in range(6):
            with pytest.raises(EtcdError):
                await client.call("kv/range", {"key": "eA=="})
    finally:
        client.close()
        server.close()
        await server.wait_closed()


async def test_a_node_leaving_gracefully_loses_no_key() -> None:
    async with aionet.testing.cluster(n=3, config=FAST) as nodes:
        a, b, c = nodes
        await asyncio.gather(*(a.cache.put(f"k{i}", i) for i in range(1000)))
        assert sum(len(n.cache.store) for n in nodes) == 2000
        await c.stop()
        await wait_for(lambda: len(a.cache.store) == 1000 and len(b.cache.store) == 1000, timeout=10)
        assert [await a.cache.get(f"k{i}") for i in range(1000)] == list(range(1000))
