"""Stopping a node, as a user does it: from anywhere (twice at once, from a handler, while it
still starts), and what it leaves behind once ``stop()`` returns: no task of its own, no
sidecar process, and a node that refuses further work with a typed error."""

from __future__ import annotations

import asyncio
import os

import pytest

from aionet import Node, NodeClosed, PeerUnavailable, RemoteError
from aionet.cache import CacheError
from aionet.cache.wire import LOCK_PREFIX
from aionet.config import Config
from aionet.testing import FaultProxy
from tests.conftest import wait_for


def children() -> set[int]:
    """Live child processes of this test process (a node's liveness responder is one)."""
    me, out = str(os.getpid()), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except OSError:
            continue
        if ppid == me and state != "Z":
            out.add(int(pid))
    return out


def stray(before: set[asyncio.Task]) -> list[str]:
    """Names of the tasks running now that were not running at ``before`` (the test's own aside)."""
    me = asyncio.current_task()
    return sorted(t.get_name() for t in asyncio.all_tasks() - before if t is not me and not t.done())


def hold(obj: object, name: str) -> tuple[asyncio.Event, asyncio.Event]:
    """Replace the coroutine method ``obj.name`` by one that sets ``reached`` and waits for
    ``gate`` before it runs the original: a node held at that step."""
    reached, gate = asyncio.Event(), asyncio.Event()
    original = getattr(obj, name)

    async def held(*args: object, **kwargs: object) -> object:
        reached.set()
        await gate.wait()
        return await original(*args, **kwargs)

    setattr(obj, name, held)
    return reached, gate


async def stop_during_start(e: Node, reached: asyncio.Event, gate: asyncio.Event) -> None:
    """Start ``e``, stop it once its start has ``reached`` a step held at ``gate``, then let
    that step go on: the start must have ended with NodeClosed (not gone on to start more).
    The stop is prompt: nothing waits for the handlers' grace (5 s) for a start that ended."""
    starting = asyncio.ensure_future(e.start())
    await asyncio.wait_for(reached.wait(), 20)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await e.stop()
    took = loop.time() - t0
    gate.set()  # a start the stop did not end would go on from here
    with pytest.raises(NodeClosed, match="stopped while starting"):
        await asyncio.wait_for(starting, 20)
    assert took < 3
    with pytest.raises(PeerUnavailable, match="not running"):
        await e.request("e", "aionet.echo", 1)


@pytest.mark.timeout(60)
async def test_stop_while_start_is_starting_the_services_ends_the_start_and_leaves_nothing() -> None:
    """A stop() while start() is under way (joined, membership up, the scheduler starting)
    ends the start with NodeClosed, and no service starts after the stop. (The start went on
    after the stop, starting the scheduler and the cache: their tasks ran for good, and a
    second stop() did nothing.)"""
    before, kids = asyncio.all_tasks(), children()
    async with Node(name="seed", listen="tcp://127.0.0.1:0") as seed:
        seed_kids = children() - kids
        e = Node(name="e", listen="tcp://127.0.0.1:0", join=[seed.address])
        reached, gate = hold(e.scheduler, "start")
        await stop_during_start(e, reached, gate)
        assert children() - kids == seed_kids  # e's liveness sidecar is gone
    assert stray(before) == []
    assert children() == kids


