"""Failure detection, pure: a phi-accrual detector and a lag-aware clock (no I/O, no sleeps).

Why phi-accrual rather than a fixed timeout: it learns each peer's normal heartbeat rhythm
and jitter, so a peer on a noisy machine gets more slack than one on a quiet link, while a
silent peer still crosses the threshold quickly. ``phi`` is ``-log10`` of the probability
that a heartbeat is still on its way after the observed silence, under a normal model of
inter-arrival times (phi 8 means "a gap this long happens once in 10^8 heartbeats").

Why a lag-aware clock: when this node's own event loop was blocked (a long synchronous
handler, a GC pause, the OS starving the process), heartbeats from healthy peers sit unread
in socket buffers and the silence is our fault, not theirs. :class:`LagClock` subtracts the
time the loop was demonstrably unable to run, so detectors built on it never blame peers for
our own stalls.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

Clock = Callable[[], float]

_LN10 = math.log(10.0)
_SQRT2 = math.sqrt(2.0)
_LOG_SQRT_PI = 0.5 * math.log(math.pi)


def phi_of(elapsed: float, mean: float, std: float) -> float:
    """``-log10 P(gap > elapsed)`` for gaps ~ Normal(mean, std); stable for huge gaps."""
    if std <= 0:
        raise ValueError("std must be positive")
    x = (elapsed - mean) / (std * _SQRT2)
    if x < 20.0:
        p = 0.5 * math.erfc(x)
        if p > 0.0:
            return max(0.0, -math.log10(p))
    # erfc(x) ~ exp(-x^2) / (x sqrt(pi)) for large x: work in logs to avoid underflow
    ln_p = -x * x - math.log(x) - _LOG_SQRT_PI + math.log(0.5)
    return -ln_p / _LN10


class PhiAccrualDetector:
    """Suspicion level for one peer, from the arrival times of its heartbeats.

    The history starts with ``expected_interval`` (so a brand-new peer, or one that never
    answers, is judged against the configured rhythm) and the creation time counts as the
    first arrival. ``min_std`` keeps a very regular peer from being declared after a tiny
    hiccup; ``acceptable_pause`` is extra silence always tolerated (added to the mean).
    """

    __slots__ = ("_clock", "_intervals", "_last", "_sum", "_sumsq", "acceptable_pause", "min_std", "window")

    def __init__(
        self,
        clock: Clock,
        *,
        expected_interval: float,
        min_std: float,
        acceptable_pause: float = 0.0,
        window: int = 100,
    ):
        if expected_interval <= 0 or min_std <= 0 or window < 2 or acceptable_pause < 0:
            raise ValueError("expected_interval and min_std must be positive, window >= 2, pause >= 0")
        self._clock = clock
        self.min_std = min_std
        self.acceptable_pause = acceptable_pause
        self.window = window
        self._intervals: deque[float] = deque()
        self._sum = 0.0
        self._sumsq = 0.0
        self._add(expected_interval)
        self._add(expected_interval)
        self._last = clock()

    def _add(self, dt: float) -> None:
        self._intervals.append(dt)
        self._sum += dt
        self._sumsq += dt * dt
        if len(self._intervals) > self.window:
            old = self._intervals.popleft()
            self._sum -= old
            self._sumsq -= old * old

    def heartbeat(self, now: float | None = None) -> None:
        """Record a heartbeat (or any proof of life) arriving now."""
        t = self._clock() if now is None else now
        dt = t - self._last
        if dt > 0:
            self._add(dt)
            self._last = t

    @property
    def mean(self) -> float:
        return self._sum / len(self._intervals)

    @property
    def std(self) -> float:
        n = len(self._intervals)
        m = self._sum / n
        return math.sqrt(max(self._sumsq / n - m * m, 0.0))

    @property
    def last(self) -> float:
        return self._last

    def elapsed(self, now: float | None = None) -> float:
        return (self._clock() if now is None else now) - self._last

    def phi(self, now: float | None = None) -> float:
        return phi_of(self.elapsed(now), self.mean + self.acceptable_pause, max(self.std, self.min_std))

    def silence_for(self, phi: float) -> float:
        """How long a silence reaches ``phi`` with the current history (for logs and docs)."""
        lo, hi = 0.0, 1.0
        mean, std = self.mean + self.acceptable_pause, max(self.std, self.min_std)
        while phi_of(hi, mean, std) < phi:
            hi *= 2
        for _ in range(60):
            mid = (lo + hi) / 2
            if phi_of(mid, mean, std) < phi:
                lo = mid
            else:
                hi = mid
        return hi


class LagClock:
    """A monotonic clock that stops while this node's event loop could not run.

    Tasks that sleep call :meth:`note` with the time they asked to wake at; lateness beyond
    ``slack`` is a stall. Overlapping reports (two tasks woken late by the same stall) are
    merged, so a stall is subtracted once. ``lag`` is a smoothed recent lateness for load
    reports; ``max_lag`` the worst seen since :meth:`reset_max`.
    """

    __slots__ = ("_clock", "_covered", "lag", "max_lag", "slack", "stalled")

    def __init__(self, clock: Clock, *, slack: float = 0.002):
        self._clock = clock
        self.slack = slack
        self.stalled = 0.0
        self._covered = -math.inf
        self.lag = 0.0
        self.max_lag = 0.0

    def real(self) -> float:
        return self._clock()

    def __call__(self) -> float:
        """Adjusted time: real time minus every stall noted so far."""
        return self._clock() - self.stalled

    def note(self, expected: float, actual: float | None = None) -> float:
        """A task meant to run at ``expected`` (real clock) ran at ``actual``; returns lateness."""
        t = self._clock() if actual is None else actual
        late = t - expected
        self.lag = 0.8 * self.lag + 0.2 * max(late, 0.0)
        if late > self.max_lag:
            self.max_lag = late
        if late > self.slack:
            start = max(expected + self.slack, self._covered)
            if t > start:
                self.stalled += t - start
        if t > self._covered:
            self._covered = t
        return late

    def reset_max(self) -> float:
        m, self.max_lag = self.max_lag, 0.0
        return m


__all__ = ["Clock", "LagClock", "PhiAccrualDetector", "phi_of"]
