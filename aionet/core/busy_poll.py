"""Busy polling: keep the event loop awake for a short window after each message.

A process that sleeps in ``epoll_wait`` between a request and its reply (or between a reply
and the next request) pays the operating system's wake-up on every message: on a virtual
machine that is tens of microseconds, more than the rest of a round trip. While the window is
open, a callback re-queues itself each loop iteration, so the loop polls with a zero timeout
and reads the next message as soon as the kernel has it. The cost is a busy core for up to
``window`` after the last message (``node.busy_poll_us``, 200 us by default; only connections
whose socket the loop reads open windows: ``Connection.busy_polls``). The same trade as
Linux's ``SO_BUSY_POLL``, Seastar's idle polling or an MPI library's progress polling.
Each polling iteration calls ``sched_yield``, so a thread or process that waits for this core
(libzmq's I/O threads, other ranks on an oversubscribed host) still gets it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

from ..stats import BusyPollStats


class BusyPoll:
    """Holds the loop awake until ``window`` seconds after the latest :meth:`kick`."""

    __slots__ = (
        "_active",
        "_loop",
        "_opened",
        "_stopped",
        "_time",
        "_until",
        "_window",
        "_yield",
        "busy_s",
        "spins",
        "windows",
    )

    def __init__(
        self, loop: asyncio.AbstractEventLoop, window: float, clock: Callable[[], float] | None = None
    ) -> None:
        if not window > 0:
            raise ValueError("a busy-poll window must be positive (0 means: do not create one)")
        self._loop = loop
        # not loop.time(): uvloop's reads libuv's cached millisecond clock, which would stretch a
        # 50 us window to a millisecond or two (and its CPU cost with it)
        self._time = clock if clock is not None else time.perf_counter
        self._yield: Callable[[], None] = getattr(os, "sched_yield", _nothing)
        self._window = window
        self._until = 0.0
        self._opened = 0.0  # when the open window began (for busy_s)
        self._active = False  # a _spin callback is queued
        self._stopped = False
        self.windows = 0  # windows opened from idle
        self.spins = 0  # loop iterations spent polling
        self.busy_s = 0.0  # seconds of closed windows: the CPU time polling may have cost

    def kick(self) -> None:
        """A message went out or came in: poll for another ``window`` before sleeping."""
        now = self._time()
        self._until = now + self._window
        if not self._active and not self._stopped:
            self._active = True
            self._opened = now
            self.windows += 1
            self._loop.call_soon(self._spin)

    def _spin(self) -> None:
        now = self._time()
        if self._stopped or now >= self._until:
            self._active = False
            self.busy_s += now - self._opened
            return
        self.spins += 1
        self._yield()  # a thread or process waiting for this core runs first (libzmq's I/O threads)
        self._loop.call_soon(self._spin)

    def stop(self) -> None:
        """No more polling (the node stops); the queued callback ends on its next run."""
        self._stopped = True

    @property
    def active(self) -> bool:
        """Whether a window is open (the loop is being kept awake)."""
        return self._active

    def stats(self) -> BusyPollStats:
        return BusyPollStats(
            window_us=self._window * 1e6,
            windows=self.windows,
            spins=self.spins,
            busy_s=self.busy_s,
            active=self._active,
        )


def _nothing() -> None:
    """sched_yield where the platform has none."""
