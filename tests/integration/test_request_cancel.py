"""A caller that gives up on a request (its task cancelled, or its ``timeout`` passed) has the
peer cancel the handler, over tcp:// and zmq+tcp://: the handler's work stops, and its slot
of ``link.max_concurrent_requests`` is free again, so abandoned calls cannot wedge the peer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from aionet import Node, PeerUnavailable, RemoteError
from aionet.config import Config
from tests.conftest import proxied_pair, wait_for

Pair = tuple[Node, Node]


@pytest.fixture(params=["tcp", "zmq+tcp"])
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    """Node a (at most 2 async handlers per peer), and node b joined to it."""
    scheme = request.param
    cfg = Config.from_dict({"link": {"max_concurrent_requests": 2}}, env={})
    async with (
        Node(name="a", listen=f"{scheme}://127.0.0.1:0", config=cfg) as a,
        Node(name="b", listen=f"{scheme}://127.0.0.1:0", join=[a.address]) as b,
    ):
        yield a, b


class Held:
    """An async service that waits until released, and records how each call ended."""

    def __init__(self) -> None:
        self.started: asyncio.Queue[int] = asyncio.Queue()
        self.cancelled: asyncio.Queue[int] = asyncio.Queue()
        self.release = asyncio.Event()

    async def __call__(self, x: int) -> int:
        self.started.put_nowait(x)
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.put_nowait(x)
            raise
        return x


def idle(node: Node) -> bool:
    r = node.router
    return not r.running and not r.tasks and not r.handling


@pytest.mark.timeout(60)
async def test_a_timed_out_request_cancels_its_handler(pair: Pair) -> None:
    a, b = pair
    held = Held()
    a.add_service("held", held)
    with pytest.raises(TimeoutError):
        await b.request("a", "held", 1, timeout=0.2)
    assert await asyncio.wait_for(held.started.get(), 5) == 1
    assert await asyncio.wait_for(held.cancelled.get(), 5) == 1
    await wait_for(lambda: idle(a))


@pytest.mark.timeout(60)
async def test_a_cancelled_caller_cancels_its_handler(pair: Pair) -> None:
    a, b = pair
    held = Held()
    a.add_service("held", held)
    call = asyncio.ensure_future(b.request("a", "held", 2))  # no timeout: only the cancel ends it
    assert await asyncio.wait_for(held.started.get(), 5) == 2
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await asyncio.wait_for(held.cancelled.get(), 5) == 2
    await wait_for(lambda: idle(a))
    assert b.router.pending == {}


@pytest.mark.timeout(60)
async def test_abandoned_calls_free_the_peers_handler_slots(pair: Pair) -> None:
    """With 2 handlers allowed per peer, two abandoned calls to a handler that never ends
    used to hold both slots for ever: the peer stopped reading from b, and every later call
    from b waited. Now the slots come back and b's next calls are answered."""
    a, b = pair
    held = Held()
    a.add_service("held", held)
    for round_ in range(3):
        calls = [asyncio.ensure_future(b.request("a", "held", i, timeout=0.3)) for i in range(2)]
        for c in calls:
            with pytest.raises(TimeoutError):
                await c
        assert sorted([await asyncio.wait_for(held.cancelled.get(), 5) for _ in range(2)]) == [0, 1], round_
        assert await b.request("a", "aionet.echo", round_, timeout=5) == round_
    await wait_for(lambda: idle(a))
    held.release.set()
    assert await b.request("a", "held", 9, timeout=5) == 9  # the service itself still answers


@pytest.mark.timeout(60)
async def test_a_cancel_after_the_answer_changes_nothing(pair: Pair) -> None:
    a, b = pair
    a.add_service("quick", lambda x: x)  # a sync handler: nothing ever runs to cancel

    async def echo(x: int) -> int:
        return x

    a.add_service("echo2", echo)
    for i in range(50):
        assert await b.request("a", "quick", i, timeout=5) == i
        assert await b.request("a", "echo2", i, timeout=5) == i
    link = b._peers["a"].link
    assert link is not None
    b._abandoned("a", 10**9)  # a request id the peer never saw, or long answered
    b._abandoned("a", 1)
    assert await b.request("a", "echo2", 7, timeout=5) == 7  # the connection is fine
    await wait_for(lambda: idle(a))


