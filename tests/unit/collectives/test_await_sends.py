"""How a collective call waits for the sends it posted (:func:`await_sends`): a send already
acknowledged is read directly and only running ones are gathered, yet every failure still
reaches the caller, and a call whose send fails leaves no task behind unretrieved."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import numpy as np
import pytest

from aionet.collectives.group_algorithms import await_sends
from aionet.errors import CollectiveError, PeerUnavailable

from .test_group_sends import FakeNet, allreduce_all, make_groups


async def _ok() -> None:
    return None


async def _fail(exc: BaseException) -> None:
    raise exc


async def _done(*coros: Any) -> list[asyncio.Task[None]]:
    tasks = [asyncio.ensure_future(c) for c in coros]
    await asyncio.wait(tasks)
    return tasks


async def test_finished_sends_are_read_without_gather(monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = await _done(_ok(), _ok(), _ok())
    gathered: list[int] = []
    real = asyncio.gather

    def spy(*aws: Any, **kw: Any) -> Any:
        gathered.append(len(aws))
        return real(*aws, **kw)

    monkeypatch.setattr(asyncio, "gather", spy)
    assert await await_sends(tasks) == 3
    assert gathered == []
    running = asyncio.ensure_future(asyncio.sleep(0))
    assert await await_sends([*tasks, running]) == 4
    assert gathered == [1] and running.done()  # only the running one went to gather


async def test_a_finished_send_that_failed_raises() -> None:
    tasks = await _done(_ok(), _fail(PeerUnavailable("gone")))
    with pytest.raises(PeerUnavailable, match="gone"):
        await await_sends(tasks)


async def test_a_running_send_that_fails_raises() -> None:
    gate = asyncio.Event()

    async def later() -> None:
        await gate.wait()
        raise PeerUnavailable("late")

    tasks = [*(await _done(_ok())), asyncio.ensure_future(later())]
    waiter = asyncio.ensure_future(await_sends(tasks))
    await asyncio.sleep(0)
    assert not waiter.done()  # it waits for the running send
    gate.set()
    with pytest.raises(PeerUnavailable, match="late"):
        await waiter


async def test_a_cancelled_send_raises_cancelled() -> None:
    t = asyncio.ensure_future(asyncio.sleep(10))
    await asyncio.sleep(0)
    t.cancel()
    await asyncio.wait([t])
    with pytest.raises(asyncio.CancelledError):
        await await_sends([t])


async def test_a_call_whose_send_fails_raises_and_leaves_nothing_unretrieved() -> None:
    """The ring's large segments go through the awaited send; one failing must fail the call
    with CollectiveError on that rank, and every send task of the call must be reaped (the
    loop's exception handler sees no "Task exception was never retrieved")."""
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: unhandled.append(ctx))
    net = FakeNet()
    groups = make_groups(net, 2)
    real = groups[0]._msg.send
    count = 4 * 4096

    async def failing(peer: str, channel: str, obj: Any) -> None:
        if obj[0] == 1:  # the second call: its first segment fails
            raise PeerUnavailable("link down")
        await real(peer, channel, obj)

    groups[0]._msg.send = failing  # type: ignore[method-assign]
    xs = [np.ones(count) for _ in groups]
    first = await asyncio.gather(*(g.allreduce(x, algorithm="ring") for g, x in zip(groups, xs, strict=True)))
    assert all(np.array_equal(o, np.full(count, 2.0)) for o in first)
    assert groups[0]._sends == {} and groups[1]._sends == {}
    with pytest.raises(CollectiveError):
        await allreduce_all(groups, xs, algorithm="ring")
    assert groups[0]._sends == {}
    gc.collect()
    await asyncio.sleep(0)
    assert unhandled == []
