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


@pytest.mark.timeout(10)
async def test_a_handler_that_answered_but_waits_to_write_is_no_longer_cancellable() -> None:
    """Once the answer has its place, a CANCEL has nothing to cancel (the reply goes out). This
    holds whether the task started eagerly (Python 3.12+) or one loop step later."""
    router, sent = make()
    room: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def reply(kind: int, fields: list[Any]) -> asyncio.Future[None]:
        sent.append((kind, fields))
        return room  # the transport has no room yet

    async def handler(x: int) -> int:
        return x

    router.add_service("h", handler)
    router.on_request(1, "h", 9, reply, "b")
    for _ in range(3):
        await asyncio.sleep(0)
    assert sent == [(REP, [1, 9])]
    assert router.handling == {} and len(router.tasks) == 1 and router.running == {"b": 1}
    router.on_cancel(1, "b")  # finds nothing: the task still waits for room, then ends
    room.set_result(None)
    for _ in range(3):
        await asyncio.sleep(0)
    assert router.tasks == set() and router.running == {} and router.handling == {}


@pytest.mark.timeout(20)
async def test_a_long_queue_of_waiting_requests_starts_in_order_without_recursing() -> None:
    """600 held handlers (the bound) and 600 requests waiting behind them that answer at once.
    When the first held one ends, the waiting ones start one after another as slots free; an
    eager start (Python 3.12+) ends inside the call that starts it, and that must not make each
    start nest inside the previous one's end (600 levels would pass the recursion limit)."""
    bound = 600
    cfg = Config.from_dict({"link": {"max_concurrent_requests": bound}}, env={})
    router = Router("a", cfg.link, logging.getLogger("t"))
    gate = asyncio.Event()
    order: list[int] = []

    async def handler(x: int) -> int:
        if x < bound:
            await gate.wait()
        order.append(x)
        return x

    sent: list[tuple[int, list[Any]]] = []
    router.add_service("h", handler)
    for i in range(2 * bound):
        assert router.on_request(i, "h", i, lambda k, f: sent.append((k, f)), "b") is None
    assert router.running == {"b": bound} and len(router.waiting["b"]) == bound
    gate.set()
    for _ in range(10):
        await asyncio.sleep(0)
    waited = [x for x in order if x >= bound]
    assert waited == list(range(bound, 2 * bound))  # all answered, in arrival order
    assert sorted(f[0] for k, f in sent if k == REP) == list(range(2 * bound))
    assert router.running == {} and router.tasks == set() and router.waiting == {}
