"""Router.on_cancel fed directly: the handler task of a request whose caller gave up is
cancelled, and the peer's handler slot is freed even when the cancel comes before the task
ever ran (its REQ and CANCEL in one read), when the handler already answered, or twice."""

from __future__ import annotations

import asyncio
import gc
import logging
import warnings
from typing import Any

import pytest

from aionet.codecs.envelope import ERR, REP
from aionet.config import Config
from aionet.core.ports import inline_handler
from aionet.core.router import Router
from aionet.core.tasks import EAGER_TASKS


def make() -> tuple[Router, list[tuple[int, list[Any]]]]:
    router = Router("a", Config.from_dict({}, env={}).link, logging.getLogger("test"))
    sent: list[tuple[int, list[Any]]] = []

    def reply(kind: int, fields: list[Any]) -> None:
        sent.append((kind, fields))

    return router, sent


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.timeout(10)
@pytest.mark.skipif(EAGER_TASKS, reason="Python 3.12+: handler tasks start eagerly, so one always ran before a CANCEL")
async def test_a_cancel_before_the_task_ran_frees_the_slot() -> None:
    router, sent = make()
    ran: list[int] = []

    async def handler(x: int) -> int:
        ran.append(x)
        return x

    router.add_service("h", handler)
    reply = lambda kind, fields: sent.append((kind, fields))  # noqa: E731
    assert router.on_request(1, "h", 5, reply, "b") is None
    assert router.running == {"b": 1} and len(router.tasks) == 1 and ("b", 1) in router.handling
    router.on_cancel(1, "b")  # same loop iteration: the task has not started
    await settle()
    assert ran == [] and sent == []  # never ran, nothing answered (the caller is gone)
    assert router.running == {} and router.tasks == set() and router.handling == {}


@pytest.mark.timeout(10)
async def test_a_cancel_while_the_handler_waits_cancels_it_and_sends_nothing() -> None:
    router, sent = make()
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(x: int) -> int:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return x

    router.add_service("h", handler)
    router.on_request(7, "h", 0, lambda k, f: sent.append((k, f)), "b")
    await asyncio.wait_for(started.wait(), 5)
    router.on_cancel(7, "b")
    router.on_cancel(7, "b")  # twice: the second finds nothing
    await asyncio.wait_for(cancelled.wait(), 5)
    await settle()
    assert sent == []
    assert router.running == {} and router.tasks == set() and router.handling == {}


@pytest.mark.timeout(10)
async def test_a_cancel_from_another_peer_or_after_the_answer_changes_nothing() -> None:
    router, sent = make()
    release = asyncio.Event()

    async def handler(x: int) -> int:
        await release.wait()
        return x

    router.add_service("h", handler)
    router.on_request(3, "h", 30, lambda k, f: sent.append((k, f)), "b")
    await settle()
    router.on_cancel(3, "c")  # same request id, another peer's: not this one
    router.on_cancel(99, "b")  # an id never seen
    release.set()
    await settle()
    assert sent == [(REP, [3, 30])]
    router.on_cancel(3, "b")  # after the answer
    await settle()
    assert sent == [(REP, [3, 30])] and router.running == {} and router.handling == {}


@pytest.mark.timeout(10)
async def test_a_handler_that_raises_cancelled_error_itself_still_answers() -> None:
    """Only a caller's cancel goes unanswered: a handler that raises CancelledError on its own
    is reported to the caller as before."""
    router, sent = make()

    async def handler(x: int) -> int:
        raise asyncio.CancelledError

    router.add_service("h", handler)
    router.on_request(4, "h", 0, lambda k, f: sent.append((k, f)), "b")
    await settle()
    assert [k for k, _ in sent] == [ERR] and sent[0][1][1] == "asyncio.CancelledError"
    assert router.running == {} and router.handling == {}


@pytest.mark.timeout(10)
async def test_a_service_that_is_not_cancellable_ignores_the_cancel_and_still_reports_its_errors() -> None:
    router, sent = make()
    release = asyncio.Event()

    async def slow(x: int) -> int:
        await release.wait()
        return x

    async def raises(x: int) -> int:
        raise asyncio.CancelledError

    router.add_service("slow", slow, cancellable=False)
    router.add_service("raises", raises, cancellable=False)
    router.on_request(5, "slow", 50, lambda k, f: sent.append((k, f)), "b")
    router.on_request(6, "raises", 0, lambda k, f: sent.append((k, f)), "b")
    await settle()
    router.on_cancel(5, "b")
    release.set()
    await settle()
    assert (REP, [5, 50]) in sent  # ran to the end despite the cancel
    errs = [f for k, f in sent if k == ERR]
    assert len(sent) == 2 and errs[0][:2] == [6, "asyncio.CancelledError"]  # its own CancelledError told
    assert router.running == {} and router.handling == {}


