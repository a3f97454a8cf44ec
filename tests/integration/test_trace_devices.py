"""A real node's scheduler puts GPU tasks on their GPU's trace row: two tasks asking one GPU each
on a node offering two run on "gpu 0" and "gpu 1", a plain task on the CPU rows, and the
profile gives seconds per device. GPUs are declared in [scheduler] resources (no GPU needed)."""

from __future__ import annotations

import asyncio

import pytest

from aionet import Node
from aionet.config import Config
from aionet.observe.trace import TraceRecorder, chrome_trace, device_profile, validate

pytestmark = pytest.mark.timeout(30)


async def test_gpu_tasks_land_on_their_gpu_rows_and_in_the_device_profile() -> None:
    cfg = Config.from_dict({"scheduler": {"allow_modules": ["tests"], "resources": {"cpu": 4, "gpu": 2}}}, env={})
    rec = TraceRecorder("a")
    async with Node(name="a", listen="tcp://127.0.0.1:0", config=cfg, instruments=[rec]) as a:
        refs = [a.submit("tests.tasks_fns:async_sleep", 0.2, resources={"gpu": 1}) for _ in range(2)]
        refs.append(a.submit("tests.tasks_fns:async_sleep", 0.05))
        await asyncio.gather(*refs)
    trace = chrome_trace([{"node": "a", "events": list(rec.events)}])
    assert validate(trace) == []
    rows = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {"gpu 0: tasks running 0", "gpu 1: tasks running 0", "cpu: tasks running 0"} <= rows
    devices = device_profile(trace)["a"]
    assert set(devices) == {"cpu", "gpu 0", "gpu 1"}
    assert devices["gpu 0"]["tasks"] == 1 and devices["gpu 1"]["tasks"] == 1  # one GPU each, at once
    assert devices["gpu 0"]["running_s"] >= 0.19 and devices["cpu"]["running_s"] >= 0.04
