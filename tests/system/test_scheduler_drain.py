"""Graceful drain (SIGTERM, a walltime warning, node.drain()): a node reclaimed by a batch system
takes no new tasks, finishes what it accepted, and leaves; nothing is lost or run twice."""

from __future__ import annotations

import asyncio

from tests.conftest import wait_for
from tests.system.test_scheduler import F, cfg, cluster


async def test_drain_finishes_accepted_tasks_and_new_ones_go_elsewhere() -> None:
    async with cluster(cfg(run_local=False), cfg(), cfg()) as (a, b, _c):
        first = [a.submit(F + "async_sleep", 0.4, retries=0) for _ in range(8)]
        await wait_for(lambda: b.scheduler.worker.n_running > 0 or len(b.scheduler.worker.jobs) > 0)
        accepted = len(b.scheduler.worker.jobs)
        drain = asyncio.ensure_future(b.drain(timeout=20))
        await wait_for(lambda: "n1" not in a.scheduler.owner.views)  # a was told: place nothing more on n1
        later = [a.submit(F + "async_sleep", 0.01, retries=0) for _ in range(6)]
        assert await asyncio.wait_for(drain, 30) == 0  # nothing handed back: all finished in time
        done = await asyncio.wait_for(asyncio.gather(*first), 30)
        assert done.count("n1") == accepted > 0  # what n1 accepted, n1 finished
        assert all(ref.attempts == 1 for ref in first)  # none was run twice
        assert set(await asyncio.wait_for(asyncio.gather(*later), 30)) == {"n2"}
        await wait_for(lambda: a.members().get("n1", {}).get("state") == "left")


async def test_drain_timeout_hands_back_unfinished_tasks_without_using_a_retry() -> None:
    async with cluster(cfg(run_local=False), cfg()) as (a, b):
        ref = a.submit(F + "steps", 30, 0.05, retries=0)  # 1.5 s, checkpointing each step
        await wait_for(lambda: (ref._rec.ckpt or {}).get("i", 0) >= 2)
        from aionet import Node

        c = Node(name="n2", listen="tcp://127.0.0.1:0", join=[a.address], config=cfg())
        await c.start()
        try:
            await wait_for(lambda: "n2" in a.scheduler.owner.views)
            assert await b.drain(timeout=0.1) == 1  # still running after the drain timeout
            res = await asyncio.wait_for(ref, 20)
            assert res["i"] == 30 and res["node"] == "n2" and res["resumed_from"] >= 2
            assert ref.attempts == 2  # re-run once, although retries=0: a graceful leave is no failure
        finally:
            await c.stop(grace=0.5)


async def test_serve_drains_on_a_walltime_warning_signal(spawn) -> None:
    """`aionet serve` on SIGUSR1 (SLURM's --signal) or SIGTERM: the running task completes there,
    the node leaves and exits 0."""
    import os
    import signal

    from aionet import Node

    proc, ready = spawn(
        "--name", "w1", "--listen", "tcp://127.0.0.1:0",
        env={"AIONET_SCHEDULER_ALLOW_MODULES": "tests.tasks_fns", "AIONET_SCHEDULER_RESOURCES": '{"cpu": 2}'},
    )  # fmt: skip
    a = Node(name="owner", listen="tcp://127.0.0.1:0", join=[ready["addresses"][0]], config=cfg(run_local=False))
    await a.start()
    try:
        await wait_for(lambda: "w1" in a.scheduler.owner.views)
        ref = a.submit(F + "async_sleep", 1.0, retries=0)
        await wait_for(lambda: ref._rec.state_name == "placed")
        await asyncio.sleep(0.2)  # let it start there: the signal must reach a running task
        os.kill(proc.pid, signal.SIGUSR1)
        assert await asyncio.wait_for(ref, 20) == "w1"
        assert ref.attempts == 1
        assert await asyncio.to_thread(proc.wait, 30) == 0
        await wait_for(lambda: a.members().get("w1", {}).get("state") == "left")
    finally:
        await a.stop(grace=0.5)