@pytest.mark.timeout(60)
async def test_a_peer_without_the_feature_is_not_sent_a_cancel(pair: Pair) -> None:
    """An older peer (no "cancel" in its HELLO) would close the connection on an unknown
    envelope kind: it is never sent one, and its handler runs on."""
    a, b = pair
    held = Held()
    a.add_service("held", held)
    link = b._peers["a"].link
    assert link is not None and link.peer_cancels  # aionet peers announce it
    link.peer_cancels = False
    with pytest.raises(TimeoutError):
        await b.request("a", "held", 3, timeout=0.2)
    assert await asyncio.wait_for(held.started.get(), 5) == 3
    assert a.router.running  # not cancelled: still waiting
    held.release.set()
    await wait_for(lambda: idle(a))
    assert held.cancelled.empty()


@pytest.mark.parametrize("scheme", ["tcp", "zmq+tcp"])
@pytest.mark.timeout(60)
async def test_many_cancelled_callers_leave_nothing_running(scheme: str) -> None:
    """Requests and their cancels arriving in the same read (the handler's task is cancelled
    before its first step) still free their slots."""
    async with (
        Node(name="a", listen=f"{scheme}://127.0.0.1:0") as a,
        Node(name="b", listen=f"{scheme}://127.0.0.1:0", join=[a.address]) as b,
    ):
        await many_cancelled(a, b)


async def many_cancelled(a: Node, b: Node) -> None:
    held = Held()
    a.add_service("held", held)
    for _ in range(20):
        calls = [asyncio.ensure_future(b.request("a", "held", i)) for i in range(50)]
        await asyncio.sleep(0)  # the requests go out in this loop iteration's batch
        for c in calls:
            c.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
    await wait_for(lambda: idle(a) and not b.router.pending, timeout=30)
    assert await b.request("a", "aionet.echo", "still here", timeout=5) == "still here"


@pytest.mark.timeout(60)
async def test_a_service_registered_not_cancellable_runs_to_the_end(pair: Pair) -> None:
    a, b = pair
    held = Held()
    a.add_service("held", held, cancellable=False)
    with pytest.raises(TimeoutError):
        await b.request("a", "held", 4, timeout=0.2)
    assert await asyncio.wait_for(held.started.get(), 5) == 4
    assert a.router.running and not a.router.handling  # not reachable by a cancel
    held.release.set()
    await wait_for(lambda: idle(a))
    assert held.cancelled.empty()  # it finished; its answer found nobody waiting


@pytest.mark.timeout(60)
async def test_aionets_own_stateful_services_are_not_cancellable() -> None:
    """The cache (writes that replicate, lock grants), the scheduler (a steal that took tasks
    off a queue) and membership's sync must not stop half-way because an asker gave up."""
    async with Node(name="a", listen="tcp://127.0.0.1:0") as a:
        services = set(a.router.services)
        cache = {s for s in services if s.startswith("aionet.cache")}
        sched = {s for s in services if s.startswith("aionet.sched")}
        assert cache and sched
        assert cache | sched <= a.router.uncancellable
        assert "aionet.membership.sync" in a.router.uncancellable
        assert "aionet.echo" not in a.router.uncancellable