@pytest.mark.timeout(60)
async def test_stop_while_the_liveness_sidecar_starts_leaves_no_sidecar(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop() that lands while membership starts the liveness sidecar (a child process)
    kills it: it was left running, unowned, after the node stopped."""
    from aionet.membership.liveness import Responder

    before, kids = asyncio.all_tasks(), children()
    async with Node(name="seed", listen="tcp://127.0.0.1:0") as seed:
        seed_kids = children() - kids
        e = Node(name="e", listen="tcp://127.0.0.1:0", join=[seed.address])
        reached, gate = asyncio.Event(), asyncio.Event()
        start_responder = Responder.start

        async def held_start(self: Responder, timeout: float = 10.0) -> None:
            await start_responder(self, timeout)
            reached.set()  # the sidecar runs; its start has not returned yet
            await gate.wait()

        monkeypatch.setattr(Responder, "start", held_start)
        await stop_during_start(e, reached, gate)
        assert children() - kids == seed_kids
    assert stray(before) == []
    assert children() == kids


@pytest.mark.timeout(60)
async def test_stop_while_start_waits_for_an_unreachable_seed_ends_it_at_once() -> None:
    """start() retries its seeds for up to node.join_timeout; a stop meanwhile ends it then."""
    cfg = Config.from_dict({"node": {"join_timeout": 120.0}}, env={})
    before = asyncio.all_tasks()
    e = Node(name="e", listen="tcp://127.0.0.1:0", join=["tcp://127.0.0.1:9"], config=cfg)
    starting = asyncio.ensure_future(e.start())
    await wait_for(lambda: bool(e.addresses))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await e.stop()
    with pytest.raises(NodeClosed):
        await asyncio.wait_for(starting, 10)
    assert loop.time() - t0 < 10
    assert stray(before) == []


@pytest.mark.timeout(60)
async def test_a_second_stop_returns_once_the_node_has_stopped() -> None:
    """Two stop() at once: neither returns before the node has stopped (the second used to
    return at once, with the node still running)."""
    before = asyncio.all_tasks()
    a = Node(name="a", listen="tcp://127.0.0.1:0")
    await a.start()
    first = asyncio.ensure_future(a.stop())
    await wait_for(lambda: a._stopping is not None)  # the first stop has begun
    await a.stop()
    with pytest.raises(PeerUnavailable, match="not running"):
        await a.request("a", "aionet.echo", 1)
    await first
    assert stray(before) == []


@pytest.mark.timeout(60)
async def test_stop_from_a_handler_answers_the_caller_and_stops_the_node_for_good() -> None:
    """A handler that stops its own node (a "shutdown" service) begins the stop and answers
    its caller before the stop's grace runs out; the stop goes on to the end. (It used to
    wait on itself for the whole grace, be cancelled by the stop, and take the rest of the
    stop with it: links left open, the node's tasks running, every later stop() a no-op.)"""
    before, kids = asyncio.all_tasks(), children()
    async with Node(name="b", listen="tcp://127.0.0.1:0") as b:
        b_kids = children() - kids
        a = Node(name="a", listen="tcp://127.0.0.1:0", join=[b.address])
        await a.start()

        async def shutdown(_arg: object) -> str:
            await a.stop(grace=30.0)
            return "stopping"

        a.add_service("shutdown", shutdown)
        assert await b.request("a", "shutdown", None, timeout=10) == "stopping"
        await a.stop()  # returns when the stop the handler began has ended
        with pytest.raises(PeerUnavailable, match="not running"):
            await a.request("a", "aionet.echo", 1)
        await wait_for(lambda: not b.peers().get("a", {}).get("connected"))
        assert children() - kids == b_kids
    assert stray(before) == []
    assert children() == kids


@pytest.mark.timeout(60)
async def test_a_stop_whose_caller_gives_up_still_stops_the_node() -> None:
    """``asyncio.wait_for(node.stop(), t)`` running out (or its caller cancelled) leaves the
    stop running to the end. (It cut the stop short mid-drain: the node kept its links and
    tasks, and every later stop() returned at once.)"""
    before, kids = asyncio.all_tasks(), children()
    async with Node(name="b", listen="tcp://127.0.0.1:0") as b:
        b_kids = children() - kids
        a = Node(name="a", listen="tcp://127.0.0.1:0", join=[b.address])
        await a.start()
        started = asyncio.Event()

        async def held(_arg: object) -> None:
            started.set()
            await asyncio.sleep(30)

        a.add_service("held", held)
        call = asyncio.ensure_future(b.request("a", "held", None))
        await asyncio.wait_for(started.wait(), 10)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(a.stop(grace=0.5), 0.05)  # gives up during the grace
        await a.stop()
        with pytest.raises(RemoteError, match="shutting down"):
            await call
        await wait_for(lambda: not b.peers().get("a", {}).get("connected"))
        assert children() - kids == b_kids
    assert stray(before) == []
    assert children() == kids


@pytest.mark.timeout(60)
async def test_a_stopped_node_cannot_be_started_again() -> None:
    """start() on a stopped node raises NodeClosed. (It ran the services again on a node whose
    mailboxes were closed, their tasks failing, and a later stop() did nothing: tasks and the
    liveness sidecar ran on for good.)"""
    before, kids = asyncio.all_tasks(), children()
    a = Node(name="a", listen="tcp://127.0.0.1:0")
    await a.start()
    await a.stop()
    with pytest.raises(NodeClosed, match="starts once"):
        await a.start()
    await a.stop()
    assert stray(before) == []
    assert children() == kids


def primary_of(node: Node, key: str, want: str) -> str:
    """A key like ``key`` (``key`` plus a number) whose primary at ``node`` is ``want``."""
    return next(k for i in range(1000) if node.cache.owners(k := f"{key}{i}")[0] == want)


def lock_on(node: Node, want: str) -> str:
    """A lock name whose primary at ``node`` is ``want``."""
    placement = node.cache.service.placement
    return next(n for i in range(1000) if placement.primary(LOCK_PREFIX + (n := f"lock{i}")) == want)


@pytest.mark.timeout(60)
async def test_the_cache_of_a_stopped_node_refuses_writes_locks_and_reads_at_once() -> None:
    """Once its node stopped, the cache raises CacheError at once: a write or lock this node
    was the primary of used to succeed into a store nobody sees (a lock granted to two
    holders), and one at another primary to retry for cache.request_timeout (10 s) first. A read
    of a key it held a copy of used to return that copy, which nothing updates any more."""
    cfg = Config.from_dict({"cache": {"request_timeout": 30.0}}, env={})
    async with Node(name="b", listen="tcp://127.0.0.1:0", config=cfg) as b:
        a = Node(name="a", listen="tcp://127.0.0.1:0", join=[b.address], config=cfg)
        await a.start()
        await a.wait_members(2, 10)
        await wait_for(lambda: a.cache.owners("x") != ("a",) and a.cache.owners("x") != ("b",))
        mine, theirs = primary_of(a, "k", "a"), primary_of(a, "k", "b")
        mine_lock, their_lock = lock_on(a, "a"), lock_on(a, "b")
        await b.cache.put("held", 1)
        assert "a" in a.cache.owners("held")  # two nodes: each holds every key
        await wait_for(lambda: a.cache.stats()["entries"] >= 1)
        assert await a.cache.get("held") == 1  # the local copy, while running
        await a.stop()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for key in (mine, theirs):
            with pytest.raises(CacheError, match="stopped"):
                await a.cache.put(key, 1)
        for name in (mine_lock, their_lock):
            with pytest.raises(CacheError, match="stopped"):
                async with a.lock(name, ttl=5):
                    pass
        with pytest.raises(CacheError, match="stopped"):
            await a.cache.get(primary_of(b, "absent", "b"))
        with pytest.raises(CacheError, match="stopped"):
            await a.cache.get("held")
        with pytest.raises(CacheError, match="stopped"):
            await a.cache.get_versioned("held")
        assert loop.time() - t0 < 5
        async with b.lock(mine_lock, ttl=5):  # the stopped node holds no lock
            pass


@pytest.mark.timeout(60)
async def test_waits_on_membership_workers_and_the_cache_end_when_the_node_stops() -> None:
    """wait_members and wait_workers (without a timeout) raise NodeClosed when the node
    stops, or has stopped, instead of an untyped StopAsyncIteration or waiting for good;
    event and watch streams made after the stop end at once."""
    before = asyncio.all_tasks()
    a = Node(name="a", listen="tcp://127.0.0.1:0")
    await a.start()
    members = asyncio.ensure_future(a.wait_members(2))
    workers = asyncio.ensure_future(a.wait_workers(2))
    await asyncio.sleep(0)  # (they wait)
    await a.stop()
    for waiting in (members, workers):
        with pytest.raises(NodeClosed, match="stopped"):
            await asyncio.wait_for(waiting, 5)
    with pytest.raises(NodeClosed, match="stopped"):
        await asyncio.wait_for(a.wait_members(2), 5)
    with pytest.raises(NodeClosed, match="stopped"):
        await asyncio.wait_for(a.wait_workers(2), 5)
    assert [ev async for ev in a.member_events()] == []
    assert [ch async for ch in a.cache.watch("")] == []
    assert stray(before) == []


@pytest.mark.timeout(60)
async def test_a_dial_under_way_when_the_node_stops_opens_no_link() -> None:
    """connect() from a stopped node raises PeerUnavailable; one whose handshake was under way
    when the node stopped does too, instead of opening a link from the stopped node (which
    stayed connected, and its peer saw it connected)."""
    async with Node(name="b", listen="tcp://127.0.0.1:0") as b, FaultProxy.to(b.addresses[0]) as pb:
        a = Node(name="a", listen="tcp://127.0.0.1:0")
        await a.start()
        pb.stall(True)
        dialing = asyncio.ensure_future(a.connect(pb.address))
        await wait_for(lambda: pb.active > 0)
        await a.stop()
        pb.stall(False)
        with pytest.raises(PeerUnavailable, match="not running"):
            await asyncio.wait_for(dialing, 10)
        with pytest.raises(PeerUnavailable, match="not running"):
            await a.connect(b.address)
        assert not a.peers().get("b", {}).get("connected")
        # b learns of the abandoned handshake when its connection closes: a loop step or two
        # later on Python 3.12's asyncio, within the same one on 3.11
        await wait_for(lambda: not b.peers().get("a", {}).get("connected"), timeout=5)


@pytest.mark.timeout(60)
async def test_a_stop_begun_by_a_handler_that_fails_is_logged_not_left_unretrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nobody may wait for a stop a handler began: if it fails, the node logs it (the suite's
    loop-error guard fails this test on a "Task exception was never retrieved" instead)."""
    async with Node(name="b", listen="tcp://127.0.0.1:0") as b:
        a = Node(name="a", listen="tcp://127.0.0.1:0", join=[b.address])
        await a.start()
        aclose = a.transports.aclose

        async def broken() -> None:
            await aclose()
            raise RuntimeError("transport close broke")

        a.transports.aclose = broken  # type: ignore[method-assign]

        async def shutdown(_arg: object) -> str:
            await a.stop()
            return "stopping"

        a.add_service("shutdown", shutdown)
        assert await b.request("a", "shutdown", None, timeout=10) == "stopping"
        await wait_for(lambda: a._stopping is not None and a._stopping.done())
        assert "stop failed" in caplog.text and "transport close broke" in caplog.text


@pytest.mark.timeout(60)
async def test_a_goodbye_that_never_ends_is_ended_by_the_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """stop() says BYE to each peer and waits up to 2 s for the ack; a goodbye still under way
    then was left running, owned by nobody. Here one never ends by itself: the stop must end it
    (and await it) before it returns."""
    from aionet.core import peers

    stuck = asyncio.Event()

    async def never_acked(_link: object) -> None:
        stuck.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(peers, "_say_bye", never_acked)
    async with Node(name="b", listen="tcp://127.0.0.1:0") as b:
        a = Node(name="a", listen="tcp://127.0.0.1:0", join=[b.address])
        await a.start()
        await a.stop()
        assert stuck.is_set()
        left = [t for t in asyncio.all_tasks() if "never_acked" in repr(t.get_coro())]
        assert left == [], left


@pytest.mark.timeout(60)
async def test_a_stopping_node_refuses_handshakes_and_the_dialer_opens_no_link() -> None:
    """A node that has begun stopping (here: while its leave is announced, before its listeners
    close) used to complete a dialer's handshake and close the connection right after. The dialer
    had opened a fresh link by then: to a node its membership may already call dead, a live link
    that took requests and timed them out instead of failing them. It now answers with a
    retryable reject, and the dialer keeps no link to it."""
    from aionet.errors import HandshakeError

    async with Node(name="c", listen="tcp://127.0.0.1:0") as c:
        b = Node(name="b", listen="tcp://127.0.0.1:0")
        await b.start()
        reached, gate = hold(b.membership, "stop")
        stopping = asyncio.ensure_future(b.stop())
        try:
            await asyncio.wait_for(reached.wait(), 20)
            assert b.addresses  # still listening: the window this test is about
            with pytest.raises(HandshakeError, match="the node is stopping"):
                await asyncio.wait_for(c._connector.dial(b.address), 20)
            peer = c._peers.get("b")
            assert peer is None or peer.link is None, "a link to a stopping node was opened"
        finally:
            gate.set()
            await asyncio.wait_for(stopping, 30)
