"""The base Connection's default ``write_nowait`` (a task running ``send``, what the in-process
transport uses): a caller may drop the awaitable it got (its own task was cancelled first);
a send that then fails must not surface as "Task exception was never retrieved", and one
that is awaited still raises."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Sequence
from typing import Any

import pytest

from aionet.errors import ConnectionClosed
from aionet.transports.base import Connection


class _Closed(Connection):
    """A connection whose sends fail as a closed one's do."""

    async def send(self, frames: Sequence[Any]) -> None:
        await asyncio.sleep(0)
        raise ConnectionClosed("closed under the sender")

    async def recv(self) -> list[Any]:
        raise ConnectionClosed("closed")

    def abort(self) -> None:
        pass

    async def close(self) -> None:
        pass

    @property
    def closed(self) -> bool:
        return False


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
