"""Tasks on real ``aionet serve`` worker processes; the test process is a submit-only client."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter

import numpy as np
import pytest

from aionet import Node, TaskError
from aionet.config import Config
from tests.conftest import wait_for

F = "tests.tasks_fns:"
WORKER_ENV = {
    "AIONET_SCHEDULER_RESOURCES": json.dumps({"cpu": 4, "gpu": 0}),
    "AIONET_SCHEDULER_ALLOW_MODULES": "tests.tasks_fns",  # what these workers may run
}


def start_workers(spawn, n: int, extra: tuple[str, ...] = (), env: dict | None = None) -> list[tuple[object, dict]]:
    out = []
    seed: list[str] = []
    for i in range(n):
        args = ["--name", f"w{i}", "--listen", "tcp://127.0.0.1:0", *extra]
        for s in seed:
            args += ["--join", s]
        proc, info = spawn(*args, env=WORKER_ENV if env is None else env)
        seed = seed or [info["addresses"][0]]
        out.append((proc, info))
    return out


async def client(seed: str, n_workers: int) -> Node:
    cfg = Config.from_dict({"scheduler": {"run_local": False, "resources": {"cpu": 1, "gpu": 0}}})
    node = Node(name="client", listen="tcp://127.0.0.1:0", join=[seed], config=cfg)
    await node.start()
    await wait_for(lambda: len(node.scheduler.owner.views) == n_workers, timeout=20)
    return node


async def test_tasks_run_in_worker_processes(spawn):
    workers = start_workers(spawn, 2)
    node = await client(workers[0][1]["addresses"][0], 2)
    try:
        out = await node.map(F + "whoami", range(200))
        assert [o[0] for o in out] == list(range(200))
        pids = {o[2] for o in out}
        assert pids == {p.pid for p, _ in workers} and os.getpid() not in pids
        # a chain whose links run wherever; results flow worker to worker
        ref = node.submit(F + "inc", 0)
        for _ in range(299):
            ref = node.submit(F + "inc", ref)
        assert await ref == 300
        # a large result stays on its worker; a dependent elsewhere fetches it from there
        big = node.submit(F + "big", 300_000, affinity="w0")
        s = node.submit(F + "arr_sum", big, affinity="w1")
        assert await s == float(np.arange(300_000).sum())
        assert big._rec.holder == "w0" and not big._rec.has_value
        arr = await big
        assert arr.shape == (300_000,) and arr[7] == 7.0
        with pytest.raises(TaskError, match="refused on node 'w.'.*allow_modules"):
            await node.submit("tests.no_such_module:f")
    finally:
        await node.stop()


async def test_killing_one_of_three_workers_loses_no_result(spawn):
    """2,000 tasks of 10 ms on 3 worker processes; one is SIGKILLed a third of the way in.
    Every result comes back, each exactly once; the dead worker's tasks ran again elsewhere."""
    workers = start_workers(spawn, 3)
    victim = workers[1][0]
    node = await client(workers[0][1]["addresses"][0], 3)
    try:
        n = 2000
        refs = [node.submit(F + "sleep_ms", i, 10.0, retries=3) for i in range(n)]
        deliveries: Counter[int] = Counter()
        for r in refs:
            r._rec.fut.add_done_callback(lambda f, r=r: deliveries.update([r._rec.tid]))
        results = []
        for i, r in enumerate(refs):
            results.append(await asyncio.wait_for(r, 60))
            if i == n // 3:
                os.kill(victim.pid, signal.SIGKILL)
        assert sorted(v[0] for v in results) == list(range(n))
        assert [v[0] for v in results] == list(range(n))
        # barrier: a task on each survivor; its result follows any earlier one on the same link
        await node.gather([node.submit(F + "where", affinity=w) for w in ("w0", "w2")])
        assert len(deliveries) == n and set(deliveries.values()) == {1}
        st = node.scheduler.stats().owner
        assert st.completed == n + 2 and st.failed == 0  # + the two barrier tasks
        assert st.resubmitted > 0  # the victim's running and queued tasks were re-run
        ran_on = Counter(v[1] for v in results)
        assert set(ran_on) == {"w0", "w1", "w2"} and ran_on["w1"] < ran_on["w0"]
        assert "w1" in node.scheduler.down
    finally:
        await node.stop()


async def test_serve_app_allows_the_apps_package_and_nothing_else(spawn):
    """``aionet serve --app tests.apps:setup`` with no allow_modules configured runs tasks from
    ``tests`` (the app's package); other modules and the stdlib stay refused."""
    env = {"AIONET_SCHEDULER_RESOURCES": WORKER_ENV["AIONET_SCHEDULER_RESOURCES"]}  # no allow_modules
    workers = start_workers(spawn, 1, extra=("--app", "tests.apps:setup"), env=env)
    node = await client(workers[0][1]["addresses"][0], 1)
    try:
        assert await node.submit(F + "inc", 1) == 2
        with pytest.raises(TaskError, match="not in its scheduler.allow_modules \\['tests'\\]"):
            await node.submit("numpy:ones", 3)
        with pytest.raises(TaskError, match="standard library"):
            await node.submit("os:getpid")
    finally:
        await node.stop()
