"""Point-to-point messaging as a demanding user meets it, over tcp:// and zmq+tcp://: every
wait is released with a typed error that says what happened, giving up leaves nothing
behind, and a consumer's bug costs only its own message."""

from __future__ import annotations

import asyncio
import gc
import traceback
from collections.abc import AsyncIterator

import pytest
from structlog.testing import capture_logs

import aionet
from aionet import Node
from aionet.errors import NodeClosed
from tests.conftest import wait_for

Pair = tuple[Node, Node]


@pytest.fixture(params=["tcp", "zmq+tcp"])
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    """Node a, and node b joined to it, over one transport."""
    scheme = request.param
    async with (
        Node(name="a", listen=f"{scheme}://127.0.0.1:0") as a,
        Node(name="b", listen=f"{scheme}://127.0.0.1:0", join=[a.address]) as b,
    ):
        yield a, b


@pytest.mark.timeout(60)
async def test_recv_and_recv_batch_waiting_at_stop_are_released_with_node_closed(pair: Pair) -> None:
    a, b = pair
    await b.send("a", "kept", "delivered before the stop")
    assert await a.recv_from("kept", timeout=5) == ("b", "delivered before the stop")
    await b.send("a", "kept", "still waiting at the stop")
    await wait_for(lambda: a.router.mailbox("kept").qsize() == 1)
    waiting = [
        asyncio.ensure_future(a.recv("never")),
        asyncio.ensure_future(a.recv_from("never", timeout=30)),
        asyncio.ensure_future(a.recv_batch("other")),
    ]
    mbs = a.router.mailbox("never"), a.router.mailbox("other")
    await wait_for(lambda: len(mbs[0]._getters) == 2 and len(mbs[1]._getters) == 1)  # all three waiting
    await a.stop()
    for fut in waiting:
        with pytest.raises(NodeClosed, match="node 'a' is stopped"):
            await asyncio.wait_for(fut, 5)
    # what was delivered before the stop can still be taken; then the stop is told at once
    assert await asyncio.wait_for(a.recv("kept"), 5) == "still waiting at the stop"
    with pytest.raises(NodeClosed):
        await asyncio.wait_for(a.recv("kept"), 5)
    with pytest.raises(NodeClosed):
        await asyncio.wait_for(a.recv("a channel never used"), 5)
    assert isinstance(NodeClosed("x"), aionet.AionetError)


@pytest.mark.timeout(60)
async def test_timeouts_name_what_timed_out(pair: Pair) -> None:
    a, b = pair

    release = asyncio.Event()

    @a.service("slow")
    async def slow(x: int) -> int:
        if x:
            await release.wait()
        return x

    with pytest.raises(TimeoutError, match="'slow' to 'a' timed out after 0.05 s"):
        await b.request("a", "slow", 1, timeout=0.05)
    # a request to the node itself says the same
    with pytest.raises(TimeoutError, match="'slow' to 'a' timed out after 0.05 s"):
        await a.request("a", "slow", 1, timeout=0.05)
    with pytest.raises(TimeoutError, match="recv_from\\('idle'\\): no message within 0.05 s"):
        await a.recv("idle", timeout=0.05)
    with pytest.raises(TimeoutError, match="recv_batch\\('idle'\\): no message within 0.05 s"):
        await a.recv_batch("idle", timeout=0.05)
    assert await a.request("a", "slow", 0, timeout=5) == 0
    release.set()


@pytest.mark.timeout(60)
async def test_recv_batch_timeout_and_polling_recv_leaves_nothing_behind(pair: Pair) -> None:
    a, b = pair
    for _ in range(300):  # a polling loop on an idle channel
        with pytest.raises(TimeoutError):
            await a.recv("idle", timeout=0.0001)
        with pytest.raises(TimeoutError):
            await a.recv_batch("idle", timeout=0.0001)
    assert len(a.router.mailbox("idle")._getters) == 0
    await b.send_many("a", "idle", [1, 2, 3])
    got: list[int] = []
    while len(got) < 3:
        got += await a.recv_batch("idle", timeout=5)
    assert got == [1, 2, 3]
    # a message already waiting is returned even with a zero timeout
    await b.send("a", "idle", 4)
    await wait_for(lambda: a.router.mailbox("idle").qsize() == 1)
    assert await a.recv("idle", timeout=0) == 4


