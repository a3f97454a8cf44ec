"""The base Connection's default ``write_nowait`` (a task running ``send``, what the in-process
transport uses): a caller may drop the awaitable it got (its own task was cancelled first);
a send that then fails must not surface as "Task exception was never retrieved", and one
that is awaited still raises."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Sequence
from typing import Any

import pytest

from aionet.errors import ConnectionClosed
from aionet.transports.base import Connection


class _SendOnly(Connection):
    """The rest of a Connection, for stand-ins that define only ``send``."""

    async def recv(self) -> list[Any]:
        raise ConnectionClosed("closed")

    def abort(self) -> None:
        pass

    async def close(self) -> None:
        pass

    @property
    def closed(self) -> bool:
        return False


class _Closed(_SendOnly):
    """A connection whose sends fail as a closed one's do."""

    async def send(self, frames: Sequence[Any]) -> None:
        await asyncio.sleep(0)
        raise ConnectionClosed("closed under the sender")


@pytest.mark.timeout(10)
async def test_a_dropped_write_nowait_that_fails_reports_nothing_to_the_loop() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))
    try:
        w = _Closed().write_nowait([b"x"])
        assert w is not None
        for _ in range(3):
            await asyncio.sleep(0)
        assert isinstance(w, asyncio.Future) and w.done()
        del w
        gc.collect()
    finally:
        loop.set_exception_handler(old)
    assert reported == []


@pytest.mark.timeout(10)
async def test_an_awaited_write_nowait_still_raises() -> None:
    w = _Closed().write_nowait([b"x"])
    assert w is not None
    with pytest.raises(ConnectionClosed, match="closed under the sender"):
        await w


class _Gated(_SendOnly):
    """A connection whose sends take their place at once, then wait on a gate (a full peer
    queue) before they count as sent."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.queued: list[list[Any]] = []
        self.sent: list[list[Any]] = []

    async def send(self, frames: Sequence[Any]) -> None:
        msg = list(frames)
        self.queued.append(msg)
        await self.gate.wait()
        self.sent.append(msg)


async def _cancel_while_waiting(w: Awaitable[None] | None) -> None:
    """Await ``w`` (a write that must wait) from a task, and cancel that task while it waits."""
    assert w is not None
    waiter = asyncio.ensure_future(w)
    await asyncio.sleep(0)  # the waiter starts waiting
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


@pytest.mark.timeout(10)
async def test_a_caller_cancelled_while_it_waits_does_not_take_the_message_out_of_the_stream() -> None:
    """The message's place was fixed by write_nowait (later ones are numbered after it): a
    cancelled sender must leave it to go out, or the peer sees a gap."""
    conn = _Gated()
    await _cancel_while_waiting(conn.write_nowait([b"first"]))
    later = conn.write_nowait([b"second"])
    conn.gate.set()
    await later
    await asyncio.sleep(0)
    assert conn.queued == [[b"first"], [b"second"]]
    assert sorted(conn.sent) == [[b"first"], [b"second"]]  # the first one was not given up


@pytest.mark.timeout(10)
async def test_a_cancelled_in_process_write_keeps_its_place_and_releases_its_buffers() -> None:
    """The in-process transport with its peer's queue full: a sender cancelled while it waits
    for room neither loses its message (a gap in the stream) nor keeps its buffer alive."""
    import weakref

    import numpy as np

    from aionet.config import LimitsSection
    from aionet.transports.inproc import InprocTransport

    t = InprocTransport({"max_queued_messages": 1}, LimitsSection())
    accepted: list[Connection] = []

    async def handler(conn: Connection) -> None:
        accepted.append(conn)

    listener = await t.listen("inproc://auto", handler)
    try:
        client = await t.connect(listener.address)
        await client.send([b"fills the queue"])
        buf = np.zeros(1 << 20, np.uint8)
        gone = weakref.ref(buf)
        await _cancel_while_waiting(client.write_nowait([memoryview(buf)]))
        await asyncio.sleep(0)  # the listener's handler task runs
        server = accepted[0]
        assert await server.recv() == [b"fills the queue"]
        got = await asyncio.wait_for(server.recv(), 5)
        assert len(got) == 1 and bytes(got[0][:4]) == b"\0\0\0\0"
        del got, buf
        for _ in range(10):  # the send task's last step (after its message was taken) may be queued still
            await asyncio.sleep(0)
            gc.collect()
            if gone() is None:
                break
        assert gone() is None
    finally:
        await t.aclose()
