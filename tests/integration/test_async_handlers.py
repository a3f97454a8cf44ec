"""What an ``async def`` service handler may rely on, whichever way the router starts it (a
task per request today; an eager first step on the reader was tried for issue 18 and measured
slower, BENCHMARKS.md): it runs as a task (current_task, asyncio.timeout), in a context of its
own, answers whether or not it suspends, raises from either part, counts against
``link.max_concurrent_requests`` only while running, and is cancelled at shutdown with its
``finally`` run and its caller told."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from aionet import Node, RemoteError
from aionet.config import Config
from aionet.errors import PeerUnavailable
from tests.conftest import wait_for

CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("CALLER", default="unset")


@pytest.mark.timeout(60)
async def test_async_handlers_answer_whether_or_not_they_suspend_and_raise_from_either_part():
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0") as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b,
    ):
        seen: list[Any] = []

        async def at_once(x: Any) -> Any:
            seen.append(asyncio.current_task() is not None)
            return x

        async def awaits(x: int) -> int:
            async with asyncio.timeout(5):  # needs a current task in the first step
                await asyncio.sleep(0.001)  # the scenario, not synchronisation: a handler that waits on a timer
            return x * 2

        async def raises_first(_x: Any) -> Any:
            raise ValueError("before any await")

        async def raises_later(_x: Any) -> Any:
            await asyncio.sleep(0)  # the scenario: suspend once, then raise from the second step
            raise KeyError("after an await")

        a.add_service("at_once", at_once)
        a.add_service("awaits", awaits)
        a.add_service("raises_first", raises_first)
        a.add_service("raises_later", raises_later)
        assert await b.request("a", "at_once", b"x" * 64, timeout=10) == b"x" * 64
        assert seen == [True]
        assert await b.request("a", "awaits", 21, timeout=10) == 42
        with pytest.raises(RemoteError) as e1:
            await b.request("a", "raises_first", None, timeout=10)
        assert e1.value.remote_type == "ValueError"
        with pytest.raises(RemoteError) as e2:
            await b.request("a", "raises_later", None, timeout=10)
        assert e2.value.remote_type == "KeyError"
        # nothing of those handlers is still running or counted
        await wait_for(lambda: not a.router.tasks and not a.router.running, 10)


@pytest.mark.timeout(60)
async def test_pipelined_requests_to_mixed_handlers_get_their_own_replies_and_isolated_contexts():
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0") as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b,
    ):

        async def tag(x: int) -> tuple[int, str]:
            CALLER.set(f"req{x}")  # each request's handler has a context of its own
            if x % 3 == 0:  # the scenario, not synchronisation: some handlers take 0-4 ms and finish
                await asyncio.sleep(0.001 * (x % 5))  # out of order, beside others that never suspend
            return x, CALLER.get()

        a.add_service("tag", tag)
        replies = await asyncio.gather(*(b.request("a", "tag", i, timeout=10) for i in range(200)))
        assert [tuple(r) for r in replies] == [(i, f"req{i}") for i in range(200)]
        assert CALLER.get() == "unset"


@pytest.mark.timeout(60)
async def test_running_handlers_are_bounded_by_max_concurrent_requests():
    cfg = Config.from_dict({"link": {"max_concurrent_requests": 2}}, env={})
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0", config=cfg) as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b,
    ):
        release = asyncio.Event()
        waiting = [0, 0]  # now, most

        async def handler(x: Any) -> Any:
            if x == "wait":
                waiting[0] += 1
                waiting[1] = max(waiting[1], waiting[0])
                try:
                    await release.wait()
                finally:
                    waiting[0] -= 1
            return x

        a.add_service("h", handler)
        # many handlers that finish at once leave no slot taken
        assert await asyncio.gather(*(b.request("a", "h", i, timeout=10) for i in range(50))) == list(range(50))
        slow = [asyncio.ensure_future(b.request("a", "h", "wait", timeout=10)) for _ in range(4)]
        await wait_for(lambda: waiting[0] == 2, 10)
        assert a.router.running == {"b": 2}
        release.set()
        assert await asyncio.gather(*slow) == ["wait"] * 4
        assert waiting[1] == 2


@pytest.mark.timeout(60)
async def test_a_suspended_handler_is_cancelled_at_shutdown_and_its_caller_told():
    a = Node(name="a", listen="tcp://127.0.0.1:0")
    await a.start()
    try:
        async with Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b:
            started = asyncio.Event()
            cleaned = asyncio.Event()

            async def forever(_x: Any) -> Any:
                started.set()
                try:
                    await asyncio.Event().wait()
                finally:
                    cleaned.set()

            a.add_service("forever", forever)
            call = asyncio.ensure_future(b.request("a", "forever", None, timeout=30))
            await asyncio.wait_for(started.wait(), 10)
            await a.stop(grace=0.2)
            assert cleaned.is_set()  # the handler's finally ran
            with pytest.raises((RemoteError, PeerUnavailable)) as e:
                await asyncio.wait_for(call, 10)
            if isinstance(e.value, RemoteError):
                assert e.value.remote_type == "asyncio.CancelledError"
    finally:
        await a.stop()
