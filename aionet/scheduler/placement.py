"""The public placement-policy interface and how policy names resolve to policy objects.

A placement policy is a plain object with one method, ``choose(task, nodes, ctx)``: it sees the
task's features (:class:`~aionet.scheduler.policies.TaskReq`) and a snapshot of the candidate
nodes (:class:`~aionet.scheduler.policies.NodeView`, read-only by contract) and returns the name
of the node to run the task on, or ``None`` for "nothing has room now, ask me again later".
A policy that learns also defines ``observe(done)``; the owner calls it with a
:class:`Completion` for every task that finishes.

Names resolve in this order (:class:`PolicyRegistry`): the built-ins (``round-robin``,
``least-loaded``, ``shortest-expected``, ``locality``, ``learned``), then the
``aionet.policies`` entry-point group (value ``"package.module:Factory"``), then an import
path ``"package.module:Factory"`` given directly. A factory is a class or a zero-argument
callable returning a policy. Each owner builds its own instances (no module-level state), so
learned weights never leak between nodes in one process.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol, runtime_checkable

from ..errors import ConfigError
from .policies import NodeView, RuntimeEstimator, TaskReq, least_loaded, locality, round_robin, shortest_expected
from .wire import R_ERROR

__all__ = [
    "BUILTIN_POLICIES",
    "ENTRY_POINT_GROUP",
    "Completion",
    "LearningPolicy",
    "LeastLoaded",
    "Locality",
    "PlacementPolicy",
    "PolicyContext",
    "PolicyRegistry",
    "PolicySet",
    "RoundRobin",
    "ShortestExpected",
    "check_policy",
]

ENTRY_POINT_GROUP = "aionet.policies"


@dataclass(slots=True)
class PolicyContext:
    """What the owner knows besides the task and the nodes; one object per owner, updated in
    place before each call (allocating one per decision would cost more than most policies)."""

    seq: int = 0  # tasks this owner placed so far (round-robin's turn)
    estimator: RuntimeEstimator | None = None  # learned per-function, per-node runtimes
    now: float = 0.0  # the owner's clock (seconds, monotonic)


class Completion(NamedTuple):
    """One finished task, as a learning policy sees it (a NamedTuple: built once per completion
    on the owner's hot path, where a frozen dataclass costs several times more)."""

    tid: int  # TaskReq.tid of the placement this completes
    fn: str
    node: str
    runtime: float  # seconds the task ran on the node
    latency: float  # seconds from placement to the result arriving (queueing + running + messages)
    behind: int  # tasks still queued behind it on that node when it finished (contention)
    slots: float  # the node's parallelism (cpu slots)
    ok: bool = True  # False: the task raised (its runtime still teaches something)


LOCALITY_BYTES = 1 << 20  # what a cache_ref argument weighs in TaskReq.dep_bytes on its key's holders


def task_req(rec: Any, here: str, locate: Callable[[str], Sequence[str]] | None) -> TaskReq:
    """A task's record (``state.Rec``) as placement sees it: where its arguments' bytes are
    (results of other tasks, and cache keys named by ``cache_ref`` arguments, via ``locate``)."""
    dep_bytes: dict[str, int] = {}
    for d in rec.deps or ():
        where = d.holder if d.holder is not None else here if d.nbytes else None
        if where is not None:
            dep_bytes[where] = dep_bytes.get(where, 0) + d.nbytes
    if locate is not None:
        for node in (n for key in rec.locality for n in locate(key)):
            dep_bytes[node] = dep_bytes.get(node, 0) + LOCALITY_BYTES
    return TaskReq(rec.fn, rec.res, rec.prio, dep_bytes, rec.affinity, rec.exclude, rec.tid, rec.prefer)


@runtime_checkable
class PlacementPolicy(Protocol):
    """Chooses a node for one task. Must be fast (it runs once per task placed), must not do
    I/O, and must return the name of one of ``nodes`` whose resources cover the task (hard
    constraints: see :func:`~aionet.scheduler.policies.feasible`) or None."""

    def choose(self, task: TaskReq, nodes: Sequence[NodeView], ctx: PolicyContext) -> str | None: ...


@runtime_checkable
class LearningPolicy(PlacementPolicy, Protocol):
    """A policy that is told how its placements turned out."""

    def observe(self, done: Completion) -> None: ...


class _FunctionPolicy:
    """Adapts a built-in pure function to :class:`PlacementPolicy`."""

    __slots__ = ()
    fn: Callable[..., str | None]

    def choose(self, task: TaskReq, nodes: Sequence[NodeView], ctx: PolicyContext) -> str | None:
        return type(self).fn(task, nodes, seq=ctx.seq, estimator=ctx.estimator)


class RoundRobin(_FunctionPolicy):
    """Strict rotation over feasible nodes (see :func:`~aionet.scheduler.policies.round_robin`)."""

    __slots__ = ()
    fn = staticmethod(round_robin)


class LeastLoaded(_FunctionPolicy):
    """Fewest tasks per cpu slot (see :func:`~aionet.scheduler.policies.least_loaded`)."""

    __slots__ = ()
    fn = staticmethod(least_loaded)


class ShortestExpected(_FunctionPolicy):
    """Earliest expected finish (see :func:`~aionet.scheduler.policies.shortest_expected`)."""

    __slots__ = ()
    fn = staticmethod(shortest_expected)


class Locality(_FunctionPolicy):
    """Most argument bytes already there (see :func:`~aionet.scheduler.policies.locality`)."""

    __slots__ = ()
    fn = staticmethod(locality)


BUILTIN_POLICIES: MappingProxyType[str, str] = MappingProxyType(
    {
        "round-robin": "aionet.scheduler.placement:RoundRobin",
        "least-loaded": "aionet.scheduler.placement:LeastLoaded",
        "shortest-expected": "aionet.scheduler.placement:ShortestExpected",
        "locality": "aionet.scheduler.placement:Locality",
        "learned": "aionet.scheduler.learned:LearnedPolicy",
    }
)


def _import(target: str, what: str) -> Any:
    mod_name, sep, attr = target.partition(":")
    if not sep or not mod_name or not attr:
        raise ConfigError(f"{what}: {target!r} is not 'package.module:Name'")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ConfigError(f"{what}: module {mod_name!r} cannot be imported ({exc}); is it installed?") from exc
    obj = mod
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ConfigError(f"{what}: module {mod_name!r} has no attribute {attr!r}")
    return obj


class PolicyRegistry:
    """Policy names and import paths -> policy instances, cached per spec (one per owner)."""

    def __init__(self, extra: dict[str, str | Callable[[], Any]] | None = None, *, use_entry_points: bool = True):
        self._targets: dict[str, str | Callable[[], Any]] = dict(BUILTIN_POLICIES)
        if use_entry_points:
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                self._targets.setdefault(ep.name, ep.value)
        if extra:
            self._targets.update(extra)
        self._instances: dict[str, PlacementPolicy] = {}

    def names(self) -> list[str]:
        """Every policy known by name (built-ins and entry points)."""
        return sorted(self._targets)

    def register(self, name: str, target: str | Callable[[], Any]) -> None:
        self._targets[name] = target
        self._instances.pop(name, None)

    def check(self, spec: object) -> None:
        """ConfigError unless ``spec`` names a known policy, is an import path, or is a policy
        object. Import paths are imported here, so a typo fails at start, not at first task."""
        if isinstance(spec, str):
            self.factory(spec)
        elif not isinstance(spec, PlacementPolicy):
            raise ConfigError(f"policy must be a name or an object with choose(task, nodes, ctx), not {spec!r}")

    def factory(self, spec: str) -> Callable[[], Any]:
        target = self._targets.get(spec)
        if target is None:
            if ":" not in spec:
                raise ConfigError(
                    f"unknown scheduling policy {spec!r}; choose one of {', '.join(self.names())} "
                    "or give an import path 'package.module:PolicyClass'"
                )
            target = spec
        if not isinstance(target, str):
            return target
        obj = _import(target, f"scheduling policy {spec!r}")
        if not callable(obj):
            raise ConfigError(f"scheduling policy {spec!r}: {target} is not a class or factory")
        return obj

    def get(self, spec: str | PlacementPolicy) -> PlacementPolicy:
        """The policy for ``spec``: an instance built once per registry for a string, the object
        itself for a policy object."""
        if not isinstance(spec, str):
            return spec
        pol = self._instances.get(spec)
        if pol is None:
            made = self.factory(spec)()
            if not callable(getattr(made, "choose", None)):
                raise ConfigError(f"scheduling policy {spec!r} built {made!r}, which has no choose(task, nodes, ctx)")
            pol = self._instances[spec] = made
        return pol

    def instances(self) -> dict[str, PlacementPolicy]:
        """The policies built so far, by spec (to save a learned policy's weights, say)."""
        return dict(self._instances)


def check_policy(policy: object) -> None:
    """ConfigError unless ``policy`` is a built-in name, an ``aionet.policies`` entry point, an
    importable ``"package.module:Factory"`` or a policy object."""
    PolicyRegistry().check(policy)


class PolicySet:
    """One owner's policies: resolves specs once, keeps the shared :class:`PolicyContext`, and
    tells every learning policy about each completion (so the owner stays a state machine)."""

    __slots__ = ("_learners", "clock", "ctx", "observers", "registry")

    def __init__(self, estimator: RuntimeEstimator, clock: Callable[[], float], registry: PolicyRegistry | None = None):
        self.registry = registry or PolicyRegistry()
        self.ctx = PolicyContext(estimator=estimator)
        self.clock = clock
        self.observers: list[LearningPolicy] = []  # policies with observe(), told about every completion
        self._learners: list[tuple[LearningPolicy, Callable[[int], bool] | None]] = []

    def get(self, spec: str | PlacementPolicy) -> PlacementPolicy:
        """The policy for ``spec`` (ConfigError naming the choices for a bad name)."""
        pol = self.registry.get(spec)
        if isinstance(pol, LearningPolicy) and not any(o is pol for o in self.observers):
            self.observers.append(pol)
            self._learners.append((pol, getattr(pol, "wants", None)))
        return pol

    def observe(
        self, tid: int, fn: str, view: NodeView | None, node: str, runtime: float, placed_at: float, status: int
    ) -> None:
        """Build the :class:`Completion` for a finished task and hand it to each learner that
        wants it (a learner may define ``wants(tid) -> bool`` to skip the ones it did not track)."""
        done = None
        for pol, wants in self._learners:
            if wants is not None and not wants(tid):
                continue
            if done is None:
                slots = view.slots if view is not None else 1.0
                behind = max(0, int(view.inflight + view.other - slots)) if view is not None else 0
                done = Completion(tid, fn, node, runtime, self.clock() - placed_at, behind, slots, status != R_ERROR)
            pol.observe(done)
