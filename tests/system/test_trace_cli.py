"""`aionet trace` against a running cluster: every member's requests, tasks and collectives in one
Perfetto-ready file, and the summary per node."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import numpy as np

import aionet
from aionet.config import Config
from aionet.observe.trace import validate
from tests.conftest import wait_for


async def test_trace_records_every_member_while_work_runs(spawn, tmp_path) -> None:
    env = {"AIONET_SCHEDULER_ALLOW_MODULES": "tests.tasks_fns", "PYTHONPATH": os.getcwd()}
    _p1, r1 = spawn("--name", "w1", "--listen", "tcp://127.0.0.1:0", env=env)
    cfg = Config.from_dict({"scheduler": {"run_local": False}}, env={})
    async with aionet.Node(name="driver", listen="tcp://127.0.0.1:0", join=[r1["addresses"][0]], config=cfg) as me:
        await me.wait_workers(1, timeout=10)
        out = tmp_path / "trace.json"
        cli = subprocess.Popen(
            [sys.executable, "-m", "aionet", "trace", "--connect", r1["addresses"][0], "--seconds", "2",
             "--out", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            await wait_for(lambda: me.tracer is not None, timeout=20)  # recording here too now
            for i in range(5):
                await me.request("w1", "aionet.echo", i)
                await me.submit("tests.tasks_fns:sleep_ms", i, 20)
            # `aionet serve` without an app joins no group: a one-member collective on this node
            solo = me.group(["driver"], name="solo")
            await solo.allreduce(np.ones(1024, np.float32))
            stdout, stderr = await asyncio.to_thread(cli.communicate, timeout=60)
        finally:
            if cli.poll() is None:
                cli.kill()
    assert cli.returncode == 0, stderr
    assert "events from 2 nodes" in stdout and "communication share" in stdout
    data = json.loads(out.read_text())
    assert validate(data) == []
    procs = {e["pid"]: e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name"}
    assert sorted(procs.values()) == ["driver", "w1"]
    cats = {(procs[e["pid"]], e.get("cat")) for e in data["traceEvents"] if e["ph"] == "X"}
    assert {("driver", "request"), ("w1", "request"), ("w1", "task"), ("driver", "collective")} <= cats
    rows = {(procs[e["pid"]], e["args"]["name"]) for e in data["traceEvents"] if e["name"] == "thread_name"}
    assert ("w1", "cpu: tasks running 0") in rows  # the tasks asked no GPU: they ran on w1's CPU track
    assert "task time per node and device" in stdout
    assert any(line.split()[:2] == ["│", "w1"] and "cpu" in line for line in stdout.splitlines()), stdout
    again = subprocess.run([sys.executable, "-m", "aionet", "trace", "--read", str(out)], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert again.returncode == 0 and "w1" in again.stdout