@pytest.mark.timeout(60)
async def test_a_cancel_lost_in_a_cut_connection_is_replayed_after_the_reconnect() -> None:
    """The cancel is a sequenced message: one written into a connection that then dies (here it
    sits in a stalled proxy when the proxy cuts) is sent again on the next connection, once."""
    async with proxied_pair() as (a, b, pa, pb):
        held = Held()
        a.add_service("held", held)
        call = asyncio.ensure_future(b.request("a", "held", 5, timeout=0.5))
        assert await asyncio.wait_for(held.started.get(), 5) == 5
        pa.stall()
        pb.stall()
        with pytest.raises(TimeoutError):
            await call  # its cancel is written now, into the stalled connection
        link = b._peers["a"].link
        assert link is not None
        await wait_for(lambda: b.router.pending == {} and link.state.inflight_bytes > 0)
        assert held.cancelled.empty()  # it has not arrived
        replayed = link.replayed
        pa.cut()
        pb.cut()
        pa.stall(False)
        pb.stall(False)
        assert await asyncio.wait_for(held.cancelled.get(), 20) == 5
        assert link.replayed > replayed  # it came on the new connection, written again
        await wait_for(lambda: idle(a), 20)
        assert held.cancelled.empty()  # once
        assert await b.request("a", "aionet.echo", "after", timeout=10) == "after"


@pytest.mark.timeout(60)
async def test_a_cancel_that_cannot_be_sent_changes_nothing_for_the_caller(pair: Pair) -> None:
    """Whatever posting the cancel raises stays out of the caller's error and out of the
    deadline timer: every timed-out request still raises TimeoutError."""
    a, b = pair
    held = Held()
    a.add_service("held", held)
    link = b._peers["a"].link
    assert link is not None

    def broken(rid: int) -> None:
        raise RuntimeError("cannot post")

    link.post_cancel = broken  # type: ignore[method-assign]
    calls = [b.request("a", "held", i, timeout=0.2) for i in range(3)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, TimeoutError) for r in results), results
    cancelled = asyncio.ensure_future(b.request("a", "held", 9))
    await asyncio.wait_for(held.started.get(), 5)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    del link.post_cancel
    held.release.set()
    assert await b.request("a", "held", 10, timeout=5) == 10


@pytest.mark.timeout(60)
async def test_callers_keep_to_the_peers_bound_so_hung_handlers_cannot_wedge_them(pair: Pair) -> None:
    """a runs at most 2 of b's handlers. Eight calls to a handler that never ends used to send
    all eight: a started two and stopped reading from b at the third, so the cancels of the
    timed-out calls (behind it in the stream) were never read, and every later call from b
    waited for good. Now b sends only a's window (2 running, 2 waiting there); the rest wait
    at b and time out there unsent; the cancels of the four that went reach a, which cancels
    the running ones and forgets the waiting ones."""
    a, b = pair
    held = Held()
    a.add_service("held", held)
    calls = [asyncio.ensure_future(b.request("a", "held", i, timeout=0.4)) for i in range(8)]
    await wait_for(lambda: len(a.router.waiting.get("b", ())) == 2)
    assert sorted(a.router.waiting["b"]) == sorted(b.router.pending)[2:]  # calls 2 and 3 wait at a
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, TimeoutError) for r in results), results
    await wait_for(lambda: idle(a) and not a.router.waiting)
    assert await b.request("a", "aionet.echo", "not wedged", timeout=5) == "not wedged"
    started = sorted(held.started.get_nowait() for _ in range(held.started.qsize()))
    cancelled = sorted(held.cancelled.get_nowait() for _ in range(held.cancelled.qsize()))
    assert started[:2] == [0, 1] and started == cancelled and set(started) <= {0, 1, 2, 3}  # 4-7 never left b
    link = b._peers["a"].link
    assert link is not None and link.requests.out == 0 and link.requests.waiting == 0


