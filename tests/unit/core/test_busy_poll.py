"""BusyPoll (``node.busy_poll_us``) fed by hand: a fake loop that only queues callbacks and a
clock the test moves, so the window's rules are checked without real time."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from aionet.core.busy_poll import BusyPoll


class FakeLoop:
    def __init__(self) -> None:
        self.ready: list[Callable[[], Any]] = []

    def call_soon(self, fn: Callable[[], Any]) -> None:
        self.ready.append(fn)

    def run_once(self) -> int:
        """One loop iteration: run what was queued before it began."""
        now, self.ready = self.ready, []
        for fn in now:
            fn()
        return len(now)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _poll(window: float = 0.001) -> tuple[BusyPoll, FakeLoop, Clock]:
    loop, clock = FakeLoop(), Clock()
    return BusyPoll(loop, window, clock=clock), loop, clock  # type: ignore[arg-type]


def test_a_kick_keeps_the_loop_awake_until_the_window_ends_then_lets_it_sleep() -> None:
    bp, loop, clock = _poll(0.001)
    bp.kick()
    assert bp.active and len(loop.ready) == 1  # the loop now polls with a zero timeout
    for _ in range(5):
        clock.t += 0.0001
        assert loop.run_once() == 1  # each iteration queues the next: the loop never blocks
    clock.t += 0.001  # the window is over
    loop.run_once()
    assert not bp.active and loop.ready == []  # nothing queued: the loop may sleep in epoll
    s = bp.stats()
    assert (s.windows, s.spins, s.active) == (1, 5, False)
    assert s.busy_s == pytest.approx(0.0015)
    assert s.window_us == pytest.approx(1000)


def test_a_kick_inside_an_open_window_extends_it_without_a_second_poller() -> None:
    bp, loop, clock = _poll(0.001)
    bp.kick()
    clock.t += 0.0009
    bp.kick()  # a message 0.9 ms in: the window now ends 1 ms after it
    assert len(loop.ready) == 1
    clock.t += 0.0009  # 1.8 ms after the first kick: past the first window, not the second
    loop.run_once()
    assert bp.active and len(loop.ready) == 1
    clock.t += 0.0002
    loop.run_once()
    assert not bp.active and loop.ready == []
    assert bp.stats().windows == 1


def test_a_kick_after_the_window_closed_opens_a_new_one() -> None:
    bp, loop, clock = _poll(0.001)
    bp.kick()
    clock.t += 0.002
    loop.run_once()
    assert not bp.active
    bp.kick()
    assert bp.active and len(loop.ready) == 1 and bp.stats().windows == 2


def test_stop_ends_polling_and_later_kicks_do_not_restart_it() -> None:
    bp, loop, _clock = _poll(10.0)
    bp.kick()
    bp.stop()
    loop.run_once()
    assert not bp.active and loop.ready == []
    bp.kick()  # a message read while the node stops
    assert loop.ready == []


@pytest.mark.parametrize("window", [0.0, -1e-6, math.nan])
def test_a_window_that_is_not_positive_is_refused(window: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        BusyPoll(FakeLoop(), window, clock=Clock())  # type: ignore[arg-type]
