"""A push-mode consumer for transport tests: it blocks on its first batch until released, so a
test can check that a connection holds later batches while the consumer's awaitable runs."""

from __future__ import annotations

import asyncio
from typing import Any


class GatedConsumer:
    """``on_messages`` for ``Connection.start_receiving``: the first batch returns ``gate.wait()``
    (no further batch may be delivered until the test sets ``gate``); every batch is recorded,
    and ``arrived(n)`` waits until ``n`` messages in all were delivered."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.batches: list[list[Any]] = []
        self.closed: asyncio.Future[BaseException] = loop.create_future()
        self.gate = asyncio.Event()
        self.first = asyncio.Event()
        self._count = 0
        self._want: tuple[int, asyncio.Future[None]] | None = None

    def on_messages(self, batch: list[Any]) -> Any:
        self.batches.append(batch)
        self._count += len(batch)
        if self._want is not None and self._count >= self._want[0] and not self._want[1].done():
            self._want[1].set_result(None)
        if not self.first.is_set():
            self.first.set()
            return self.gate.wait()  # block: no further batch until it is done
        return None

    def on_closed(self, exc: BaseException) -> None:
        self.closed.set_result(exc)

    async def arrived(self, n: int) -> None:
        if self._count >= n:
            return
        fut = asyncio.get_running_loop().create_future()
        self._want = (n, fut)
        await fut

    def payloads(self) -> list[Any]:
        """Frame 0 of every message delivered, in order."""
        return [m[0] for b in self.batches for m in b]