@pytest.mark.timeout(60)
async def test_a_call_waiting_for_a_slot_goes_once_an_earlier_one_is_given_up(pair: Pair) -> None:
    """With a's window full (2 handlers running, 2 requests waiting at a), a fifth call waits at
    b; cancelling a running one sends its cancel, a starts the oldest waiting request, and the
    fifth call goes (a never stopped reading from b)."""
    a, b = pair
    held = Held()
    a.add_service("held", held)
    first = [asyncio.ensure_future(b.request("a", "held", i)) for i in range(4)]
    assert sorted([await asyncio.wait_for(held.started.get(), 5) for _ in range(2)]) == [0, 1]
    await wait_for(lambda: len(a.router.waiting.get("b", ())) == 2)
    fifth = asyncio.ensure_future(b.request("a", "held", 4))
    link = b._peers["a"].link
    assert link is not None
    await wait_for(lambda: link.requests.waiting == 1)
    assert held.started.empty()
    first[0].cancel()
    assert await asyncio.wait_for(held.cancelled.get(), 5) == 0
    assert await asyncio.wait_for(held.started.get(), 5) == 2  # the oldest waiting one
    await wait_for(lambda: link.requests.waiting == 0 and list(a.router.waiting.get("b", ())) != [])
    held.release.set()
    assert await asyncio.wait_for(asyncio.gather(*first[1:], fifth), 5) == [1, 2, 3, 4]
    with pytest.raises(asyncio.CancelledError):
        await first[0]
    assert link.requests.out == 0
    await wait_for(lambda: idle(a) and not a.router.waiting)


@pytest.mark.timeout(60)
async def test_a_cancel_goes_out_even_when_the_window_is_full(pair: Pair) -> None:
    """A full window (unacknowledged bytes at ``link.max_inflight_bytes``) used to drop the
    cancel, leaving the handler running: a cancel is a few bytes, one per request, and goes."""
    a, b = pair
    held = Held()
    a.add_service("held", held)
    call = asyncio.ensure_future(b.request("a", "held", 7, timeout=0.5))
    assert await asyncio.wait_for(held.started.get(), 5) == 7
    link = b._peers["a"].link
    assert link is not None
    window = link.state.max_inflight_bytes
    link.state.max_inflight_bytes = 0  # full: nothing else may be posted now
    try:
        assert not link.can_post()
        with pytest.raises(TimeoutError):
            await call
        assert await asyncio.wait_for(held.cancelled.get(), 5) == 7
    finally:
        link.state.max_inflight_bytes = window
    await wait_for(lambda: idle(a))
    assert await b.request("a", "aionet.echo", "after", timeout=5) == "after"


@pytest.mark.timeout(60)
async def test_calls_waiting_for_a_slot_fail_when_the_peer_is_declared_dead(pair: Pair) -> None:
    a, b = pair
    held = Held()
    a.add_service("held", held)
    running = [asyncio.ensure_future(b.request("a", "held", i)) for i in range(4)]  # 2 run, 2 wait at a
    await wait_for(lambda: held.started.qsize() == 2 and len(a.router.waiting.get("b", ())) == 2)
    waiting = [asyncio.ensure_future(b.request("a", "held", i)) for i in range(4, 7)]
    link = b._peers["a"].link
    assert link is not None
    await wait_for(lambda: link.requests.waiting == 3)
    link.fail(PeerUnavailable("a: declared dead"))  # as membership's verdict does
    results = await asyncio.wait_for(asyncio.gather(*running, *waiting, return_exceptions=True), 10)
    assert all(isinstance(r, PeerUnavailable) for r in results), results
    assert held.started.qsize() == 2  # the waiting calls never reached a


@pytest.mark.timeout(60)
async def test_nothing_starts_once_the_peer_is_stopping() -> None:
    """a stops with b's calls at its bound and more waiting at b. Its stop cancels the two
    running handlers; their answers freed b's slots and b's waiting calls went out, and a
    started them mid-stop: tasks nobody owned, still pending after ``stop()`` returned. Now a
    stopping node starts nothing: every call ends with an error, and nothing is left running."""
    cfg = Config.from_dict({"link": {"max_concurrent_requests": 2}}, env={})
    a = Node(name="a", listen="tcp://127.0.0.1:0", config=cfg)
    await a.start()
    held = Held()
    a.add_service("held", held)
    try:
        async with Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b:
            calls = [asyncio.ensure_future(b.request("a", "held", i)) for i in range(5)]
            await wait_for(lambda: held.started.qsize() == 2)
            await a.stop()
            results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
            assert all(isinstance(r, RemoteError | PeerUnavailable) for r in results), results
            assert held.started.qsize() == 2  # nothing more started
            assert not a.router.tasks and not a.router.running
    finally:
        await a.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scheme", ["tcp", "zmq+tcp"])