@pytest.mark.timeout(60)
async def test_a_recv_waiting_when_on_channel_is_set_gets_messages_after_it_is_removed(pair: Pair) -> None:
    a, b = pair
    pending = asyncio.ensure_future(a.recv("ch"))
    await wait_for(lambda: len(a.router.mailbox("ch")._getters) == 1)  # the recv is waiting
    taken: list[int] = []
    a.on_channel("ch", lambda _sender, obj: taken.append(obj))
    await b.send("a", "ch", 1)
    await wait_for(lambda: taken == [1])
    assert not pending.done()
    a.on_channel("ch", None)
    await b.send("a", "ch", 2)
    assert await asyncio.wait_for(pending, 5) == 2


@pytest.mark.timeout(60)
async def test_an_on_channel_consumer_that_raises_loses_only_its_message(pair: Pair) -> None:
    a, b = pair
    taken: list[int] = []
    lost = asyncio.Event()
    a.on_connection_event(lambda _p, ev, _d: lost.set() if ev == "lost" else None)

    def consumer(_sender: str, obj: int) -> None:
        if obj % 3 == 0:
            raise (ValueError if obj % 2 else RuntimeError)(f"consumer bug at {obj}")
        taken.append(obj)

    a.on_channel("ch", consumer)
    with capture_logs() as logs:
        for i in range(1, 10):
            await b.send("a", "ch", i)  # small: one batched envelope
        await b.send_many("a", "ch", list(range(10, 20)))
        await wait_for(lambda: taken and taken[-1] == 19)
        assert await b.request("a", "aionet.echo", "still up", timeout=5) == "still up"
    assert taken == [i for i in range(1, 20) if i % 3]
    assert not lost.is_set(), "the connection was closed for the consumer's bug"
    failed = [e for e in logs if "on_channel consumer" in e["event"]]
    assert len(failed) == 6 and failed[0]["channel"] == "ch" and "consumer bug at 3" in failed[0]["error"]
    assert not [e for e in logs if "bad message from peer" in e["event"] or "reader failed" in e["event"]]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scheme", ["tcp", "zmq+tcp"])
async def test_a_stop_while_a_full_mailbox_pauses_reading_leaves_no_task_and_logs_no_failure(scheme: str) -> None:
    small = aionet.Config.from_dict({"link": {"mailbox_size": 4}})
    a = Node(name="a", listen=f"{scheme}://127.0.0.1:0", config=small)
    await a.start()
    b = Node(name="b", listen=f"{scheme}://127.0.0.1:0", join=[a.address])
    await b.start()
    for i in range(20):
        await b.send("a", "full", [i, "x" * 1000])  # lists of 2: each its own envelope
    await wait_for(lambda: a.router.mailbox("full").qsize() == 4)
    with capture_logs() as logs:
        await a.stop()
        await b.stop()

        def readers_left() -> list[asyncio.Task]:
            left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
            return [t for t in left if "_resume" in repr(t.get_coro())]

        await wait_for(lambda: not readers_left(), 5)  # before the fix one stayed for good
    assert not [e for e in logs if e["log_level"] == "error"], logs


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scheme", ["tcp", "zmq+tcp"])
async def test_calls_waiting_for_window_space_when_the_peer_dies_each_get_their_own_error(scheme: str) -> None:
    """A request blocked on window space leaves no failed reply future unretrieved (the
    loop-error guard would report it), and every caller's PeerUnavailable carries only its
    own frames: one shared exception raised again and again would show each caller the
    frames of all the others, and keep those frames alive."""
    tiny = aionet.Config.from_dict({"link": {"mailbox_size": 2}})
    narrow = aionet.Config.from_dict({"link": {"max_inflight_bytes": 1 << 20}})
    async with (
        Node(name="a", listen=f"{scheme}://127.0.0.1:0", config=tiny) as a,
        Node(name="b", listen=f"{scheme}://127.0.0.1:0", join=[a.address], config=narrow) as b,
    ):
        assert await b.request("a", "aionet.echo", 0, timeout=5) == 0
        sent = 0
        while True:  # a never reads "x": its mailbox fills, it stops reading, b's window fills
            try:
                b.send_nowait("a", "x", [sent, b"y" * 50_000])
                sent += 1
            except aionet.WouldBlock:
                try:
                    await asyncio.wait_for(b.wait_space("a"), 0.5)
                except TimeoutError:
                    break
        calls = [
            asyncio.ensure_future(b.request("a", "aionet.echo", 1)),
            asyncio.ensure_future(b.request("a", "aionet.echo", 2, timeout=30)),
            asyncio.ensure_future(b.send("a", "x", 3)),
            asyncio.ensure_future(b.send("a", "x", 4)),
            asyncio.ensure_future(b.wait_space("a")),
        ]
        link = b._peers["a"].link
        await wait_for(lambda: len(b.router.pending) == 2 and link._waiting_senders >= 2)  # all blocked
        assert not any(c.done() for c in calls)
        b.declare_dead("a", "test verdict")
        errors = await asyncio.gather(*(asyncio.wait_for(c, 10) for c in calls), return_exceptions=True)
        assert all(isinstance(e, aionet.PeerUnavailable) and "declared dead (test verdict)" in str(e) for e in errors)
        send_error = errors[2]
        assert isinstance(send_error, BaseException)
        frames = [f.name for f in traceback.extract_tb(send_error.__traceback__)]
        assert "request" not in frames and "wait_space" not in frames, frames


