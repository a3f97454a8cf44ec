"""How many of this node's requests to one peer are unanswered, held to the peer's window.

A peer runs at most ``link.max_concurrent_requests`` async handlers per caller, lets as many
requests again wait for a slot (``Router.waiting``), and stops reading from a caller that sends
more, until one of them starts. While it does not read, it reads nothing else from that caller
either: not the CANCEL of a request the caller gave up on, so handlers that never end would
hold that caller out for good. The peer advertises both numbers in its handshake (features
``rpc_batch`` and ``rpc_wait``), so the caller keeps to their sum instead: a request beyond it
waits here, in call order, and goes out when an earlier one is answered or given up (whose
CANCEL then goes first). A request given up while it waits here was never sent.

The count is conservative (a reply still on its way keeps its slot), so the peer never has
to stop reading, except for handlers that outlive their cancel: ones registered with
``cancellable=False``, or ones that swallow ``CancelledError``.
"""

from __future__ import annotations

import asyncio
import copy
import sys
from collections import deque
from typing import Any

from .waiters import wake_first

UNBOUNDED = sys.maxsize  # a peer that does not advertise its bound (an older node)


class RequestSlots:
    """``out`` requests hold a slot, of ``bound``; a slot freed while callers wait passes
    straight to the first of them (no newcomer can take it first)."""

    __slots__ = ("_waiters", "bound", "out")

    def __init__(self) -> None:
        self.out = 0
        self.bound = UNBOUNDED
        self._waiters: deque[asyncio.Future[None]] = deque()

    def set_bound(self, limit: Any) -> None:
        """The peer's advertised window (its ``max_concurrent_requests``, plus what may wait
        there); anything else: no bound."""
        self.bound = limit if type(limit) is int and limit >= 1 else UNBOUNDED
        while self.out < self.bound and wake_first(self._waiters):
            self.out += 1  # a larger bound (a new connection to a restarted peer): let waiters go

    async def take(self) -> None:
        """Hold a slot, waiting in line for one if all are taken. Cancellable; a slot handed to
        a caller cancelled meanwhile goes on to the next."""
        if self.out < self.bound and not self._waiters:
            self.out += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():  # the slot was ours: pass it on
                self.release()
            raise

    def release(self) -> None:
        """A request that held a slot ended (answered, failed or given up)."""
        if not self._waiters or not wake_first(self._waiters):
            self.out -= 1

    def fail(self, exc: BaseException) -> None:
        """The link failed: each caller in line gets a copy of ``exc`` (one instance raised in
        many tasks would collect all their tracebacks)."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(copy.copy(exc))

    @property
    def waiting(self) -> int:
        """Callers in line for a slot (for stats and tests)."""
        return sum(1 for f in self._waiters if not f.done())
