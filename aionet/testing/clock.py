"""A fake monotonic clock for tests: time moves only when the test says so.

Why: membership's timers (phi-accrual silence, suspicion expiry, verification cooldowns, the
stall awareness) are decisions about elapsed time. Fed real time, a test of "dead after the
suspicion timeout" sleeps for that timeout; fed a :class:`FakeClock`, it advances the clock and
asserts at once. It satisfies the :class:`aionet.core.ports.Clock` port (calling it returns
the time), like trio's ``MockClock`` without the autojump::

    clock = FakeClock()
    det = PhiAccrualDetector(clock, expected_interval=0.2, min_std=0.05)
    clock.advance(5.0)
    assert det.phi() > 8

:meth:`sleep` is an asyncio-compatible sleep that resumes when :meth:`advance` passes its
deadline, for code that takes a ``sleep`` beside its clock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class FakeClock:
    """Monotonic seconds that start at ``start`` and move only by :meth:`advance`."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self._now

    def now(self) -> float:
        """The current fake time (also what calling the clock returns)."""
        return self._now

    monotonic = now

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds`` (never back) and wake the sleepers whose deadline
        has come, earliest first; returns the new time."""
        if seconds < 0:
            raise ValueError("a monotonic clock does not go back")
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)
        return self._now

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has been advanced by ``seconds`` (0 or less: just yield)."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut

    @property
    def sleepers(self) -> int:
        """How many :meth:`sleep` calls are waiting (cancelled ones included until woken)."""
        return sum(not f.done() for _, _, f in self._sleepers)


__all__ = ["FakeClock"]
