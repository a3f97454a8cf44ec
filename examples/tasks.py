#!/usr/bin/env python
"""Tasks on a small local cluster: two worker processes plus this script as the client.

    python examples/tasks.py

It starts two ``aionet serve`` worker processes (with this directory on PYTHONPATH so they can
import the task functions below as ``tasks:...``), joins them with a submit-only client node,
and shows: submit/await, dependencies passed as TaskRefs (the data goes worker to worker),
map, errors, resources, priorities, a checkpointing task, and a refused function (the workers
allow only the module ``tasks``: ``scheduler.allow_modules``). The workers are stopped (by
their PIDs) at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import aionet
from aionet.config import Config
from aionet.log import configure

HERE = Path(__file__).resolve().parent


# ---------------------------------------------------------------- task functions ("tasks:<name>")
def square(x: int) -> int:
    return x * x


def total(xs: list[int]) -> int:
    return sum(xs)


def where() -> str:
    return aionet.task_context().node_name


def fails(x: int) -> None:
    raise ValueError(f"cannot handle {x}")


async def count_to(n: int) -> int:
    """Long-running work that survives a re-run: progress is checkpointed to the owner."""
    ctx = aionet.task_context()
    i = ctx.restore() or 0
    while i < n:
        await asyncio.sleep(0.01)
        i += 1
        ctx.checkpoint(i)
    return i


# ---------------------------------------------------------------- cluster plumbing
async def start_worker(name: str, join: str | None) -> tuple[asyncio.subprocess.Process, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    env["AIONET_SCHEDULER_RESOURCES"] = json.dumps({"cpu": 2})
    env["AIONET_SCHEDULER_ALLOW_MODULES"] = "tasks"  # a node runs only task modules it allows
    args = [sys.executable, "-m", "aionet", "serve", "--name", name, "--listen", "tcp://127.0.0.1:0"]
    args += ["--log-level", "warning"] + (["--join", join] if join else [])
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE, env=env)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    if not line.startswith(b"ready "):
        raise RuntimeError(f"worker {name} did not start")
    return proc, json.loads(line[6:])["addresses"][0]


async def main() -> None:
    w1, seed = await start_worker("w1", None)
    w2, _ = await start_worker("w2", seed)
    cfg = Config.from_dict({"scheduler": {"run_local": False}})  # this node only submits
    try:
        async with aionet.Node(name="client", listen="tcp://127.0.0.1:0", join=[seed], config=cfg) as node:
            await node.wait_workers(2, timeout=30)  # both workers joined and their resources known

            # 1. submit by import path, await the result
            print("square(7) =", await node.submit("tasks:square", 7))

            # 2. TaskRefs as arguments are dependencies, resolved where the task runs
            parts = [node.submit("tasks:square", i) for i in range(10)]
            print("sum of squares 0..9 =", await node.submit("tasks:total", parts))

            # 3. map over many items; results in order; work spread over both workers
            t = time.perf_counter()
            out = await node.map("tasks:square", range(10_000))
            print(f"map over 10,000 items: {time.perf_counter() - t:.2f} s, last = {out[-1]}")
            print("ran on:", sorted(set(await node.gather([node.submit("tasks:where") for _ in range(20)]))))

            # 4. a task that raises: a TaskFailed with the remote type, message and traceback
            try:
                await node.submit("tasks:fails", 3)
            except aionet.TaskError as exc:
                print("error:", exc)

            # 5. resources: a request no node can meet fails at once with the reason
            try:
                await node.submit("tasks:square", 2, resources={"gpu": 1})
            except aionet.TaskError as exc:
                print("unschedulable:", exc)

            # 6. priorities: higher first among queued tasks; checkpointing task completes
            slow = node.submit("tasks:count_to", 50, priority=0, retries=2)
            urgent = node.submit("tasks:square", 12, priority=10)
            print("urgent =", await urgent, "| count_to =", await slow)
            print("owner stats:", node.scheduler.stats().owner)

            # 7. a node runs only modules it allows (scheduler.allow_modules), never the stdlib
            try:
                node.submit("os:system", "echo hi")
            except aionet.TaskError as exc:
                print("refused:", str(exc)[:80], "...")
    finally:
        for p in (w2, w1):
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in (w2, w1):
            await p.wait()


if __name__ == "__main__":
    configure("warning")
    aionet.run(main())