@pytest.mark.timeout(10)
async def test_every_request_whose_deadline_passes_is_reported_abandoned() -> None:
    """The deadline timer tells the node's hook (which sends the cancels) about each request
    it fails, once."""
    router, _sent = make()
    router.bind_loop(asyncio.get_running_loop())
    told: list[int] = []

    def hook(peer: str, rid: int) -> None:
        told.append(rid)

    router.abandoned = hook
    futs = [router.new_request("b", "s", timeout=0.01)[1] for _ in range(3)]
    for f in futs:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(f, 5)
    assert sorted(told) == [1, 2, 3] and router.pending == {}


@pytest.mark.timeout(10)
async def test_nothing_starts_once_the_router_drains() -> None:
    """A request read while the node stops (drain began) is answered "node shutting down" at
    once: an async handler, or an inline one's coroutine, started then would outlive the node."""
    router, sent = make()
    ran: list[str] = []

    async def slow(x: int) -> int:
        ran.append("slow")
        return x

    async def rest(x: int) -> int:
        ran.append("inline rest")
        return x

    @inline_handler
    def inline(x: int) -> Any:
        return rest(x)  # must wait: a coroutine

    router.add_service("slow", slow)
    router.add_service("inline", inline)
    await router.drain(0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would be one
        router.on_request(1, "slow", 1, lambda k, f: sent.append((k, f)), "b")
        router.on_request(2, "inline", 2, lambda k, f: sent.append((k, f)), "b")
        gc.collect()
    await settle()
    assert ran == [] and router.tasks == set() and router.running == {}
    assert [(k, f[0], f[1], f[2]) for k, f in sent] == [
        (ERR, 1, "asyncio.CancelledError", "handler cancelled (node shutting down)"),
        (ERR, 2, "asyncio.CancelledError", "handler cancelled (node shutting down)"),
    ]


@pytest.mark.timeout(10)
async def test_requests_over_the_bound_wait_in_order_and_a_cancel_or_a_stop_ends_them() -> None:
    """Over ``max_concurrent_requests`` a request waits (up to as many again) instead of making
    the reader stop: it starts, in arrival order, as a handler ends; its caller's CANCEL forgets
    it unstarted; a stop answers "node shutting down" for it; past the waiting room the reader
    stops (a future to await) until a request starts."""
    router = Router(
        "a", Config.from_dict({"link": {"max_concurrent_requests": 2}}, env={}).link, logging.getLogger("t")
    )
    sent: list[tuple[int, list[Any]]] = []
    reply = lambda kind, fields: sent.append((kind, fields))  # noqa: E731
    gate = asyncio.Event()
    order: list[int] = []

    async def held(x: int) -> int:
        order.append(x)
        await gate.wait()
        return x

    router.add_service("h", held)
    for rid in range(1, 5):
        assert router.on_request(rid, "h", rid, reply, "b") is None
    assert router.running == {"b": 2} and list(router.waiting["b"]) == [3, 4]
    stop = router.on_request(5, "h", 5, reply, "b")
    assert isinstance(stop, asyncio.Future) and not stop.done()  # waiting room full: stop reading
    router.on_cancel(3, "b")  # never started: forgotten, no answer
    assert list(router.waiting["b"]) == [4] and stop.done()  # room again: read on
    assert router.on_request(5, "h", 5, reply, "b") is None  # handed in again: waits
    await settle()
    assert order == [1, 2]
    router.on_cancel(1, "b")  # a running one: cancelled; the oldest waiting one starts
    await settle()
    assert order == [1, 2, 4] and list(router.waiting["b"]) == [5]
    await router.drain(0.01)  # the stop: running handlers cancelled, waiting ones answered
    await settle()
    assert order == [1, 2, 4] and router.waiting == {} and router.running == {}
    answers = {f[0]: f[2] for k, f in sent if k == ERR}
    assert answers[5] == "handler cancelled (node shutting down)" and 3 not in answers and 1 not in answers


def test_the_services_advertised_as_inline_are_the_plain_def_ones_aionets_first() -> None:
    """Handshake feature rpc_inline: callers skip the window for these, so it must list only
    handlers that never take a slot (not async, not inline_handler, which may continue as a
    task), keep aionet's own within the cap, and stay within the cap."""
    from aionet.codecs.batch import RPC_INLINE_MAX

    router = Router("a", Config.from_dict({}, env={}).link, logging.getLogger("test"))

    async def slow(x: object) -> object:
        return x

    router.add_service("slow", slow)
    router.add_service("maybe", inline_handler(lambda x: x))
    for i in range(RPC_INLINE_MAX + 5):
        router.add_service(f"a{i:04d}", lambda x: x)
    router.add_service("aionet.echo", lambda x: x)
    names = router.inline_services()
    assert len(names) == RPC_INLINE_MAX and names[0] == "aionet.echo"
    assert "slow" not in names and "maybe" not in names
    assert names[1:] == sorted(names[1:])
