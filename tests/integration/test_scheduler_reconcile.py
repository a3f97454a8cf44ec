"""Issue 13, the scheduler part: after a wrong death verdict (a driver taken for dead, then
alive again under a new incarnation) every pending and later ``submit`` completes or fails with
a typed error, never hangs. Owner and worker reconcile what each thinks is in flight; lost
attempts are resubmitted under the retry rules and results are delivered once."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from aionet import Node
from aionet.config import Config
from aionet.membership import MemberEvent
from tests.conftest import wait_for

F = "tests.tasks_fns:"


def cfg(heartbeat: dict[str, Any] | None = None, **sched: Any) -> Config:
    sched.setdefault("resources", {"cpu": 2, "gpu": 0})
    sched.setdefault("allow_modules", ["tests.tasks_fns"])
    return Config.from_dict({"scheduler": sched, "heartbeat": heartbeat or {}})


def verdict(name: str, kind: str, incarnation: int) -> MemberEvent:
    return MemberEvent(name, kind, kind, None, incarnation, "", "injected by the test")


async def test_false_death_verdict_then_alive_loses_no_task():
    """The worker's membership says the driver died, then that it is alive again (fed to the
    scheduler's subscription, deterministic): the task that was running there, and one
    submitted while the worker took the driver for dead, both complete, exactly once."""
    d = Node(name="d", listen="tcp://127.0.0.1:0", config=cfg(run_local=False))
    await d.start()
    w = Node(name="w", listen="tcp://127.0.0.1:0", join=[d.address], config=cfg())
    await w.start()
    try:
        await wait_for(lambda: "w" in d.scheduler.owner.views, timeout=10)
        running = d.submit(F + "async_sleep", 0.3)
        await wait_for(lambda: w.scheduler.worker.n_running == 1, timeout=5)
        w.scheduler._on_member_change(verdict("d", "dead", 1))  # the worker drops d's task
        assert "d" in w.scheduler.down and all(j.cancelled for j in w.scheduler.worker.jobs.values())
        ran = w.scheduler.worker.stats().ran
        later = d.submit(F + "add", 40, 2)  # runs on w, whose result to "dead" d is dropped
        await wait_for(lambda: w.scheduler.worker.stats().ran > ran, timeout=5)
        w.scheduler._on_member_change(verdict("d", "alive", 2))  # refuted: alive again
        assert await asyncio.wait_for(later, 5) == 42
        assert await asyncio.wait_for(running, 5) == "w"
        owner = d.scheduler.owner
        assert owner.stats().reconciled_lost == 2 and owner.stats().completed == 2
        assert await asyncio.wait_for(d.submit(F + "add", 1, 2), 5) == 3  # and later ones too
        assert d.scheduler.stats().owner.nodes["w"].inflight == 0
    finally:
        await w.stop(grace=0.5)
        await d.stop(grace=0.5)


async def test_driver_loop_blocked_past_the_detector_then_submits_complete():
    """The reported case end to end: the driver runs on its own loop (a thread) and blocks it
    with time.sleep for longer than the workers' detector window (short heartbeats), with a
    task running on the worker and one submitted just before the block. Whether or not the
    worker declares the driver dead meanwhile, every submit completes within seconds."""
    hb = {"interval": 0.05, "probe_timeout": 0.2, "suspect_timeout": 0.4, "acceptable_pause": 0.05}
    w = Node(name="w", listen="tcp://127.0.0.1:0", config=cfg(hb))
    await w.start()
    kinds: list[str] = []
    w.on_member_change(lambda ev: kinds.append(ev.kind) if ev.name == "d" else None)
    out: dict[str, Any] = {}

    async def driver() -> None:
        d = Node(name="d", listen="tcp://127.0.0.1:0", join=[w.address], config=cfg(hb, run_local=False))
        await d.start()
        try:
            deadline = time.monotonic() + 10
            while "w" not in d.scheduler.owner.views and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            running = d.submit(F + "async_sleep", 0.3)
            await asyncio.sleep(0.1)
            asyncio.get_running_loop().call_soon(time.sleep, 1.5)  # the driver's loop is blocked
            during = d.submit(F + "add", 10, 1)
            await asyncio.sleep(0.2)
            later = [d.submit(F + "add", i, 2) for i in range(3)]
            out["results"] = await asyncio.wait_for(asyncio.gather(running, during, *later), 8)
        finally:
            await d.stop(grace=0.5)

    th = threading.Thread(target=lambda: asyncio.run(driver()), name="test-driver")
    th.start()
    try:
        await wait_for(lambda: not th.is_alive(), timeout=25, interval=0.02)
    finally:
        th.join(5)
        await w.stop(grace=0.5)
    assert out.get("results") == ["w", 11, 2, 3, 4], (out, kinds)