async def test_requests_to_services_answered_inline_take_no_slot(scheme: str) -> None:
    """With a's whole window taken by slow async calls, b still gets answers from a's plain
    `def` services at once: a lists them in its HELLO ("rpc_inline"), and tells connected peers
    (INLINE_SERVICES) of one added later; they never hold one of its handler slots, so b does not
    count them. (They used to wait at b until a slow call ended.)"""
    cfg = Config.from_dict({"link": {"max_concurrent_requests": 2}}, env={})
    a = Node(name="a", listen=f"{scheme}://127.0.0.1:0", config=cfg)
    held = Held()
    a.add_service("held", held)
    a.add_service("ping", lambda x: x + 1)
    async with a, Node(name="b", listen=f"{scheme}://127.0.0.1:0", join=[a.address]) as b:
        link = b._peers["a"].link
        assert link is not None and "ping" in link.inline_services and "held" not in link.inline_services
        calls = [asyncio.ensure_future(b.request("a", "held", i)) for i in range(5)]
        await wait_for(lambda: link.requests.out == 4 and link.requests.waiting == 1)  # the window, and one in line
        assert await b.request("a", "ping", 1, timeout=2) == 2  # the fast path
        assert await asyncio.wait_for(b.request("a", "ping", 2), 2) == 3  # the general path
        assert link.requests.out == 4 and link.requests.waiting == 1  # neither took a slot

        @a.service("late")
        def late(x: int) -> int:
            return -x

        await wait_for(lambda: "late" in link.inline_services)  # told after the handshake
        assert await b.request("a", "late", 5, timeout=2) == -5
        assert link.requests.out == 4 and link.requests.waiting == 1
        held.release.set()
        assert sorted(await asyncio.gather(*calls)) == [0, 1, 2, 3, 4]
        assert link.requests.out == 0 and link.requests.waiting == 0

        async def now_async(x: int) -> int:
            return x

        a.add_service("late", now_async)  # no longer inline: b counts it again
        await wait_for(lambda: "late" not in link.inline_services)


@pytest.mark.timeout(60)
async def test_a_peer_without_the_inline_feature_is_not_sent_the_update() -> None:
    """INLINE_SERVICES is an envelope kind an older node does not know (it would close the
    connection): it goes only to peers whose HELLO had "rpc_inline"."""
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0") as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b,
    ):
        link = a._peers["b"].link
        assert link is not None and link.peer_takes_inline
        sent: list[Any] = []
        real = link.send_control
        link.send_control = lambda frames: sent.append(frames) or real(frames)  # type: ignore[method-assign]
        a.add_service("one", lambda x: x)
        assert len(sent) == 1
        link.peer_takes_inline = False  # as an older peer's HELLO leaves it
        a.add_service("two", lambda x: x)
        assert len(sent) == 1
        assert await b.request("a", "two", 3, timeout=5) == 3


def test_a_peers_inline_services_are_taken_only_as_advertised() -> None:
    """Malformed or oversized advertisements are ignored, name by name: what is left out is
    counted, which is always safe."""
    from aionet.codecs.batch import RPC_INLINE_MAX, RPC_INLINE_NAME_MAX
    from aionet.core.link import Link

    link = Link.__new__(Link)  # only the attribute under test
    for bad in (None, "ping", {"ping": 1}, 7, [1, 2]):
        link.set_inline_services(bad)
        assert link.inline_services == frozenset()
    link.set_inline_services(["ping", 3, "x" * (RPC_INLINE_NAME_MAX + 1), "pong"])
    assert link.inline_services == {"ping", "pong"}
    link.set_inline_services([f"s{i}" for i in range(RPC_INLINE_MAX + 10)])
    assert len(link.inline_services) == RPC_INLINE_MAX
