"""RequestSlots fed directly: requests to one peer keep to its bound, wait in call order
beyond it, and no freed slot is lost (to a caller cancelled while in line, or one cancelled
right after a slot was handed to it)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.core.request_slots import UNBOUNDED, RequestSlots
from aionet.errors import PeerUnavailable


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def full(bound: int = 1) -> RequestSlots:
    """Slots at their bound: every slot taken, nobody in line yet."""
    s = RequestSlots()
    s.set_bound(bound)
    for _ in range(bound):
        await s.take()
    return s


def test_the_bound_comes_from_the_peers_handshake_value() -> None:
    s = RequestSlots()
    assert s.bound == UNBOUNDED  # an older peer that does not say
    s.set_bound(8)
    assert s.bound == 8
    for bad in (0, -1, "8", None, True, 2.5):
        s.set_bound(bad)
        assert s.bound == UNBOUNDED, bad


@pytest.mark.timeout(10)
async def test_callers_beyond_the_bound_wait_and_go_in_call_order() -> None:
    s = await full(2)
    order: list[int] = []

    async def caller(i: int) -> None:
        await s.take()
        order.append(i)

    tasks = [asyncio.ensure_future(caller(i)) for i in range(3)]
    await settle()
    assert order == [] and s.waiting == 3 and s.out == 2
    s.release()
    await settle()
    assert order == [0] and s.out == 2  # handed over, not freed: a newcomer cannot jump in
    s.release()
    s.release()
    await settle()
    assert order == [0, 1, 2] and s.out == 2 and s.waiting == 0
    await asyncio.gather(*tasks)


@pytest.mark.timeout(10)
async def test_a_newcomer_waits_behind_callers_in_line() -> None:
    s = await full()
    first = asyncio.ensure_future(s.take())
    await settle()
    s.release()  # handed to `first`, which has not run yet
    late = asyncio.ensure_future(s.take())
    await settle()
    assert first.done() and not late.done() and s.out == 1
    s.release()
    await settle()
    assert late.done() and s.out == 1


@pytest.mark.timeout(10)
async def test_a_slot_handed_to_a_caller_cancelled_meanwhile_goes_to_the_next() -> None:
    s = await full()
    a = asyncio.ensure_future(s.take())
    b = asyncio.ensure_future(s.take())
    await settle()
    s.release()  # a's future is resolved ...
    a.cancel()  # ... but a is cancelled before it runs
    await settle()
    assert a.cancelled() and b.done() and s.out == 1 and s.waiting == 0


@pytest.mark.timeout(10)
async def test_a_caller_cancelled_in_line_gives_up_its_place_only() -> None:
    s = await full()
    a = asyncio.ensure_future(s.take())
    b = asyncio.ensure_future(s.take())
    await settle()
    a.cancel()
    await settle()
    assert s.waiting == 1
    s.release()
    await settle()
    assert b.done() and s.out == 1
    s.release()
    assert s.out == 0


@pytest.mark.timeout(10)
async def test_callers_in_line_get_the_links_failure_each_its_own() -> None:
    s = await full()
    waiting = [asyncio.ensure_future(s.take()) for _ in range(3)]
    await settle()
    why = PeerUnavailable("p: gone")
    s.fail(why)
    errs = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(type(e) is PeerUnavailable and str(e) == "p: gone" for e in errs)
    assert len({id(e) for e in errs}) == 3 and why not in errs


@pytest.mark.timeout(10)
async def test_a_larger_bound_lets_callers_in_line_go() -> None:
    s = await full()
    waiting = [asyncio.ensure_future(s.take()) for _ in range(3)]
    await settle()
    s.set_bound(3)  # the peer came back with a larger bound
    await settle()
    assert [w.done() for w in waiting] == [True, True, False] and s.out == 3


@settings(max_examples=200, deadline=None)
@given(bound=st.integers(1, 4), ops=st.lists(st.sampled_from(["take", "release", "cancel"]), max_size=40))
def test_no_slot_is_lost_and_none_is_given_twice(bound: int, ops: list[str]) -> None:
    """Any mix of callers arriving, holders finishing and waiters cancelled: once things settle,
    exactly min(bound, callers still wanting one) callers hold a slot, the rest wait in line."""

    async def run() -> None:
        s = RequestSlots()
        s.set_bound(bound)
        holders: list[asyncio.Future[None]] = []  # callers that got a slot and still hold it
        waiters: list[asyncio.Future[None]] = []
        for op in ops:
            if op == "take":
                waiters.append(asyncio.ensure_future(s.take()))
            elif op == "release" and holders:
                holders.pop(0)
                s.release()
            elif op == "cancel" and waiters:
                waiters.pop(0).cancel()
            await settle()
            for w in [w for w in waiters if w.done()]:
                waiters.remove(w)
                if not w.cancelled():
                    holders.append(w)
            assert s.out == len(holders) <= bound
            assert s.waiting == len(waiters)
            if waiters:
                assert len(holders) == bound  # nobody waits while a slot is free
        for w in waiters:
            w.cancel()
        await settle()

    asyncio.run(run())
