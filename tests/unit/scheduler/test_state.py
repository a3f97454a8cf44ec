"""The transition tables on their own: every legal life of a task is a path in them, terminal
states have no way out, and anything else is refused."""

from __future__ import annotations

import itertools

from aionet.scheduler.state import (
    JOB_NEXT,
    JOB_TRANSITIONS,
    TASK_NEXT,
    TASK_TRANSITIONS,
    JobState,
    TaskState,
)

T, J = TaskState, JobState


def _is_path(table: frozenset[tuple[object, object]], *states: object) -> bool:
    return all(edge in table for edge in itertools.pairwise(states))


def test_owner_paths() -> None:
    for path in (
        (T.WAITING, T.READY, T.PLACED, T.DONE),  # ran
        (T.WAITING, T.READY, T.PLACED, T.FAILED),  # raised / timed out / lost
        (T.WAITING, T.READY, T.PLACED, T.READY, T.PLACED, T.DONE),  # retried after a node death
        (T.WAITING, T.READY, T.PLACED, T.DONE, T.READY, T.PLACED, T.DONE),  # result lost, recomputed
        (T.WAITING, T.CANCELLED),
        (T.WAITING, T.FAILED),  # a dependency failed
    ):
        assert _is_path(TASK_TRANSITIONS, *path), path


def test_worker_paths() -> None:
    for path in (
        (J.FETCHING, J.QUEUED, J.RUNNING, J.FINISHED),
        (J.FETCHING, J.QUEUED, J.RUNNING, J.QUEUED, J.RUNNING, J.FINISHED),  # preempted
        (J.FETCHING, J.QUEUED, J.FINISHED),  # cancelled or stolen
        (J.FETCHING, J.FINISHED),  # a dependency could not be fetched
    ):
        assert _is_path(JOB_TRANSITIONS, *path), path


def test_terminal_states_are_final() -> None:
    assert not TASK_NEXT[T.FAILED] and not TASK_NEXT[T.CANCELLED]
    assert TASK_NEXT[T.DONE] == {T.READY}  # only a lost result re-opens a task
    assert not JOB_NEXT[J.FINISHED]


def test_no_self_loops_and_no_skipping() -> None:
    for table in (TASK_TRANSITIONS, JOB_TRANSITIONS):
        assert all(a is not b for a, b in table)
    assert (T.WAITING, T.PLACED) not in TASK_TRANSITIONS  # never placed before it is ready
    assert (T.READY, T.DONE) not in TASK_TRANSITIONS  # never done without being placed
    assert (J.FETCHING, J.RUNNING) not in JOB_TRANSITIONS


def test_lookup_tables_match() -> None:
    assert {(a, b) for a in T for b in TASK_NEXT[a]} == TASK_TRANSITIONS
    assert {(a, b) for a in J for b in JOB_NEXT[a]} == JOB_TRANSITIONS
