"""Task state, as the owner and the worker each see it: the records, the state enums and the
tables of allowed transitions (the bottom of the scheduler, below the owner and worker).

A task's life on its owner: ``waiting`` (for dependencies) -> ``ready`` (queued for placement)
-> ``placed`` (sent to a node) -> ``done`` | ``failed`` | ``cancelled``. A placed task goes
back to ``ready`` (or ``waiting``) when it is retried: its node died, refused it or could not
fetch a dependency; a done task goes back to ``ready`` when the only copy of its result is
lost. On the executing node an attempt is ``fetching`` (its dependencies) -> ``queued`` ->
``running`` -> ``finished``, and a preempted task goes from ``running`` back to ``queued``.

Every change goes through the owner's or the worker's ``_transition()``, which checks the
tables below: an edge not listed raises :class:`InvalidTransition`, a bug in aionet, which
tests catch instead of a task that silently hangs or completes twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from ..config import parse_size
from .wire import SPEC_LEN

if TYPE_CHECKING:
    import asyncio

    from .tasks import TaskContext

__all__ = [
    "DEFAULT_RES",
    "JOB_TRANSITIONS",
    "TASK_TRANSITIONS",
    "InvalidTransition",
    "Job",
    "JobState",
    "Rec",
    "TaskState",
    "normalize_resources",
]

# a task takes one cpu unless it says otherwise; shared, never mutated (compared by identity)
DEFAULT_RES: dict[str, float] = {"cpu": 1.0}


class InvalidTransition(RuntimeError):
    """A task was moved along an edge its transition table does not have: a bug in aionet."""

    def __init__(self, task: str, old: IntEnum, new: IntEnum, view: str):
        self.task = task
        self.old = old
        self.new = new
        super().__init__(f"{view} view of task {task}: illegal transition {old.name.lower()} -> {new.name.lower()}")


class TaskState(IntEnum):
    """A task on its owner (``Rec.state``)."""

    WAITING = 0  # for its dependencies' results
    READY = 1  # in the owner's placement queue
    PLACED = 2  # sent to (or stolen by) a node; one attempt counts
    DONE = 3
    FAILED = 4
    CANCELLED = 5


class JobState(IntEnum):
    """One attempt of a task on the node running it (``Job.state``)."""

    FETCHING = 0  # its dependencies' results
    QUEUED = 1  # waiting for resources
    RUNNING = 2
    FINISHED = 3  # reported, dropped, stolen or cancelled


_T = TaskState
TASK_TRANSITIONS: frozenset[tuple[TaskState, TaskState]] = frozenset(
    {
        (_T.WAITING, _T.READY),  # dependencies done (or none)
        (_T.WAITING, _T.FAILED),  # a dependency failed
        (_T.WAITING, _T.CANCELLED),
        (_T.READY, _T.WAITING),  # a dependency's result was lost and is being recomputed
        (_T.READY, _T.PLACED),
        (_T.READY, _T.FAILED),  # unschedulable, retries used up, cannot send, shutdown
        (_T.READY, _T.CANCELLED),
        (_T.PLACED, _T.READY),  # retried: node died, node refused it, dependency unreachable
        (_T.PLACED, _T.WAITING),  # retried, and a dependency must be recomputed first
        (_T.PLACED, _T.DONE),
        (_T.PLACED, _T.FAILED),  # raised, timed out, or lost with no retries left
        (_T.PLACED, _T.CANCELLED),
        (_T.DONE, _T.READY),  # the only copy of its result was lost: run it again
    }
)
_J = JobState
JOB_TRANSITIONS: frozenset[tuple[JobState, JobState]] = frozenset(
    {
        (_J.FETCHING, _J.QUEUED),
        (_J.FETCHING, _J.FINISHED),  # dependency lost, function refused, cancelled
        (_J.QUEUED, _J.RUNNING),
        (_J.QUEUED, _J.FINISHED),  # cancelled or stolen
        (_J.RUNNING, _J.QUEUED),  # preempted by a higher-priority task
        (_J.RUNNING, _J.FINISHED),
    }
)
del _T, _J


def _successors(table: frozenset[tuple[Any, Any]], states: type[IntEnum]) -> tuple[frozenset[Any], ...]:
    """The table as a tuple indexed by state: the checks are a tuple index and a set lookup."""
    return tuple(frozenset(new for old, new in table if old == s) for s in states)


TASK_NEXT: tuple[frozenset[TaskState], ...] = _successors(TASK_TRANSITIONS, TaskState)
JOB_NEXT: tuple[frozenset[JobState], ...] = _successors(JOB_TRANSITIONS, JobState)
TERMINAL = (TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED)


def normalize_resources(resources: Mapping[str, Any] | None) -> dict[str, float]:
    """``{"gpu": 1, "memory": "2GiB"}`` -> ``{"cpu": 1.0, "gpu": 1.0, "memory": 2147483648.0}``."""
    out = dict(DEFAULT_RES)
    if not resources:
        return out
    for k, v in resources.items():
        if not isinstance(k, str):
            raise TypeError(f"resource names must be strings, not {k!r}")
        if isinstance(v, str):
            try:
                val = float(parse_size(v))
            except Exception:
                raise ValueError(f"resource {k}: cannot read {v!r} as an amount") from None
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"resource {k}: amount must be a number or a size string, not {v!r}")
        else:
            val = float(v)
        if val < 0 or val != val:
            raise ValueError(f"resource {k}: amount must be >= 0, not {v!r}")
        out[k] = val
    return out


class Rec:
    """One owned task (the owner's record; ``TaskRef`` reads it)."""

    __slots__ = (
        "affinity",
        "args",
        "attempt",
        "ckpt",
        "dependents",
        "deplost",
        "deps",
        "est",
        "exclude",
        "exe",
        "flags",
        "fn",
        "fut",
        "has_value",
        "holder",
        "key",
        "kwargs",
        "locality",
        "n_vdeps",
        "name",
        "nbytes",
        "node",
        "nrefs",
        "pins",
        "placed_at",
        "policy",
        "prefer",
        "prio",
        "res",
        "res_wire",
        "retries",
        "retry_on",
        "state",
        "submitted",
        "tid",
        "timeout",
        "value",
        "waiting",
    )

    def __init__(self, tid: int, name: str, fn: str, fut: asyncio.Future[None]):
        self.tid = tid
        self.name = name
        self.fn = fn
        self.fut = fut
        self.key: str | None = None
        self.args: Any = None
        self.kwargs: Any = None
        self.flags = 0
        self.prio = 0
        self.res: dict[str, float] = DEFAULT_RES
        self.res_wire: dict[str, float] | None = None
        self.exe = 0
        self.timeout: float | None = None
        self.retries = 0
        self.affinity: str | None = None
        self.exclude: frozenset[str] = frozenset()
        self.policy: Any = None  # per-call policy: a name, an import path or a policy object
        self.prefer: str | None = None  # submit(prefer=): a resource to have the most of free
        self.locality: tuple[str, ...] = ()  # keys of cache_ref arguments: where their data is held
        self.deps: list[Rec] | None = None
        self.n_vdeps = 0  # deps[:n_vdeps] feed arguments; the rest are order-only (submit(after=))
        self.retry_on: frozenset[str] = frozenset()  # exception type names re-run on (retry_on=)
        self.waiting = 0
        self.dependents: list[Rec] | None = None
        self.pins = 0
        self.nrefs = 0
        self.state = TaskState.WAITING  # only _transition() changes it from here on
        self.node: str | None = None
        self.attempt = 0
        self.has_value = False
        self.value: Any = None
        self.holder: str | None = None
        self.nbytes = 0
        self.est = 0.0
        self.ckpt: Any = None
        self.deplost = 0
        self.submitted = 0.0
        self.placed_at = 0.0

    @property
    def state_name(self) -> str:
        return self.state.name.lower()


class Job:
    """One task attempt on this node."""

    __slots__ = (
        "args",
        "attempt",
        "call",
        "cancelled",
        "ckpt",
        "ctx",
        "deps",
        "devices",
        "exe",
        "flags",
        "fn",
        "key",
        "kwargs",
        "local",
        "name",
        "owner",
        "preempting",
        "prio",
        "queued",
        "released",
        "reported",
        "res",
        "seq",
        "state",
        "sync",
        "t0",
        "task",
        "tid",
        "timed_out",
        "timeout",
        "timer",
    )

    def __init__(self, owner: str, spec: list[Any], local: bool):
        if type(spec) is not list or len(spec) != SPEC_LEN:
            raise ValueError("malformed task spec")
        (tid, fn, args, kwargs, prio, res, exe, flags, timeout, attempt, deps, ckpt, key) = spec
        if not isinstance(fn, str) or not isinstance(tid, int):
            raise ValueError("malformed task spec")
        self.owner = owner
        self.tid = tid
        self.fn = fn
        self.args = args if type(args) is list else list(args or ())
        self.kwargs = kwargs or None
        self.prio = int(prio)
        self.res = {k: float(v) for k, v in res.items()} if res else DEFAULT_RES
        self.exe = int(exe)
        self.flags = int(flags)
        self.timeout = float(timeout) if timeout else None
        self.attempt = int(attempt)
        self.deps = deps or None
        self.ckpt = ckpt
        self.key = key
        self.name = key if key is not None else f"{owner}:{tid}"
        self.local = local
        self.seq = -1
        self.queued = False
        self.state = JobState.FETCHING  # only the worker's _transition() changes it from here on
        self.t0 = 0.0
        self.task: asyncio.Future[Any] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.ctx: TaskContext | None = None
        self.devices: tuple[int, ...] = ()  # GPU indices given to this job while it runs
        self.preempting = False
        self.cancelled = False
        self.timed_out = False
        self.reported = False
        self.released = False
        self.sync = False  # runs in a thread (a plain function, or executor="thread")
        self.call: Callable[..., Any] | None = None

    @property
    def device(self) -> str:
        """Where it runs, for traces: ``"cpu"``, or the GPUs it holds (``"gpu:0"``, ``"gpu:0+1"``)."""
        return "gpu:" + "+".join(map(str, self.devices)) if self.devices else "cpu"

    def spec(self) -> list[Any]:
        """This (still queued, dependencies resolved) task as a spec for another node."""
        res = None if self.res is DEFAULT_RES else self.res
        ckpt = self.ctx.restore() if self.ctx is not None else self.ckpt
        return [
            self.tid,
            self.fn,
            self.args,
            self.kwargs,
            self.prio,
            res,
            self.exe,
            self.flags,
            self.timeout,
            self.attempt,
            None,
            ckpt,
            self.key,
        ]