@pytest.mark.timeout(120)
async def test_ten_thousand_cancelled_requests_and_sends_leave_nothing_behind(pair: Pair) -> None:
    a, b = pair
    gate = asyncio.Event()

    @a.service("hold")
    async def hold(x: int) -> int:
        await gate.wait()
        return x

    assert await b.request("a", "aionet.echo", 0, timeout=5) == 0
    deadlines = b.router._deadlines
    slots = b._peers["a"].link.requests
    window = 2 * a.config.link.max_concurrent_requests  # a runs 1024 handlers, 1024 more wait there
    assert slots.bound == window
    for r in range(4):  # 10,000 cancelled requests, half of them with a deadline
        calls = [asyncio.ensure_future(b.request("a", "hold", i, timeout=30 if i % 2 else None)) for i in range(2500)]
        # the window's worth out (a runs half of them, the rest wait there), the rest in line at b
        await wait_for(lambda: len(b.router.pending) == window and slots.waiting == 2500 - window)
        for c in calls:
            c.cancel()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        assert b.router.pending == {} and b.router._timing == {}
        assert slots.out == 0 and slots.waiting == 0
        # deadlines of abandoned requests are compacted away, not kept until they pass (30 s)
        assert deadlines._n <= max(1024, 2 * 1250) + 1, (r, deadlines._n)
    gate.set()  # the handlers answer; the replies find nobody waiting and are dropped
    await wait_for(lambda: not a.router.running and not a.router.tasks, timeout=90)
    assert await b.request("a", "hold", 7, timeout=30) == 7
    assert b.router.pending == {}
    assert a.router._slot_waiters == {} and b.router._slot_waiters == {}
    # sends blocked on a full window, cancelled: nothing left waiting on the link
    link = b._peers["a"].link
    assert link is not None
    full = link.state.max_inflight_bytes
    link.state.max_inflight_bytes = 0  # the window is full from now on
    sends = [asyncio.ensure_future(b.send("a", "ch", [i, "x"])) for i in range(10_000)]
    await wait_for(lambda: link._waiting_senders == 10_000)  # every one blocked on the window
    assert not any(s.done() for s in sends)
    for s in sends:
        s.cancel()
    await asyncio.gather(*sends, return_exceptions=True)
    link.state.max_inflight_bytes = full
    link._space.set()
    assert link._waiting_senders == 0 and len(link._ack_waiters) == 0
    await b.send("a", "ch", "after")
    assert await a.recv("ch", timeout=10) == "after"  # none of the cancelled sends went out


