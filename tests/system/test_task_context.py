"""Tasks that know their place (node, rank, devices), preset options (@aionet.task), retries on
exceptions (retry_on=), order-only edges (after=) and re-prioritising queued tasks."""

from __future__ import annotations

import asyncio

import pytest

import aionet
from aionet.config import Config
from aionet.scheduler import TaskFailed
from tests import tasks_fns
from tests.conftest import wait_for
from tests.system.test_scheduler import F, cfg, cluster


async def test_task_context_gives_the_node_its_name_rank_and_devices() -> None:
    async with cluster(cfg(run_local=False), cfg(resources={"cpu": 2, "gpu": 2})) as (a, _b):
        info = await a.submit(F + "context_info", resources={"gpu": 1})
        assert info["has_node"] and info["node_name"] == "n1" and info["rank"] == -1
        assert info["devices"] in ([0], [1])
        proc = await a.submit(F + "context_info", resources={"gpu": 2}, executor="process")
        assert not proc["has_node"] and proc["node_name"] == "n1"  # another process: no Node there
        assert proc["devices"] == [0, 1] and proc["cuda"] == "0,1"


async def test_a_task_can_message_other_nodes_through_its_node() -> None:
    async with cluster(cfg(run_local=False), cfg()) as (a, _b):

        @a.service("upper")
        async def upper(text: str) -> str:
            return text.upper()

        assert await a.submit(F + "request_from_task", "n0", "hi") == "HI"


async def test_concurrent_whole_gpu_tasks_get_distinct_devices() -> None:
    async with cluster(cfg(run_local=False), cfg(resources={"cpu": 4, "gpu": 2})) as (a, _b):
        got = await asyncio.gather(*(a.submit(tasks_fns.gpu_hold, 0.3) for _ in range(2)))
        assert sorted(d for ds in got for d in ds) == [0, 1]  # both ran at once, one GPU each


async def test_retry_on_reruns_a_task_that_raised_a_listed_exception() -> None:
    async with cluster(cfg(run_local=False), cfg()) as (a, _b):
        ref = a.submit(tasks_fns.flaky, 2)  # @aionet.task(retries=3, retry_on=(ConnectionError,))
        assert await ref == 3 and ref.attempts == 3
        with pytest.raises(TaskFailed) as err:  # retries run out: the task's own error, not TaskLost
            await a.submit(tasks_fns.flaky, 5)
        assert err.value.remote_type == "ConnectionResetError"
        with pytest.raises(TaskFailed):  # submit()'s options win over the decorator's
            await a.submit(tasks_fns.flaky, 1, retry_on=(ValueError,))
        with pytest.raises(TaskFailed):  # no retry_on: an exception is not retried
            await a.submit(F + "boom", "x", retries=3)


def test_task_decorator_refuses_unknown_options_and_unnameable_functions() -> None:
    with pytest.raises(TypeError, match="unknown option 'retry'"):
        aionet.task(retry=3)
    with pytest.raises(TypeError, match="retry_on"):
        aionet.task(retry_on=(42,))
    with pytest.raises(aionet.TaskError, match="module level"):

        @aionet.task(retries=1)
        def local() -> None: ...


async def test_after_orders_tasks_without_passing_values() -> None:
    async with cluster(cfg(run_local=False), cfg(resources={"cpu": 4})) as (a, _b):
        first = a.submit(F + "stamp", 0.3)
        second = a.submit(F + "stamp", 0.0, after=[first])  # no argument links them
        (_s1, e1), (s2, _e2) = await asyncio.gather(first, second)
        assert s2 >= e1
        failed = a.submit(F + "boom", "x", retries=0)
        with pytest.raises(aionet.TaskError, match="dependency"):
            await a.submit(F + "stamp", 0.0, after=failed)


