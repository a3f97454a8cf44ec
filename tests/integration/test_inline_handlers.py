"""Inline service handlers (``aionet.core.ports.inline_handler``): answered on the reader like
a sync handler when they return a value, finished as an async handler would when they return a
coroutine; the waiting part counts against ``link.max_concurrent_requests``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aionet import Node, RemoteError
from aionet.config import Config
from aionet.core.ports import inline_handler


class Svc:
    """An inline handler on a method (how the cache registers its write handler)."""

    def __init__(self) -> None:
        self.started = 0  # calls of the inline part
        self.waiting = 0  # coroutines running now
        self.most = 0
        self.release = asyncio.Event()
        self.two_waiting = asyncio.Event()

    @inline_handler
    def handle(self, arg: Any) -> Any:
        self.started += 1
        if arg == "boom":
            raise ValueError("inline part failed")
        if isinstance(arg, int):
            return arg + 1  # answered inline
        return self._wait(arg)

    async def _wait(self, arg: str) -> str:
        self.waiting += 1
        self.most = max(self.most, self.waiting)
        if self.waiting >= 2:
            self.two_waiting.set()
        try:
            await self.release.wait()
            if arg == "late-boom":
                raise KeyError("waiting part failed")
            return arg.upper()
        finally:
            self.waiting -= 1


@pytest.mark.timeout(60)
async def test_inline_handler_answers_values_and_coroutines_and_raises_from_both_parts():
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0") as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b,
    ):
        svc = Svc()
        a.add_service("inl", svc.handle)
        assert await b.request("a", "inl", 41, timeout=10) == 42
        svc.release.set()
        assert await b.request("a", "inl", "x", timeout=10) == "X"
        with pytest.raises(RemoteError) as e1:
            await b.request("a", "inl", "boom", timeout=10)
        assert e1.value.remote_type == "ValueError"
        with pytest.raises(RemoteError) as e2:
            await b.request("a", "inl", "late-boom", timeout=10)
        assert e2.value.remote_type == "KeyError"
        # a request to itself takes the same two paths
        assert await a.request("a", "inl", 1) == 2
        assert await a.request("a", "inl", "y") == "Y"


@pytest.mark.timeout(60)
async def test_waiting_inline_handlers_count_against_max_concurrent_requests():
    cfg = Config.from_dict({"link": {"max_concurrent_requests": 2}}, env={})
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0", config=cfg) as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b,
    ):
        svc = Svc()
        a.add_service("inl", svc.handle)
        waits = [asyncio.ensure_future(b.request("a", "inl", f"w{i}", timeout=20)) for i in range(4)]
        await asyncio.wait_for(svc.two_waiting.wait(), 10)
        # at the bound, the peer's next requests are not even started (reading it is paused),
        # an inline answer included, until a waiting handler finishes
        quick = asyncio.ensure_future(b.request("a", "inl", 1, timeout=20))
        await asyncio.sleep(0.2)  # a negative check (nothing may start): no event to wait on
        assert svc.started == 2 and svc.waiting == 2 and not quick.done()
        svc.release.set()
        assert await asyncio.gather(*waits) == ["W0", "W1", "W2", "W3"]
        assert await quick == 2
        assert svc.most == 2
