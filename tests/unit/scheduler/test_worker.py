"""The worker's attempt states fed by hand: accept, admit, run, finish, cancel, preempt order.
No node, no sockets, no sleeps (see fake_host.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from aionet.instrument import Instrument
from aionet.scheduler.instructions import Interrupt
from aionet.scheduler.state import InvalidTransition, Job, JobState
from aionet.scheduler.wire import R_REJECT, R_VALUE
from aionet.scheduler.worker import Worker

from .fake_host import FakeHost

J = JobState


class RecordingWorker(Worker):
    def __init__(self, host: FakeHost) -> None:
        super().__init__(host)  # type: ignore[arg-type]
        self.edges: list[tuple[int, JobState, JobState]] = []

    def _transition(self, job: Job, new: JobState) -> None:  # type: ignore[override]
        old = job.state
        super()._transition(job, new)
        self.edges.append((job.tid, old, new))

    def path(self, tid: int) -> list[JobState]:
        edges = [(a, b) for t, a, b in self.edges if t == tid]
        return [edges[0][0], *(b for _a, b in edges)] if edges else []


@pytest.fixture
def host() -> Iterator[FakeHost]:
    h = FakeHost("me", allow_modules=["tests.tasks_fns"])
    yield h
    h.loop.close()


def spec(tid: int, fn: str, args: list[Any], res: dict[str, float] | None = None, prio: int = 0) -> list[Any]:
    return [tid, fn, args, None, prio, res, 0, 0, None, 1, None, None, None]


def test_async_task_runs_through_its_states(host: FakeHost) -> None:
    w = RecordingWorker(host)
    w.start({"cpu": 2.0})
    w.accept("me", [spec(1, "tests.tasks_fns:async_add", [1, 2])], local=True)
    job = w.jobs[("me", 1)]
    assert job.state is J.RUNNING and job.task is not None
    host.loop.real.run_until_complete(job.task)
    host.loop.run_soon()  # the batched result goes to the local owner
    [item] = host.local_results
    assert item[:4] == [1, 1, R_VALUE, 3]
    assert w.path(1) == [J.FETCHING, J.QUEUED, J.RUNNING, J.FINISHED]
    assert not w.jobs and w.pool.free == {"cpu": 2.0}


def test_queued_behind_resources_then_cancelled(host: FakeHost) -> None:
    w = RecordingWorker(host)
    w.start({"cpu": 1.0})
    w.accept("me", [spec(1, "tests.tasks_fns:async_add", [1, 1]), spec(2, "tests.tasks_fns:async_add", [2, 2])], True)
    assert w.jobs[("me", 2)].state is J.QUEUED
    w.cancel("me", [2])
    assert w.path(2) == [J.FETCHING, J.QUEUED, J.FINISHED]
    task = w.async_running[("me", 1)].task
    assert w.cancel("me", [1]) == [Interrupt(task)]  # running async: interrupted, freed when its task ends
    task.cancel()  # what the service does with that instruction
    with pytest.raises(asyncio.CancelledError):
        host.loop.real.run_until_complete(task)
    assert w.path(1) == [J.FETCHING, J.QUEUED, J.RUNNING, J.FINISHED]
    assert w.pool.free == {"cpu": 1.0}


def test_refused_function_finishes_from_fetching(host: FakeHost) -> None:
    w = RecordingWorker(host)
    w.start({"cpu": 1.0})
    w.accept("me", [spec(1, "os:getcwd", [])], local=True)
    assert w.path(1) == [J.FETCHING, J.FINISHED] and w.stats().refused == 1


def test_task_that_cannot_fit_is_rejected_unqueued(host: FakeHost) -> None:
    w = RecordingWorker(host)
    w.start({"cpu": 1.0})
    w.accept("me", [spec(1, "tests.tasks_fns:async_add", [1, 1], res={"gpu": 1.0})], local=True)
    host.loop.run_soon()
    assert host.local_results[0][2] == R_REJECT and not w.edges


def test_illegal_edge_raises(host: FakeHost) -> None:
    w = RecordingWorker(host)
    w.start({"cpu": 1.0})
    job = Job("me", spec(1, "tests.tasks_fns:async_add", [1, 1]), local=True)
    with pytest.raises(InvalidTransition, match="fetching -> running"):
        w._transition(job, J.RUNNING)  # never admitted without being queued
    job.state = J.FINISHED
    with pytest.raises(InvalidTransition, match="finished -> queued"):
        w._transition(job, J.QUEUED)


def test_task_changed_hook_sees_every_transition_on_the_loop(host: FakeHost) -> None:
    """The ``task_changed`` instrument hook gets the same path the transition table checks."""
    seen: list[tuple[str, int, int, str, str, str]] = []

    class Rec(Instrument):
        def task_changed(self, owner: str, task_id: int, attempt: int, name: str, state: str, device: str) -> None:
            seen.append((owner, task_id, attempt, name, state, device))

    host.instruments.add(Rec())
    w = Worker(host)  # type: ignore[arg-type]
    w.start({"cpu": 1.0})
    w.accept("own", [spec(7, "tests.tasks_fns:async_add", [1, 2])], local=False)
    job = w.jobs[("own", 7)]
    host.loop.real.run_until_complete(job.task)
    host.loop.run_soon()
    assert [s[4] for s in seen] == ["queued", "running", "finished"]
    assert {s[:3] for s in seen} == {("own", 7, 1)}
    assert {s[5] for s in seen} == {"cpu"}  # asked no GPU


def test_task_changed_hook_names_the_gpus_a_task_was_given(host: FakeHost) -> None:
    """Traces put a GPU task on its GPU's row: the hook says which GPUs it holds once running."""
    seen: list[tuple[int, str, str]] = []

    class Rec(Instrument):
        def task_changed(self, owner: str, task_id: int, attempt: int, name: str, state: str, device: str) -> None:
            seen.append((task_id, state, device))

    host.instruments.add(Rec())
    w = Worker(host)  # type: ignore[arg-type]
    w.start({"cpu": 4.0, "gpu": 2.0})
    w.accept("own", [spec(1, "tests.tasks_fns:async_add", [1, 2], res={"gpu": 1.0})], local=False)
    w.accept("own", [spec(2, "tests.tasks_fns:async_add", [1, 2], res={"gpu": 1.0})], local=False)
    host.loop.real.run_until_complete(asyncio.gather(w.jobs[("own", 1)].task, w.jobs[("own", 2)].task))
    host.loop.run_soon()
    running = {tid: device for tid, state, device in seen if state == "running"}
    assert sorted(running.values()) == ["gpu:0", "gpu:1"]  # distinct GPUs, one each
    assert {device for _, state, device in seen if state == "queued"} == {"cpu"}  # none held yet