async def test_set_priority_reorders_tasks_still_waiting_at_their_owner() -> None:
    async with cluster(cfg(run_local=False), cfg(resources={"cpu": 1}, steal=False)) as (a, _b):
        gate = a.submit(F + "stamp", 0.3)
        low = a.submit(F + "stamp", 0.0, after=[gate], priority=0)
        high = a.submit(F + "stamp", 0.0, after=[gate], priority=0)
        assert high.set_priority(10)  # still waiting for `gate`: takes effect
        await gate
        (s_low, _), (s_high, _) = await asyncio.gather(low, high)
        assert s_high <= s_low
        assert not gate.set_priority(5)  # done: nothing to reorder


async def test_wait_members_names_who_is_missing() -> None:
    async with cluster(cfg()) as (a,):
        assert await a.wait_members(1, timeout=1) == ["n0"]
        with pytest.raises(aionet.PeerUnavailable, match="ghost"):
            await a.wait_members(["n0", "ghost"], timeout=0.2)


async def test_wait_workers_returns_once_enough_nodes_take_tasks() -> None:
    async with cluster(cfg(run_local=False), cfg()) as (a, _b):
        assert await a.wait_workers(1, timeout=5) == ["n1"]
        c = aionet.Node(name="n2", listen="tcp://127.0.0.1:0", join=[a.address], config=cfg())
        waiting = asyncio.ensure_future(a.wait_workers(2, timeout=10))
        await c.start()
        try:
            assert await waiting == ["n1", "n2"]
            with pytest.raises(TimeoutError, match="2 of 3 workers"):
                await a.wait_workers(3, timeout=0.2)
        finally:
            await c.stop(grace=0.5)


async def test_round_robin_keeps_its_rotation_even_with_stealing_on() -> None:
    """Round-robin places in strict rotation; an idle node does not steal those tasks back."""
    slow = {"n1": 8.0}
    async with cluster(cfg(run_local=False), cfg(resources={"cpu": 1}), cfg(resources={"cpu": 1})) as (a, *_):
        refs = [a.submit(F + "work", i, 0.02, slow, policy="round-robin") for i in range(8)]
        where = await asyncio.wait_for(asyncio.gather(*refs), 30)
        assert where.count("n1") == where.count("n2") == 4  # n2 idles rather than steal n1's share


async def test_prefer_places_on_the_node_with_the_most_of_a_resource_free() -> None:
    small = cfg(resources={"cpu": 2, "gpu_memory": 8e9})
    big = cfg(resources={"cpu": 2, "gpu_memory": 16e9})
    async with cluster(cfg(run_local=False), small, big) as (a, _n1, _n2):
        for _ in range(3):
            assert (await a.submit(F + "context_info", prefer="gpu_memory"))["node_name"] == "n2"
        hog = a.submit(F + "stamp", 1.0, resources={"gpu_memory": 12e9})  # only n2 has 12 GB
        await wait_for(lambda: hog._rec.state_name == "placed")
        # n2 now has 4 GB unreserved, n1 8 GB: the preference follows what is free, not the total
        assert (await a.submit(F + "context_info", prefer="gpu_memory"))["node_name"] == "n1"
        await hog
        # a preference nobody can honour is no constraint
        assert (await a.submit(F + "context_info", prefer="fpga"))["node_name"] in ("n1", "n2")


async def test_cache_ref_arguments_run_the_task_where_the_key_is_held() -> None:
    """Issue 14: the locality policy places a task taking aionet.cache_ref(key) on a replica."""
    one = {"cache": {"replicas": 1}}
    c = [Config.from_dict({**one, "scheduler": {"resources": {"cpu": 2}, "allow_modules": ["tests.tasks_fns"]}},
                          env={}) for _ in range(3)]  # fmt: skip
    async with cluster(*c) as (a, *_):
        keys = [f"shard-{i}" for i in range(8)]
        for k in keys:
            await a.cache.put(k, k.upper())
        refs = [a.submit(F + "cached_where", aionet.cache_ref(k), policy="locality") for k in keys]
        for k, (where, value) in zip(keys, await asyncio.gather(*refs), strict=True):
            assert value == k.upper()
            assert where == a.cache.owners(k)[0]  # the one node holding it
        assert len({a.cache.owners(k)[0] for k in keys}) > 1  # the keys really are spread out
