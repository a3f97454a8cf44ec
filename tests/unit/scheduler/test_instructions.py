"""The owner's and worker's reactions return instructions: fed stimuli (results, duplicates,
deaths, checkpoints, reconciliation after a wrong death verdict) and asserted on what they ask
the service to do. No node, no sockets, no sleeps (see fake_host.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from aionet.scheduler import TaskLost
from aionet.scheduler.instructions import Announce, FailFuture, PostResult, Resolve, Resubmit, SendCtrl
from aionet.scheduler.owner import Owner
from aionet.scheduler.state import TaskState
from aionet.scheduler.wire import M_FREE, R_CKPT, R_HELD, R_LOST, R_VALUE, S_ATTEMPT, S_CKPT
from aionet.scheduler.worker import Worker

from .fake_host import FakeHost

T = TaskState
FN = "tests.tasks_fns:inc"


@pytest.fixture
def host() -> Iterator[FakeHost]:
    h = FakeHost("me", allow_modules=["tests.tasks_fns"])
    yield h
    h.loop.close()


def owner_with(host: FakeHost, *workers: str) -> Owner:
    o = Owner(host)  # type: ignore[arg-type]
    for w in workers:
        o.node_up(w, {"cpu": 4.0}, run_tasks=True)
    return o


def place(o: Owner, host: FakeHost, ref: Any) -> list[Any]:
    """Run the owner's pending placement; the spec it queued for the task's node."""
    host.loop.run_soon()
    rec = ref._rec
    assert rec.state is T.PLACED
    return next(s for s in o.outbox[rec.node] if s[0] == rec.tid)


def kinds(instrs: list[Any]) -> list[type]:
    return [type(i) for i in instrs]


def test_result_arrives_resolves_once(host: FakeHost) -> None:
    o = owner_with(host, "w1")
    ref = o.submit(FN, (1,), None)
    place(o, host, ref)
    out = o.on_results("w1", [[ref._rec.tid, 1, R_VALUE, 2, 0.001, 8]], None)
    assert out == [Resolve(ref._rec.fut)]
    assert not ref._rec.fut.done()  # decided, not done: the service resolves it
    host.perform(out)
    assert ref.done() and ref._rec.value == 2


def test_duplicate_result_is_dropped_and_a_held_copy_freed(host: FakeHost) -> None:
    o = owner_with(host, "w1", "w2")
    ref = o.submit(FN, (1,), None)
    place(o, host, ref)
    tid = ref._rec.tid
    host.perform(o.on_results(ref.node, [[tid, 1, R_VALUE, 2, 0.001, 8]], None))
    assert o.on_results("w1", [[tid, 1, R_VALUE, 3, 0.001, 8]], None) == []  # nothing resolves twice
    # a late held duplicate (an attempt wrongly presumed lost): the worker is told to drop it
    assert o.on_results("w2", [[tid, 2, R_HELD, None, 0.001, 1 << 20]], None) == [SendCtrl("w2", M_FREE, (tid,))]
    assert ref._rec.value == 2 and o.stats().duplicates_dropped == 2


def test_node_death_resubmits_up_to_retries_then_fails(host: FakeHost) -> None:
    o = owner_with(host, "w1", "w2", "w3")
    ref = o.submit(FN, (1,), None, retries=1)
    place(o, host, ref)
    first = ref.node
    out = o.node_dead(first, graceful=False)
    assert out == [Resubmit(ref._rec.tid, ref.id, 1, 0, f"node {first} died")]
    assert ref._rec.state is T.READY
    place(o, host, ref)
    second = ref.node
    assert second != first and ref.attempts == 2
    [fail] = o.node_dead(second, graceful=False)
    assert isinstance(fail, FailFuture) and isinstance(fail.exc, TaskLost) and fail.fut is ref._rec.fut
    assert "retries are used up" in str(fail.exc) and ref._rec.state is T.FAILED


def test_graceful_leave_does_not_count_against_retries(host: FakeHost) -> None:
    o = owner_with(host, "w1", "w2")
    ref = o.submit(FN, (1,), None, retries=0)
    place(o, host, ref)
    assert kinds(o.node_dead(ref.node, graceful=True)) == [Resubmit]
    assert ref._rec.retries == 0 and ref._rec.state is T.READY


def test_checkpoint_then_death_resumes_from_it(host: FakeHost) -> None:
    o = owner_with(host, "w1", "w2")
    ref = o.submit(FN, (1,), None, retries=2)
    place(o, host, ref)
    first = ref.node
    assert o.on_results(first, [[ref._rec.tid, 1, R_CKPT, {"step": 7}, 0.0, 0]], None) == []
    assert kinds(o.node_dead(first, graceful=False)) == [Resubmit]
    spec = place(o, host, ref)
    assert ref.node != first and spec[S_CKPT] == {"step": 7} and spec[S_ATTEMPT] == 2


# ---- reconciliation after a wrong death verdict (issue 13)


def test_announce_lists_sent_attempts_only(host: FakeHost) -> None:
    o = owner_with(host, "w1")
    a = o.submit(FN, (1,), None)
    place(o, host, a)
    o.specs_sent("w1")
    o.outbox["w1"] = []  # a's spec left
    b = o.submit(FN, (2,), None)
    place(o, host, b)  # b's spec is still in the outbox: not announced
    assert o.announce("w1", ask_back=True) == [Announce("w1", ((a._rec.tid, 1),), True)]
    assert o.announce("w9", ask_back=False) == []  # nothing runs there, nothing to ask


def test_worker_answers_lost_for_what_it_dropped() -> None:
    h = FakeHost("w1", allow_modules=["tests.tasks_fns"])
    try:
        w = Worker(h)  # type: ignore[arg-type]
        w.start({"cpu": 1.0})
        spec = [1, "tests.tasks_fns:async_add", [1, 1], None, 0, None, 0, 0, None, 1, None, None, None]
        queued = [*spec[:1], *spec[1:]]
        queued[0] = 2
        w.accept("d", [spec, queued], local=False)  # 1 runs, 2 waits for the cpu
        w.store[("d", 3)] = b"held"  # 3 finished, its large result kept here
        w.post("d", [4, 1, R_VALUE, 5, 0.0, 8])  # 4 finished, result not sent yet
        out = w.reconcile("d", [[1, 1], [2, 1], [3, 1], [4, 1], [5, 1], [6, 2]])
        assert out == [
            PostResult("d", [5, 1, R_LOST, "not on node w1", 0.0, 0]),
            PostResult("d", [6, 2, R_LOST, "not on node w1", 0.0, 0]),
        ]
        # the owner taken for dead: everything of it dropped, so all of it is lost
        [interrupt] = w.peer_dead("d")
        # still winding down, but cancelled: it will report nothing, so it counts as lost
        assert len(w.reconcile("d", [[1, 1], [2, 1], [3, 1]])) == 3
        interrupt.task.cancel()  # type: ignore[union-attr]
        h.loop.real.run_until_complete(asyncio.gather(interrupt.task, return_exceptions=True))  # type: ignore[union-attr]
    finally:
        h.loop.close()


def test_lost_attempt_is_resubmitted_and_only_the_current_attempt_counts(host: FakeHost) -> None:
    o = owner_with(host, "w1", "w2")
    ref = o.submit(FN, (1,), None, retries=1)
    place(o, host, ref)
    where, tid = ref.node, ref._rec.tid
    assert o.on_results(where, [[tid, 7, R_LOST, "gone", 0.0, 0]], None) == []  # not the current attempt
    out = o.on_results(where, [[tid, 1, R_LOST, "not on node x", 0.0, 0]], None)
    assert kinds(out) == [Resubmit] and ref._rec.state is T.READY
    assert o.stats().reconciled_lost == 1
    assert o.on_results(where, [[tid, 1, R_LOST, "again", 0.0, 0]], None) == []  # answered once
    place(o, host, ref)
    # the dropped attempt's result turns up after all: the first completion wins, once
    out = o.on_results(where, [[tid, 1, R_VALUE, 2, 0.0, 8]], None)
    assert out[0] == Resolve(ref._rec.fut)
    host.perform(out)
    assert o.on_results(ref.node, [[tid, 2, R_VALUE, 2, 0.0, 8]], None) == []


def test_lost_with_no_retries_left_fails_typed(host: FakeHost) -> None:
    o = owner_with(host, "w1")
    ref = o.submit(FN, (1,), None, retries=0)
    place(o, host, ref)
    [fail] = o.on_results("w1", [[ref._rec.tid, 1, R_LOST, "not on node w1", 0.0, 0]], None)
    assert isinstance(fail, FailFuture) and isinstance(fail.exc, TaskLost)
