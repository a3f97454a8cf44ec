"""What users touch: :class:`TaskRef`, :func:`task_context`, the task errors; plus the compact
wire form of a task spec that the owner and the worker share.

Functions are named by import path (``"pkg.mod:fn"``) and imported on the executing node, so a
node only ever runs code it has installed. TaskRefs passed as arguments (also inside lists,
tuples and dicts) are swapped for :class:`DepRef` placeholders, which the executing node
replaces with the results (fetched from whichever node holds them).
"""

from __future__ import annotations

import contextvars
import importlib
import inspect
import traceback
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import TaskError

if TYPE_CHECKING:
    from .owner import Owner, Rec

__all__ = [
    "DepRef",
    "TaskCancelled",
    "TaskContext",
    "TaskFailed",
    "TaskLost",
    "TaskRef",
    "TaskTimeout",
    "Unschedulable",
    "task_context",
]

# ---------------------------------------------------------------------------- errors


class TaskFailed(TaskError):
    """The task function raised. Carries the remote exception's type, message and traceback."""

    def __init__(self, task: str, node: str, remote_type: str, message: str, tb: str = ""):
        self.task = task
        self.node = node
        self.remote_type = remote_type
        self.remote_message = message
        self.remote_traceback = tb
        super().__init__(f"task {task} failed on {node}: {remote_type}: {message}")

    def __reduce__(self) -> Any:
        return (type(self), (self.task, self.node, self.remote_type, self.remote_message, self.remote_traceback))


class TaskCancelled(TaskError):
    """``ref.cancel()`` was called (or a dependency was cancelled)."""


class TaskTimeout(TaskError, TimeoutError):
    """The task ran longer than its ``timeout``; catchable as ``asyncio.TimeoutError`` too."""


class Unschedulable(TaskError):
    """No node can satisfy the task's resource request (or its affinity); raised at once."""


class TaskLost(TaskError):
    """The nodes running the task (or holding its result) died more often than ``retries``."""


# ---------------------------------------------------------------------------- context

# The running task's context. A ContextVar is per asyncio task / per thread by construction,
# so concurrent tasks (and many nodes in one process) never see each other's context.
_CURRENT: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar("aionet_task", default=None)


class TaskContext:
    """Handed to running task code through :func:`task_context`.

    ``checkpoint(state)`` records progress: it is kept on the executing node (for preemption)
    and sent to the owner, so a re-run after a node death or a preemption starts from
    ``restore()`` instead of from scratch. ``state`` must be serializable by aionet.
    """

    __slots__ = ("_sink", "_state", "attempt", "node", "owner", "task_id")

    def __init__(
        self,
        task_id: str,
        node: str,
        owner: str,
        attempt: int,
        state: Any,
        sink: Callable[[Any], None] | None,
    ):
        self.task_id = task_id
        self.node = node
        self.owner = owner
        self.attempt = attempt
        self._state = state
        self._sink = sink

    def checkpoint(self, state: Any) -> None:
        if self._sink is None:
            raise TaskError("checkpoint() is not available in executor='process' tasks")
        self._state = state
        self._sink(state)

    def restore(self) -> Any:
        """The last checkpointed state of this task (from any earlier attempt), or None."""
        return self._state

    def __repr__(self) -> str:
        return f"<TaskContext {self.task_id} on {self.node} attempt={self.attempt}>"


def task_context() -> TaskContext:
    """The context of the task running in this thread or coroutine."""
    ctx = _CURRENT.get()
    if ctx is None:
        raise TaskError("aionet.task_context() called outside a task")
    return ctx


# ---------------------------------------------------------------------------- TaskRef