class _Unprintable(Exception):
    """An exception whose message cannot be rendered (a bug in user code, but a handler's)."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ failed")


@pytest.mark.timeout(60)
async def test_a_handler_raising_an_exception_that_cannot_be_printed_still_answers(pair: Pair) -> None:
    """Rendering the error used to raise in the reader (sync handler: the connection closed
    and the caller, whose request counted as delivered, waited for good) or in the handler's
    task (async: "Task exception was never retrieved", the caller waited for good)."""
    a, b = pair

    @a.service("sync_bad")
    def sync_bad(_x: int) -> None:
        raise _Unprintable()

    @a.service("async_bad")
    async def async_bad(_x: int) -> None:
        raise _Unprintable()

    for caller, service in [(b, "sync_bad"), (b, "async_bad"), (a, "sync_bad"), (a, "async_bad")]:
        with pytest.raises(aionet.RemoteError) as err:
            await caller.request("a", service, 1, timeout=5)
        assert err.value.remote_type.endswith("_Unprintable")
        assert "str() failed" in err.value.remote_message
    assert await b.request("a", "aionet.echo", "still up", timeout=5) == "still up"


@pytest.mark.timeout(60)
async def test_send_many_stops_at_the_first_object_it_cannot_send(pair: Pair) -> None:
    a, b = pair
    with pytest.raises(aionet.SerializationError, match="builtins.object.*security.allow_pickle"):
        await b.send_many("a", "many", [1, [2, "two"], object(), 3])
    await b.send("a", "many", "next")
    got = [await a.recv("many", timeout=5) for _ in range(3)]
    assert got == [1, [2, "two"], "next"]  # the ones before it, none after it


@pytest.mark.timeout(60)
async def test_an_unknown_service_error_names_the_fix_and_the_applications_services(pair: Pair) -> None:
    a, b = pair
    a.add_service("mine", lambda x: x)
    for caller in (b, a):
        with pytest.raises(aionet.RemoteError) as err:
            await caller.request("a", "nope", 1, timeout=5)
        assert err.value.remote_type == "aionet.ServiceNotFound"
        msg = err.value.remote_message
        assert "no service 'nope' on node 'a'" in msg and "@node.service('nope')" in msg
        assert "its services: mine (and " in msg and "aionet.cache" not in msg


@pytest.mark.timeout(60)
async def test_a_request_to_the_node_itself_is_released_when_it_stops(pair: Pair) -> None:
    """Remote callers of a handler still running at the stop are told; a request to the node
    itself runs its handler on the caller's task, which nothing cancelled: it waited for good."""
    a, _b = pair
    started = asyncio.Event()
    cleaned = asyncio.Event()

    @a.service("forever")
    async def forever(_x: int) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    calls = [
        asyncio.ensure_future(a.request("a", "forever", 1)),
        asyncio.ensure_future(a.request("a", "forever", 2, timeout=30)),
    ]
    await asyncio.wait_for(started.wait(), 5)
    await a.stop(grace=0.1)
    for call in calls:
        with pytest.raises(aionet.RemoteError) as err:
            await asyncio.wait_for(call, 5)
        assert err.value.remote_type == "asyncio.CancelledError"
        assert "node shutting down" in err.value.remote_message
    assert cleaned.is_set()
    with pytest.raises(aionet.PeerUnavailable, match="local node is not running"):
        await a.request("a", "aionet.echo", 1, timeout=5)


@pytest.mark.timeout(60)
async def test_recv_timeouts_racing_arrivals_lose_and_repeat_nothing(pair: Pair) -> None:
    """A recv whose deadline fires as its message arrives leaves the message for the next one."""
    a, b = pair
    n = 3000

    async def sender() -> None:
        for i in range(n):
            await b.send("a", "race", i)
            if i % 3 == 0:
                await asyncio.sleep(0.0002)  # arrivals spread out: deadlines fire around them

    task = asyncio.ensure_future(sender())
    got: list[int] = []
    timeouts = 0
    while len(got) < n:
        try:
            if len(got) % 2:
                got.append(await a.recv("race", timeout=0.0002))
            else:
                got += await a.recv_batch("race", limit=5, timeout=0.0002)
        except TimeoutError:
            timeouts += 1
            if timeouts > 100_000:
                raise
    await task
    assert got == list(range(n))
    assert timeouts > 0  # the race was run
    assert len(a.router.mailbox("race")._getters) == 0


