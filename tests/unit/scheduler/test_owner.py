"""The owner's state machine fed by hand: submissions, placements, results, node deaths.
No node, no sockets, no sleeps (see fake_host.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from aionet.scheduler import TaskFailed, TaskLost
from aionet.scheduler.owner import Owner
from aionet.scheduler.state import InvalidTransition, Rec, TaskState
from aionet.scheduler.wire import R_ERROR, R_HELD, R_MOVED, R_REJECT, R_VALUE

from .fake_host import FakeHost

T = TaskState
FN = "tests.tasks_fns:inc"


class RecordingOwner(Owner):
    """Records every transition (task name, from, to)."""

    def __init__(self, host: FakeHost) -> None:
        super().__init__(host)  # type: ignore[arg-type]
        self.edges: list[tuple[str, TaskState, TaskState]] = []

    def _transition(self, rec: Rec, new: TaskState) -> None:  # type: ignore[override]
        old = rec.state
        super()._transition(rec, new)
        self.edges.append((rec.name, old, new))

    def path(self, name: str) -> list[TaskState]:
        edges = [(a, b) for n, a, b in self.edges if n == name]
        return [edges[0][0], *(b for _a, b in edges)] if edges else []


@pytest.fixture
def host() -> Iterator[FakeHost]:
    h = FakeHost("me")
    yield h
    h.loop.close()


def owner_with(host: FakeHost, *workers: str) -> RecordingOwner:
    o = RecordingOwner(host)
    for w in workers:
        o.node_up(w, {"cpu": 4.0}, run_tasks=True)
    return o


def placed(o: Owner, host: FakeHost, ref: Any) -> list[Any]:
    """Run the owner's pending placement; the spec it queued for the task's node."""
    host.loop.run_soon()
    rec = ref._rec
    assert rec.state is T.PLACED
    return next(s for s in o.outbox[rec.node] if s[0] == rec.tid)


def test_ran(host: FakeHost) -> None:
    o = owner_with(host, "w1")
    ref = o.submit(FN, (1,), None)
    spec = placed(o, host, ref)
    assert host.spec_sends == ["w1"] and spec[1] == FN
    host.perform(o.on_results("w1", [[ref._rec.tid, 1, R_VALUE, 2, 0.001, 8]], None))
    assert ref.done() and ref._rec.value == 2 and ref._rec.state_name == "done"
    assert o.path(ref.id) == [T.WAITING, T.READY, T.PLACED, T.DONE]
    # a late duplicate (an old attempt) is dropped: no second completion
    host.perform(o.on_results("w1", [[ref._rec.tid, 1, R_VALUE, 3, 0.001, 8]], None))
    assert ref._rec.value == 2 and o.stats().duplicates_dropped == 1


def test_failed(host: FakeHost) -> None:
    o = owner_with(host, "w1")
    ref = o.submit(FN, (1,), None)
    placed(o, host, ref)
    host.perform(o.on_results("w1", [[ref._rec.tid, 1, R_ERROR, ["ValueError", "boom", ""], 0.001, 0]], None))
    assert isinstance(ref._rec.fut.exception(), TaskFailed)
    assert o.path(ref.id) == [T.WAITING, T.READY, T.PLACED, T.FAILED]


def test_retried_after_node_death(host: FakeHost) -> None:
    o = owner_with(host, "w1")
    ref = o.submit(FN, (1,), None, retries=1)
    placed(o, host, ref)
    host.perform(o.node_dead("w1", graceful=False))
    assert ref._rec.state is T.READY and ref._rec.retries == 0
    o.node_up("w2", {"cpu": 4.0}, run_tasks=True)
    placed(o, host, ref)
    assert ref.node == "w2" and ref.attempts == 2
    host.perform(o.on_results("w2", [[ref._rec.tid, 2, R_VALUE, 2, 0.001, 8]], None))
    assert o.path(ref.id) == [T.WAITING, T.READY, T.PLACED, T.READY, T.PLACED, T.DONE]


def test_lost_when_retries_are_used_up(host: FakeHost) -> None:
    o = owner_with(host, "w1")
    ref = o.submit(FN, (1,), None, retries=0)
    placed(o, host, ref)
    host.perform(o.node_dead("w1", graceful=False))
    assert isinstance(ref._rec.fut.exception(), TaskLost)
    assert o.path(ref.id) == [T.WAITING, T.READY, T.PLACED, T.FAILED]


def test_steals_by_a_node_declared_dead_do_not_use_up_retries(host: FakeHost) -> None:
    # w2 is dead to this owner but still alive (a false suspicion): it keeps stealing the task
    # from w1's queue. Each move places it again; none is a death of a node it ran on.
    o = owner_with(host, "w1", "w2")
    ref = o.submit(FN, (1,), None, retries=0, affinity="w1")
    placed(o, host, ref)
    host.perform(o.node_dead("w2", graceful=False))
    for _ in range(5):
        attempt = ref.attempts
        host.perform(o.on_results("w1", [[ref._rec.tid, attempt, R_MOVED, "w2", 0.0, 0]], None))
        assert not ref._rec.fut.done(), "a steal by a dead node lost the task"
        placed(o, host, ref)
        assert ref.node == "w1" and ref.attempts == attempt + 1
    host.perform(o.on_results("w1", [[ref._rec.tid, ref.attempts, R_VALUE, 2, 0.001, 8]], None))
    assert ref._rec.value == 2 and o.stats().resubmitted == 5


def test_rejected_task_is_placed_elsewhere(host: FakeHost) -> None:
    o = owner_with(host, "w1", "w2")
    ref = o.submit(FN, (1,), None, affinity=None)
    placed(o, host, ref)
    first = ref.node
    host.perform(o.on_results(first, [[ref._rec.tid, 1, R_REJECT, "no", 0.0, 0]], None))
    assert ref._rec.state is T.READY and ref.attempts == 0
    placed(o, host, ref)
    assert ref.node != first


def test_held_result_lost_with_its_node_is_recomputed(host: FakeHost) -> None:
    o = owner_with(host, "w1", "w2")
    ref = o.submit(FN, (1,), None, retries=1)
    placed(o, host, ref)
    where = ref.node
    host.perform(o.on_results(where, [[ref._rec.tid, 1, R_HELD, None, 0.001, 1 << 20]], None))
    assert ref._rec.state is T.DONE and ref._rec.holder == where
    host.perform(o.node_dead(where, graceful=False))
    assert ref._rec.state is T.READY and not ref._rec.fut.done()
    placed(o, host, ref)
    assert o.path(ref.id)[-3:] == [T.DONE, T.READY, T.PLACED]


def test_dependent_waits_then_runs(host: FakeHost) -> None:
    o = owner_with(host, "w1")
    a = o.submit(FN, (1,), None)
    b = o.submit(FN, (a,), None)
    assert b._rec.state is T.WAITING
    placed(o, host, a)
    assert b._rec.state is T.WAITING
    host.perform(o.on_results("w1", [[a._rec.tid, 1, R_VALUE, 2, 0.001, 8]], None))
    assert b._rec.state is T.READY
    placed(o, host, b)


def test_cancel_then_no_way_back(host: FakeHost) -> None:
    o = owner_with(host, "w1")
    ref = o.submit(FN, (1,), None)
    assert ref.cancel()
    assert o.path(ref.id) == [T.WAITING, T.READY, T.CANCELLED]
    host.loop.run_soon()  # the stale queue entry is skipped, not placed
    assert ref._rec.state is T.CANCELLED and not o.outbox


def test_illegal_edge_raises(host: FakeHost) -> None:
    o = owner_with(host, "w1")
    ref = o.submit(FN, (1,), None)
    with pytest.raises(InvalidTransition, match="ready -> done"):
        o._transition(ref._rec, T.DONE)  # done without ever being placed
    assert ref._rec.state is T.READY  # refused edges change nothing
    placed(o, host, ref)
    host.perform(o.on_results("w1", [[ref._rec.tid, 1, R_ERROR, ["E", "x", ""], 0.0, 0]], None))
    with pytest.raises(InvalidTransition, match="failed -> ready"):
        o._transition(ref._rec, T.READY)