class TaskRef:
    """The handle ``node.submit`` returns: ``await ref`` gives the result (exactly once per
    completion, fetched from wherever the task ran). Pass it to another ``submit`` to make a
    dependency. Refs are local objects: they do not travel between nodes."""

    __slots__ = ("__weakref__", "_owner", "_rec")

    def __init__(self, owner: Owner, rec: Rec):
        self._owner = owner
        self._rec = rec
        rec.nrefs += 1

    def __await__(self) -> Generator[Any, None, Any]:
        rec = self._rec
        if rec.has_value:
            return rec.value
        return (yield from self._owner.result(rec).__await__())

    def done(self) -> bool:
        """Finished: succeeded, failed or was cancelled."""
        return self._rec.fut.done()

    def cancel(self) -> bool:
        """Cancel the task (removed from queues; running async tasks are cancelled). Awaiting it
        then raises :class:`TaskCancelled`. False if it had already finished."""
        return self._owner.cancel(self._rec)

    @property
    def id(self) -> str:
        return self._rec.name

    @property
    def key(self) -> str | None:
        return self._rec.key

    @property
    def fn(self) -> str:
        return self._rec.fn

    @property
    def node(self) -> str | None:
        """Where the task is placed or last ran (None while waiting for dependencies)."""
        return self._rec.node

    @property
    def attempts(self) -> int:
        return self._rec.attempt

    def __repr__(self) -> str:
        return f"<TaskRef {self._rec.name} {self._rec.fn} {self._rec.state_name}>"

    def __del__(self) -> None:
        try:
            self._owner.ref_dropped(self._rec)
        except Exception:  # interpreter shutdown or a loop already closed: nothing to release
            pass


# ---------------------------------------------------------------------------- wire format


@dataclass(slots=True)
class DepRef:
    """Placeholder for the i-th dependency inside a task's arguments on the wire."""

    i: int


DEP_TYPE_NAME = "aionet.sched.Dep"

# A task spec is a list (compact msgpack, no per-field names):
S_TID, S_FN, S_ARGS, S_KWARGS, S_PRIO, S_RES, S_EXE, S_FLAGS, S_TIMEOUT, S_ATTEMPT, S_DEPS, S_CKPT, S_KEY = range(13)
SPEC_LEN = 13
F_PREEMPTIBLE = 1
F_HAS_DEPREFS = 2  # args contain DepRef placeholders (saves walking args of plain tasks)
F_PINNED = 4  # submitted with affinity: never stolen

EXE_AUTO, EXE_THREAD, EXE_PROCESS = 0, 1, 2
EXECUTORS = {None: EXE_AUTO, "auto": EXE_AUTO, "thread": EXE_THREAD, "process": EXE_PROCESS}

# A dependency entry: [i, mode, data]; mode DEP_VALUE: data is the value; DEP_AT: data is
# [holder node, owner's task id], fetched by the executing node from the holder.
DEP_VALUE, DEP_AT = 0, 1

# A result item: [tid, attempt, status, payload, runtime seconds, nbytes]
R_VALUE = 0  # payload = the value
R_HELD = 1  # value stays on the worker (large); payload None, nbytes its size
R_ERROR = 2  # payload = [type, message, traceback]
R_TIMEOUT = 3  # payload = message
R_DEPLOST = 4  # payload = [holder, dep tid]: a dependency could not be fetched
R_CKPT = 5  # payload = checkpoint state (not a completion)
R_MOVED = 6  # payload = thief node name (not a completion): a queued task was stolen
R_REJECT = 7  # payload = reason: this node cannot run the task (place it elsewhere)

# Scheduler messages on the node mailbox channel CHANNEL: [kind, sender, ...]
CHANNEL = "aionet.sched"
# their kinds (M_SUBMIT, ...): codecs/envelope.py

SVC_RESOURCES = "aionet.sched.resources"
SVC_FETCH = "aionet.sched.fetch"
SVC_STEAL = "aionet.sched.steal"


def fn_path(fn: Any) -> str:
    """``"pkg.mod:fn"`` for a function given by path or as an importable module-level callable."""
    if isinstance(fn, str):
        mod, sep, attr = fn.partition(":")
        if not sep or not mod or not attr:
            raise TaskError(f"task function must be named 'pkg.module:function', not {fn!r}")
        return fn
    mod = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", None)
    if not callable(fn) or not mod or not qual or "<" in qual or mod == "__main__":
        raise TaskError(
            f"cannot name {fn!r} by import path: tasks run functions by 'pkg.module:function' so the "
            "executing node imports its own installed code; define it at module level in an importable module"
        )
    return f"{mod}:{qual}"