class _AsyncCallable:
    """A service object whose ``__call__`` is a coroutine function."""

    async def __call__(self, x: int) -> int:
        await asyncio.sleep(0)
        return x + 1


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("error::RuntimeWarning")  # "coroutine ... was never awaited"
async def test_handlers_that_are_coroutines_in_disguise(pair: Pair) -> None:
    """An object with ``async def __call__`` is an async handler (it was run as a sync one:
    its coroutine was never awaited and the caller read "cannot serialize coroutine"); a
    plain def that returns a coroutine is refused with the fix named."""
    a, b = pair

    async def add(k: int, x: int) -> int:
        return x + k

    a.add_service("callable", _AsyncCallable())
    a.add_service("returns_coroutine", lambda x: add(5, x))

    @a.service("cancels_itself")
    async def cancels_itself(_x: int) -> None:
        raise asyncio.CancelledError()

    for caller in (b, a):
        assert await caller.request("a", "callable", 1, timeout=5) == 2
        with pytest.raises(aionet.RemoteError) as err:
            await caller.request("a", "returns_coroutine", 1, timeout=5)
        assert "returned a coroutine" in err.value.remote_message and "async def" in err.value.remote_message
    # a handler cancelled by its own doing is not blamed on a shutdown that is not happening
    with pytest.raises(aionet.RemoteError) as err:
        await b.request("a", "cancels_itself", 1, timeout=5)
    assert err.value.remote_type == "asyncio.CancelledError"
    assert "shutting down" not in err.value.remote_message
    assert await b.request("a", "aionet.echo", "up", timeout=5) == "up"
    gc.collect()  # a coroutine never awaited warns when collected


@pytest.mark.timeout(60)
async def test_sends_to_the_node_itself_are_released_and_refused_once_it_stops() -> None:
    small = aionet.Config.from_dict({"link": {"mailbox_size": 2}})
    a = Node(name="a", listen="tcp://127.0.0.1:0", config=small)
    await a.start()
    try:
        a.send_nowait("a", "me", 1)
        await a.send("a", "me", 2)
        with pytest.raises(aionet.WouldBlock):
            a.send_nowait("a", "me", 3)
        space = asyncio.ensure_future(a.wait_space("a"))
        blocked = asyncio.ensure_future(a.send("a", "me", 3))
        await wait_for(lambda: len(a.router.mailbox("me")._putters) == 2)  # both waiting for room
        assert not space.done() and not blocked.done()
    finally:
        await a.stop()
    await asyncio.wait_for(space, 5)  # woken: the caller's next send says why
    with pytest.raises(NodeClosed):
        await asyncio.wait_for(blocked, 5)
    for call in (
        lambda: a.send("a", "me", 4),
        lambda: a.wait_space("a"),
        lambda: a.send_many("a", "me", [5]),
        lambda: asyncio.sleep(0, a.send_nowait("a", "me", 6)),
    ):
        with pytest.raises(aionet.PeerUnavailable, match="'a': local node is not running|a: local node is not running"):
            await asyncio.wait_for(call(), 5)
    assert [await a.recv("me", timeout=1) for _ in range(2)] == [1, 2]  # delivered before the stop


@pytest.mark.timeout(60)
async def test_send_nowait_to_a_peer_it_can_never_reach_says_so_instead_of_would_block(pair: Pair) -> None:
    """WouldBlock means "wait, then send again": for a peer that does not exist or has left,
    a loop that retries on WouldBlock would retry for ever. It gets send's PeerUnavailable."""
    a, b = pair
    with pytest.raises(aionet.PeerUnavailable, match="unknown peer 'zz'"):
        b.send_nowait("zz", "c", 1)
    b.send_nowait("a", "c", 1)
    assert await a.recv("c", timeout=5) == 1
    await a.stop()
    await wait_for(lambda: b._peers["a"].link is None or b._peers["a"].link.dead is not None)
    with pytest.raises(aionet.PeerUnavailable, match="left"):
        b.send_nowait("a", "c", 2)
    await b.stop()
    with pytest.raises(aionet.PeerUnavailable, match="not running"):
        b.send_nowait("a", "c", 3)


async def test_recv_batch_refuses_a_limit_below_one(pair: Pair) -> None:
    """limit=0 would wait for a message, take none and return [] at once: a caller's loop spins."""
    a, b = pair
    await b.send(a.name, "c", 1)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="limit must be at least 1"):
            await a.recv_batch("c", limit=bad)
    assert await a.recv_batch("c", limit=1, timeout=5) == [1]
