"""PushDelivery's rules, on a minimal host: hold delivery while the consumer's awaitable runs,
resume after it, and on a failure tell ``on_closed`` once and abort (only an open connection)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from aionet.log import get_logger
from aionet.transports.push_delivery import PushDelivery


class Host(PushDelivery):
    """Records what the mixin asks of its host; ``_push`` delivers the queue as one batch."""

    _log = get_logger("aionet.tests.push_delivery")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._closed = False
        self.peer_address = "test://peer"
        self._init_push()
        self.queue: list[bytes] = []
        self.holds = 0
        self.aborts = 0
        self.ends: list[BaseException] = []
        self.batches: list[list[bytes]] = []

    def start(self, on_messages: Callable[[list[Any]], Awaitable[None] | None]) -> None:
        self._on_messages = on_messages
        self._on_closed = self.ends.append

    def _push(self) -> None:
        if self.queue and self._push_pending is None and self._on_messages is not None:
            batch, self.queue = self.queue, []
            self.batches.append(batch)
            try:
                pending = self._on_messages(batch)
            except Exception as exc:
                self._push_failed(exc)
                return
            if pending is not None:
                self._pushed(pending)

    def _hold_input(self) -> None:
        self.holds += 1

    def abort(self) -> None:
        self.aborts += 1
        self._closed = True


async def test_a_pending_awaitable_holds_delivery_and_its_end_delivers_what_queued_meanwhile() -> None:
    host = Host(asyncio.get_running_loop())
    gate = asyncio.Event()
    host.start(lambda batch: gate.wait() if batch == [b"a"] else None)
    host.queue.append(b"a")
    host._push()
    assert host._push_pending is not None and host.holds == 1
    host.queue += [b"b", b"c"]
    host._push()  # held: nothing more delivered while the consumer waits
    assert host.batches == [[b"a"]]
    gate.set()
    await asyncio.wait_for(host._push_pending, 5.0)
    await asyncio.sleep(0)  # the done callback runs on the next loop pass
    assert host._push_pending is None
    assert host.batches == [[b"a"], [b"b", b"c"]]
    assert host.aborts == 0 and host.ends == []


async def test_an_awaitable_already_done_neither_holds_nor_stops_delivery() -> None:
    host = Host(asyncio.get_running_loop())
    done = asyncio.get_running_loop().create_future()
    done.set_result(None)
    host.start(lambda batch: None)
    assert host._pushed(done) is False
    assert host.holds == 0 and host._push_pending is None


@pytest.mark.parametrize("how", ["raises", "awaitable fails", "awaitable already failed", "cancelled"])
async def test_a_failing_consumer_is_told_its_error_once_and_the_connection_aborts(
    how: str, caplog: pytest.LogCaptureFixture
) -> None:
    loop = asyncio.get_running_loop()
    host = Host(loop)
    bug = RuntimeError("consumer bug")
    fut: asyncio.Future[None] = loop.create_future()

    def on_messages(batch: list[Any]) -> Awaitable[None] | None:
        if how == "raises":
            raise bug
        if how == "awaitable already failed":
            fut.set_exception(bug)
        return fut

    host.start(on_messages)
    host.queue.append(b"a")
    with caplog.at_level(logging.WARNING, logger="aionet.tests.push_delivery"):
        host._push()
        if how == "awaitable fails":
            fut.set_exception(bug)
        elif how == "cancelled":
            fut.cancel()
        await asyncio.sleep(0)
    assert len(host.ends) == 1
    if how == "cancelled":
        assert isinstance(host.ends[0], asyncio.CancelledError)
    else:
        assert host.ends[0] is bug
    assert host.aborts == 1
    assert host._on_messages is None and host._on_closed is None and host._push_pending is None
    assert "push-mode consumer failed" in caplog.text and "test://peer" in caplog.text
    host.queue.append(b"b")
    host._push()  # push mode is over: nothing more is delivered
    assert host.batches == [[b"a"]]


async def test_a_failure_on_a_closed_connection_is_reported_without_a_second_abort(
    caplog: pytest.LogCaptureFixture,
) -> None:
    host = Host(asyncio.get_running_loop())
    host.start(lambda batch: None)
    host._closed = True
    with caplog.at_level(logging.WARNING, logger="aionet.tests.push_delivery"):
        host._push_failed(RuntimeError("late"))
    assert [str(e) for e in host.ends] == ["late"]
    assert host.aborts == 0 and "push-mode consumer failed" not in caplog.text
    host._push_failed(RuntimeError("again"))  # on_closed is told only once
    assert len(host.ends) == 1
