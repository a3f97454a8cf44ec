"""Many outstanding requests to one peer (issue 18): pipelined on one link, each answered
once with its own reply; the per-request timeout still bounds each call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from aionet import Node

Pair = tuple[Node, Node]


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    """Node a, and node b joined to it."""
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0") as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b,
    ):
        yield a, b


@pytest.mark.timeout(60)
async def test_64_requests_in_flight_each_get_their_own_reply(pair: Pair) -> None:
    a, b = pair
    running = [0, 0]  # now, most at once
    overlapped = asyncio.Event()  # 32 handlers ran at once: only pipelined requests get there

    @a.service("slow_echo")
    async def slow_echo(x: int) -> int:
        running[0] += 1
        running[1] = max(running[1], running[0])
        if running[0] >= 32:
            overlapped.set()
        try:
            await asyncio.wait_for(overlapped.wait(), 5)  # one at a time: times out, the test fails
        finally:
            running[0] -= 1
        return x * 2

    async def worker(w: int) -> list[int]:
        return [await b.request("a", "slow_echo", w * 1000 + i, timeout=10) for i in range(20)]

    results = await asyncio.gather(*(worker(w) for w in range(64)))
    assert results == [[(w * 1000 + i) * 2 for i in range(20)] for w in range(64)]
    assert running[1] >= 32, "requests to one peer did not overlap: not pipelined"


@pytest.mark.timeout(60)
async def test_timeout_bounds_a_request_whose_handler_never_answers_and_the_link_goes_on(pair: Pair) -> None:
    a, b = pair
    release = _stuck_service(a)

    await b.request("a", "aionet.echo", 0, timeout=5)  # the link is up: the fast path
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError, match="'stuck' to 'a' timed out after 0.2 s"):
        await b.request("a", "stuck", 1, timeout=0.2)
    assert asyncio.get_running_loop().time() - t0 < 2
    release.set()  # the late reply is dropped, not delivered to a later call
    assert await b.request("a", "aionet.echo", 2, timeout=5) == 2
    assert not b.router.pending


@pytest.mark.timeout(60)
async def test_cancelling_a_request_with_a_timeout_is_a_cancellation_not_a_timeout(pair: Pair) -> None:
    a, b = pair
    started = asyncio.Event()

    @a.service("hang")
    async def hang(_x: int) -> None:
        started.set()
        await asyncio.Event().wait()

    await b.request("a", "aionet.echo", 0, timeout=5)
    call = asyncio.ensure_future(b.request("a", "hang", 1, timeout=30))
    await asyncio.wait_for(started.wait(), 5)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert not b.router.pending


@pytest.mark.timeout(60)
async def test_a_short_timeout_fires_on_time_behind_a_long_one_and_deadlines_do_not_pile_up(pair: Pair) -> None:
    a, b = pair
    release = _stuck_service(a)

    await b.request("a", "aionet.echo", 0, timeout=5)
    long = asyncio.ensure_future(b.request("a", "stuck", 1, timeout=50))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TimeoutError, match="timed out after 0.2 s"):
        await b.request("a", "stuck", 2, timeout=0.2)  # earlier deadline than the pending one
    assert loop.time() - t0 < 2
    # many answered requests with a long timeout: the deadline records are dropped as they
    # are answered (compaction), not kept for the whole timeout
    for i in range(5000):
        assert await b.request("a", "aionet.echo", i, timeout=60) == i
    assert b.router._deadlines._n < 3000
    assert not long.done()
    release.set()
    assert await long == 1


def _stuck_service(a: Node) -> asyncio.Event:
    """Register ``stuck`` on ``a``: it answers (its argument) only once the event is set."""
    release = asyncio.Event()

    @a.service("stuck")
    async def stuck(x: int) -> int:
        await release.wait()
        return x

    return release
