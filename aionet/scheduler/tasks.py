"""What users touch: :class:`TaskRef`, :func:`task_context`, the task errors; plus the helpers
that name task functions and swap TaskRefs in arguments for placeholders.

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
from typing import Any, Protocol

from ..errors import TaskError
from .wire import DepRef

__all__ = [
    "TaskCancelled",
    "TaskContext",
    "TaskFailed",
    "TaskLost",
    "TaskRef",
    "TaskTimeout",
    "Unschedulable",
    "task",
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

    __slots__ = ("_sink", "_state", "attempt", "devices", "node", "node_name", "owner", "rank", "task_id")

    def __init__(
        self,
        task_id: str,
        node_name: str,
        owner: str,
        attempt: int,
        state: Any,
        sink: Callable[[Any], None] | None,
        *,
        node: Any = None,
        rank: int = -1,
        devices: tuple[int, ...] = (),
    ):
        self.task_id = task_id
        #: the Node running this task (send, request, groups, cache from task code); None in
        #: executor="process" tasks, which run in another process
        self.node = node
        self.node_name = node_name  # that node's name
        self.rank = rank  # its rank in a launched world (-1 outside one)
        #: GPU indices given to this task by resources={"gpu": n} (CUDA_VISIBLE_DEVICES is set
        #: to them for executor="process" tasks)
        self.devices = devices
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
        return f"<TaskContext {self.task_id} on {self.node_name} attempt={self.attempt}>"


def task_context() -> TaskContext:
    """The context of the task running in this thread or coroutine."""
    ctx = _CURRENT.get()
    if ctx is None:
        raise TaskError("aionet.task_context() called outside a task")
    return ctx


# ---------------------------------------------------------------------------- TaskRef


class RefTarget(Protocol):
    """What a :class:`TaskRef` reads of its task's record (``state.Rec``), named here so that
    this module, which users import, depends on nothing above it."""

    nrefs: int
    has_value: bool
    value: Any
    fut: Any
    name: str
    key: str | None
    fn: str
    node: str | None
    attempt: int

    @property
    def state_name(self) -> str: ...


class RefOwner(Protocol):
    """What a :class:`TaskRef` asks of the owner that issued it (``owner.Owner``)."""

    async def result(self, rec: Any) -> Any: ...

    def cancel(self, rec: Any) -> bool: ...

    def set_priority(self, rec: Any, priority: int) -> bool: ...

    def ref_dropped(self, rec: Any) -> None: ...


class TaskRef:
    """The handle ``node.submit`` returns: ``await ref`` gives the result (exactly once per
    completion, fetched from wherever the task ran). Pass it to another ``submit`` to make a
    dependency. Refs are local objects: they do not travel between nodes."""

    __slots__ = ("__weakref__", "_owner", "_rec")

    def __init__(self, owner: RefOwner, rec: RefTarget):
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

    def set_priority(self, priority: int) -> bool:
        """Change the priority of a task that has not been placed on a node yet (waiting for
        its dependencies or for room). Returns False when it was already placed, running or
        done: a node's own queue keeps the order it was given."""
        return self._owner.set_priority(self._rec, int(priority))

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


# ---------------------------------------------------------------------------- naming and arguments


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


def type_name(t: type) -> str:
    """How results name an exception type: ``ValueError``, ``pkg.mod.MyError``."""
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def error_fields(exc: BaseException) -> list[Any]:
    """[type, message, traceback, [type and its bases]] of an exception, as results carry it
    (the bases let the owner apply ``retry_on=`` to subclasses without importing them)."""
    t = type(exc)
    tb = "".join(traceback.format_exception(t, exc, exc.__traceback__))
    return [type_name(t), str(exc), tb, [type_name(b) for b in t.__mro__ if b is not object]]


#: options ``@aionet.task(...)`` may preset (``node.submit`` keywords override them)
TASK_OPTIONS = ("resources", "priority", "retries", "retry_on", "timeout", "executor", "preemptible", "policy")


def task(fn: Any = None, /, **options: Any) -> Any:
    """Preset task options on a module-level function: ``@aionet.task(resources={"gpu": 1},
    retries=2, retry_on=(OSError,))``, then ``node.submit(fn, ...)``. The function is still
    named by import path (each node runs its own installed copy) and stays callable as is."""
    bad = [k for k in options if k not in TASK_OPTIONS]
    if bad:
        raise TypeError(f"aionet.task(): unknown option {bad[0]!r}; options: {', '.join(TASK_OPTIONS)}")
    if "retry_on" in options:
        options["retry_on"] = retry_names(options["retry_on"])

    def mark(f: Any) -> Any:
        fn_path(f)  # fails now, at definition, for a function that cannot be named by path
        f.__aionet_task__ = dict(options)
        return f

    return mark if fn is None else mark(fn)


def order_refs(after: Any, owner: Any) -> list[Any]:
    """``submit(after=[refs])``: the records to wait for (order only, no value passed)."""
    if after is None:
        return []
    refs = [after] if isinstance(after, TaskRef) else list(after)
    for r in refs:
        if not isinstance(r, TaskRef):
            raise TypeError(f"after= takes TaskRefs, not {r!r}")
        if r._owner is not owner:
            raise TaskError(f"{r!r} belongs to another node's scheduler; TaskRefs do not travel")
    return [r._rec for r in refs]


def dep_error(rec: Any, dep: Any, cause: BaseException | None = None) -> TaskError:
    """Why ``rec`` will not run: its dependency ``dep`` (a record) failed or was cancelled."""
    cancelled = dep.state_name == "cancelled"
    cls = TaskCancelled if cancelled else TaskError
    why = "was cancelled" if cancelled else "failed"
    err = cls(f"task {rec.name} not run: its dependency {dep.name} ({dep.fn}) {why}")
    if cause is not None:
        err.__cause__ = cause
    elif dep.fut.done() and not dep.fut.cancelled():
        err.__cause__ = dep.fut.exception()
    return err


def locality_keys(args: Any, kwargs: Any) -> tuple[str, ...]:
    """The keys of arguments that name where their data lives (``aionet.cache_ref(key)``: any
    object whose type has ``__aionet_locality__``), top level only."""
    items = [*(args or ()), *((kwargs or {}).values())]
    return tuple(str(a.__aionet_locality__) for a in items if hasattr(type(a), "__aionet_locality__"))


def retry_names(retry_on: Any) -> frozenset[str]:
    """``retry_on=`` (an exception type, a tuple of them, or their names) as type names."""
    items = retry_on if isinstance(retry_on, (tuple, list, set, frozenset)) else (retry_on,)
    out = set()
    for it in items:
        if isinstance(it, str):
            out.add(it)
        elif isinstance(it, type) and issubclass(it, BaseException):
            out.add(type_name(it))
        else:
            raise TypeError(f"retry_on= takes exception types (or their names), not {it!r}")
    return frozenset(out)


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
