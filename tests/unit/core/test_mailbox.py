"""Mailbox waiters: a receiver or sender that gives up (a ``recv`` timeout, a cancelled task)
leaves nothing behind, and a closed mailbox releases everyone who waits on it."""

from __future__ import annotations

import asyncio

import pytest

from aionet.core.router import Mailbox
from aionet.errors import NodeClosed


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_getters_that_give_up_leave_no_future_behind() -> None:
    """A polling loop of ``recv(ch, timeout=...)`` on an idle channel must not grow the mailbox."""
    mb = Mailbox(10)
    for _ in range(1000):
        t = asyncio.ensure_future(mb.get())
        await _settle()
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
    assert len(mb._getters) == 0
    # and the mailbox still works: a put wakes the next getter
    t = asyncio.ensure_future(mb.get())
    await _settle()
    assert mb.put_nowait(("a", 1))
    assert await asyncio.wait_for(t, 1) == ("a", 1)


async def test_putters_that_give_up_leave_no_future_behind() -> None:
    mb = Mailbox(1)
    assert mb.put_nowait(("a", 0))
    for i in range(1000):
        t = asyncio.ensure_future(mb.put(("a", i)))
        await _settle()
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
    assert len(mb._putters) == 0
    assert mb.qsize() == 1


async def test_a_getter_woken_then_cancelled_passes_the_message_on() -> None:
    mb = Mailbox(10)
    first = asyncio.ensure_future(mb.get())
    second = asyncio.ensure_future(mb.get())
    await _settle()
    assert mb.put_nowait(("a", 1))  # wakes ``first`` ...
    first.cancel()  # ... which is cancelled before it runs
    assert await asyncio.wait_for(second, 1) == ("a", 1)


async def test_close_releases_waiting_getters_and_putters_but_keeps_what_waits() -> None:
    mb = Mailbox(1)
    getter = asyncio.ensure_future(Mailbox(1).get())  # another mailbox: not released
    waiting = Mailbox(1)
    blocked_get = asyncio.ensure_future(waiting.get())
    assert mb.put_nowait(("a", "kept"))
    blocked_put = asyncio.ensure_future(mb.put(("a", "late")))
    await _settle()
    mb.close("node 'x' is stopped")
    waiting.close("node 'x' is stopped")
    with pytest.raises(NodeClosed, match="node 'x' is stopped"):
        await asyncio.wait_for(blocked_get, 1)
    with pytest.raises(NodeClosed, match="node 'x' is stopped"):
        await asyncio.wait_for(blocked_put, 1)
    # a message that arrived before the close is still handed out, then the close is raised
    assert await mb.get() == ("a", "kept")
    with pytest.raises(NodeClosed):
        await mb.get()
    with pytest.raises(NodeClosed):
        await mb.get_batch(10)
    assert not getter.done()
    getter.cancel()