def resolve_fn(path: str) -> tuple[Any, list[Any]]:
    """Import ``pkg.mod:attr.sub``; returns (object, the objects walked through after the
    module). Raises TaskError. Call only after the path passed the allow check: importing runs
    the module's code."""
    mod_name, _, attr = path.partition(":")
    hops: list[Any] = []
    try:
        obj: Any = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
            hops.append(obj)
    except Exception as exc:
        raise TaskError(f"cannot import task function {path!r}: {type(exc).__name__}: {exc}") from None
    hops.pop()
    return obj, hops


def import_fn(path: str) -> tuple[Callable[..., Any], bool]:
    """Import ``pkg.mod:attr.sub`` here; returns (callable, is_async). Raises TaskError."""
    obj, _hops = resolve_fn(path)
    if not callable(obj):
        raise TaskError(f"task function {path!r} is not callable")
    return obj, inspect.iscoroutinefunction(obj)


def _replace(obj: Any, leaf: type, fn: Callable[[Any], Any]) -> Any:
    """Copy of ``obj`` with every instance of ``leaf`` inside lists, tuples and dicts replaced
    by ``fn(instance)``; containers without one are returned as they are (no copy)."""
    t = type(obj)
    if t is leaf:
        return fn(obj)
    if t is list or t is tuple:
        out = None
        for idx, item in enumerate(obj):
            ti = type(item)
            new = _replace(item, leaf, fn) if ti is leaf or ti is list or ti is tuple or ti is dict else item
            if new is not item:
                if out is None:
                    out = list(obj)
                out[idx] = new
        if out is None:
            return obj
        return out if t is list else tuple(out)
    if t is dict:
        outd = None
        for k, v in obj.items():
            tv = type(v)
            new = _replace(v, leaf, fn) if tv is leaf or tv is list or tv is tuple or tv is dict else v
            if new is not v:
                if outd is None:
                    outd = dict(obj)
                outd[k] = new
        return obj if outd is None else outd
    return obj


def extract_refs(obj: Any, found: dict[int, tuple[int, TaskRef]]) -> Any:
    """``obj`` with TaskRefs (in lists, tuples, dicts) replaced by DepRef(i); records them in
    ``found`` (id of the task record -> (i, ref))."""

    def dep(ref: TaskRef) -> DepRef:
        hit = found.get(id(ref._rec))
        if hit is None:
            hit = found[id(ref._rec)] = (len(found), ref)
        return DepRef(hit[0])

    return _replace(obj, TaskRef, dep)


def substitute(obj: Any, values: list[Any]) -> Any:
    """Inverse of :func:`extract_refs`: DepRef(i) -> values[i]."""
    return _replace(obj, DepRef, lambda d: values[d.i])


def error_fields(exc: BaseException) -> list[str]:
    """[type, message, traceback] of an exception, as results carry it."""
    t = type(exc)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    tb = "".join(traceback.format_exception(t, exc, exc.__traceback__))
    return [name, str(exc), tb]


def estimate_nbytes(obj: Any, depth: int = 0) -> int:
    """Rough size of a result, counting only what is large (arrays, bytes, strings): decides
    whether a result rides inline with the completion or stays where it was computed."""
    nb = getattr(obj, "nbytes", None)
    if isinstance(nb, int):
        return nb
    t = type(obj)
    if t is bytes or t is bytearray or t is str:
        return len(obj)
    if depth < 3:
        if t is list or t is tuple:
            if len(obj) > 64:  # many small items: sample the first ones
                return sum(estimate_nbytes(x, depth + 1) for x in obj[:64]) * len(obj) // 64 + 8 * len(obj)
            return sum(estimate_nbytes(x, depth + 1) for x in obj) + 8 * len(obj)
        if t is dict:
            return sum(estimate_nbytes(v, depth + 1) for v in obj.values()) + 16 * len(obj)
    return 16
