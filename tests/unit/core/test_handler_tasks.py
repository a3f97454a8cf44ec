"""The tasks that run async request handlers: named for what they are (a user reading
``asyncio.all_tasks()`` or a task dump sees "aionet-handler", not "Task-8812"), and created
through the loop's task factory when the application set one (tracing and instrumentation
libraries rely on seeing every task)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from aionet.codecs.envelope import REP
from aionet.config import Config
from aionet.core.router import HANDLER_TASK, Router
from aionet.core.tasks import new_task


def make() -> tuple[Router, list[tuple[int, list[Any]]]]:
    router = Router("a", Config.from_dict({}, env={}).link, logging.getLogger("test"))
    return router, []


@pytest.mark.timeout(10)
async def test_an_async_handler_runs_on_a_task_named_aionet_handler() -> None:
    router, sent = make()
    names: list[str] = []

    async def handler(x: int) -> int:
        task = asyncio.current_task()
        assert task is not None
        names.append(task.get_name())
        return x + 1

    router.add_service("h", handler)
    router.on_request(1, "h", 5, lambda kind, fields: sent.append((kind, fields)), "b")
    for _ in range(5):
        await asyncio.sleep(0)
    assert names == [HANDLER_TASK] == ["aionet-handler"]
    assert sent == [(REP, [1, 6])]
    assert router.tasks == set() and router.running == {}


@pytest.mark.timeout(10)
async def test_the_loops_task_factory_still_creates_handler_tasks() -> None:
    loop = asyncio.get_running_loop()
    made: list[asyncio.Task[Any]] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        made.append(task)
        return task

    router, sent = make()

    async def handler(x: int) -> int:
        return x * 2

    router.add_service("h", handler)
    loop.set_task_factory(factory)
    try:
        router.on_request(7, "h", 4, lambda kind, fields: sent.append((kind, fields)), "b")
        for _ in range(5):
            await asyncio.sleep(0)
    finally:
        loop.set_task_factory(None)
    assert sent == [(REP, [7, 8])]
    assert len(made) == 1 and made[0].get_name() == HANDLER_TASK  # through the factory, named


@pytest.mark.timeout(10)
async def test_new_task_names_the_task_and_runs_it() -> None:
    async def work() -> str:
        return "done"

    task = new_task(asyncio.get_running_loop(), work(), "mine")
    assert task.get_name() == "mine"
    assert await task == "done"
