"""aionet.testing.FakeClock: time moves only by advance(); sleeps wake when it passes them."""

import asyncio

import pytest

from aionet.core.ports import Clock
from aionet.testing import FakeClock


def test_it_is_a_clock_port_that_moves_only_when_advanced():
    clock: Clock = FakeClock(5.0)
    assert clock() == 5.0
    assert clock.now() == clock.monotonic() == 5.0
    assert clock.advance(1.5) == 6.5
    assert clock() == 6.5
    with pytest.raises(ValueError):
        clock.advance(-1)


async def test_sleepers_wake_in_deadline_order_when_time_passes_them():
    clock = FakeClock()
    woke: list[str] = []

    async def sleeper(name: str, s: float) -> None:
        await clock.sleep(s)
        woke.append(name)

    tasks = [asyncio.ensure_future(sleeper(n, s)) for n, s in (("late", 2.0), ("early", 1.0), ("now", 0))]
    for _ in range(3):
        await asyncio.sleep(0)
    assert woke == ["now"] and clock.sleepers == 2
    clock.advance(0.999)
    await asyncio.sleep(0)
    assert woke == ["now"]
    clock.advance(0.001)
    await asyncio.sleep(0)
    assert woke == ["now", "early"]
    clock.advance(5)
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert woke == ["now", "early", "late"] and clock.sleepers == 0


async def test_a_cancelled_sleep_is_skipped():
    clock = FakeClock()
    t = asyncio.ensure_future(clock.sleep(1))
    await asyncio.sleep(0)
    t.cancel()
    clock.advance(2)  # must not try to wake the cancelled future
    with pytest.raises(asyncio.CancelledError):
        await t
