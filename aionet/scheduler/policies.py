"""Placement policies: pure functions from (task requirements, a snapshot of nodes) to a node name.

The owner calls :func:`choose` once per task it is about to place, with views it keeps up to
date incrementally (its own in-flight tasks per node plus the load the nodes report). Nothing
here does I/O, reads a clock or keeps hidden state, so the policies are tested exhaustively
with hypothesis and behave identically in a one-node test and a 100-node cluster.

Two rules hold for every policy:

* **Hard constraints first.** A node is *feasible* when its total resources cover the request
  (a ``gpu=1`` task never goes to a node without a GPU) and it is not excluded. When nothing
  is feasible the task cannot run anywhere: :func:`unsatisfiable_reason` says why, and the
  owner fails it at once instead of letting it wait forever.
* **Windows delay decisions.** The owner keeps at most ``window`` of its tasks in flight per
  node (sized by :func:`window_size` from how long tasks take there), so learning policies
  decide late, with fresh estimates, instead of carving up a 10,000-task batch before the
  first result is back. Round-robin is strict: when the next node in turn is full it waits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = [
    "POLICIES",
    "NodeView",
    "RuntimeEstimator",
    "TaskReq",
    "candidates",
    "choose",
    "feasible",
    "fits",
    "least_loaded",
    "locality",
    "round_robin",
    "shortest_expected",
    "unsatisfiable_reason",
    "window_size",
]

EPS = 1e-9


@dataclass(slots=True)
class NodeView:
    """What an owner knows about one node when placing a task."""

    name: str
    total: dict[str, float]  # capacity the node advertises (cpu, gpu, memory, custom)
    free: dict[str, float] = field(default_factory=dict)  # estimated free now (last report, adjusted)
    inflight: int = 0  # this owner's tasks placed there and not finished
    window: int = 8  # how many of this owner's tasks may be in flight there
    other: int = 0  # tasks of other owners queued or running there (reported)
    backlog: float = 0.0  # expected seconds of this owner's unfinished work there
    max_prio: int = -(2**62)  # highest priority among this owner's in-flight tasks there

    @property
    def slots(self) -> float:
        """Parallelism used to turn queued work into waiting time (cpu capacity, at least 1)."""
        return max(self.total.get("cpu", 1.0), 1.0)

    def has_room(self, priority: int) -> bool:
        """Window not full, or the task outranks everything we have there (so the node's own
        priority queue, and preemption, can act on it now rather than after the backlog)."""
        return self.inflight < self.window or priority > self.max_prio


@dataclass(slots=True, frozen=True)
class TaskReq:
    """The requirements of one task, as placement sees them."""

    fn: str
    resources: Mapping[str, float]
    priority: int = 0
    dep_bytes: Mapping[str, int] = field(default_factory=dict)  # node -> bytes of arguments held there
    affinity: str | None = None  # run only on this node
    exclude: frozenset[str] = frozenset()  # nodes that refused the task
    tid: int = 0  # the owner's id for this placement (matches Completion.tid for learning policies)
    prefer: str | None = None  # soft: among nodes with room, those with the most of this resource free


def fits(req: Mapping[str, float], avail: Mapping[str, float]) -> bool:
    """True when every requested amount is available (unlisted resources count as zero)."""
    for k, v in req.items():  # noqa: SIM110 - a plain loop: this runs per task per node
        if v > EPS and avail.get(k, 0.0) + EPS < v:
            return False
    return True


def feasible(task: TaskReq, nodes: Sequence[NodeView]) -> list[NodeView]:
    """Nodes that could ever run ``task``: capacity covers the request, not excluded, affinity."""
    out = []
    for n in nodes:
        if task.affinity is not None and n.name != task.affinity:
            continue
        if n.name in task.exclude:
            continue
        if fits(task.resources, n.total):
            out.append(n)
    return out


def unsatisfiable_reason(task: TaskReq, nodes: Sequence[NodeView]) -> str:
    """Why no node can run ``task`` (for the error the caller sees)."""
    want = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(task.resources.items()) if v > EPS) or "nothing"
    if not nodes:
        return f"task {task.fn} requests {want} but no node accepts tasks"
    if task.affinity is not None and all(n.name != task.affinity for n in nodes):
        return f"task {task.fn} is pinned to node {task.affinity!r}, which is not alive or does not run tasks"
    have = "; ".join(f"{n.name}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(n.total.items())) for n in nodes[:8])
    more = f" (+{len(nodes) - 8} more)" if len(nodes) > 8 else ""
    return f"no node can satisfy task {task.fn} requesting {want}; nodes offer {have}{more}"


def _fmt(v: float) -> str:
    if v >= 2**20 and float(v).is_integer():
        return f"{v / 2**30:.1f}GiB" if v >= 2**30 else f"{v / 2**20:.0f}MiB"
    return f"{v:g}"


def _scarce_free(task: TaskReq, nodes: list[NodeView]) -> list[NodeView]:
    """Prefer nodes where the non-cpu resources asked for (gpu, memory, custom) are free now;
    cpu is oversubscribed on purpose (windows queue work on nodes), scarce devices are not."""
    scarce = {k: v for k, v in task.resources.items() if k != "cpu" and v > EPS}
    if not scarce:
        return nodes
    free = [n for n in nodes if fits(scarce, n.free)]
    return free or nodes


def candidates(task: TaskReq, nodes: Sequence[NodeView]) -> list[NodeView]:
    """Feasible nodes with room now, narrowed to those whose scarce resources are free, and to
    those with the most of ``task.prefer`` free when the task states a preference."""
    res = task.resources
    if len(res) == 1 and task.affinity is None and not task.exclude:
        # the common task (one resource, usually cpu=1, no pins): one comprehension with
        # :func:`fits` and :meth:`NodeView.has_room` inlined; this runs per task placed
        ((k, need),) = res.items()
        prio = task.priority
        if need > EPS:
            cands = [
                n
                for n in nodes
                if (n.inflight < n.window or prio > n.max_prio) and not n.total.get(k, 0.0) + EPS < need
            ]
            if k != "cpu":  # a scarce resource: prefer nodes where it is free now
                cands = [n for n in cands if not n.free.get(k, 0.0) + EPS < need] or cands
        else:
            cands = [n for n in nodes if n.inflight < n.window or prio > n.max_prio]
    else:
        cands = _scarce_free(task, [n for n in feasible(task, nodes) if n.has_room(task.priority)])
    return _preferred(task.prefer, cands) if task.prefer and len(cands) > 1 else cands


def _preferred(resource: str, nodes: list[NodeView]) -> list[NodeView]:
    """The nodes with the most ``resource`` free (a soft preference: all of them when none has any)."""
    most = max(n.free.get(resource, 0.0) for n in nodes)
    if most <= EPS:
        return nodes
    return [n for n in nodes if n.free.get(resource, 0.0) >= most - EPS]


def _load(n: NodeView) -> float:
    return (n.inflight + n.other) / n.slots


# ---------------------------------------------------------------------------- policies


def round_robin(task: TaskReq, nodes: Sequence[NodeView], *, seq: int = 0, **_: object) -> str | None:
    """Strict rotation over feasible nodes (by name); ``seq`` is how many tasks this owner
    placed so far. Waits (returns None) when the node whose turn it is has no room."""
    feas = sorted(feasible(task, nodes), key=lambda n: n.name)
    if not feas:
        return None
    n = feas[seq % len(feas)]
    return n.name if n.has_room(task.priority) else None


def least_loaded(task: TaskReq, nodes: Sequence[NodeView], **_: object) -> str | None:
    """The node with the fewest tasks (ours in flight + others' reported) per cpu slot."""
    cands = candidates(task, nodes)
    if not cands:
        return None
    # min(cands, key=lambda n: (_load(n), n.name)) without a call and a tuple per node
    best = cands[0]
    low = _load(best)
    for n in cands:
        cpu = n.total.get("cpu", 1.0)
        load = (n.inflight + n.other) / (1.0 if cpu < 1.0 else cpu)  # == max(cpu, 1.0), NaN included
        if load < low or (load == low and n.name < best.name):
            best, low = n, load
    return best.name


def shortest_expected(
    task: TaskReq, nodes: Sequence[NodeView], *, estimator: RuntimeEstimator | None = None, **_: object
) -> str | None:
    """The node where the task is expected to *finish* first: queued work ahead of it spread
    over the node's slots, plus this function's learned runtime there. Fast nodes therefore
    receive work in proportion to their speed."""
    cands = candidates(task, nodes)
    if not cands:
        return None
    est = estimator or RuntimeEstimator()
    fn_mean = est.mean(task.fn)
    unexplored = fn_mean if fn_mean is not None else 0.0  # optimistic: the window bounds the damage
    per = est.runtimes(task.fn)
    node_means = est.node_means()
    # min over (finish, load, name), written out: no closure call or tuple per node
    best: NodeView | None = None
    low = low_load = 0.0
    for n in cands:
        name = n.name
        own = per.get(name)
        if own is None:
            own = unexplored
        cpu = n.total.get("cpu", 1.0)
        slots = 1.0 if cpu < 1.0 else cpu  # == max(cpu, 1.0), NaN included
        other = n.other
        finish = (n.backlog + other * (node_means.get(name) or own)) / slots + own
        if best is None or finish < low:
            best, low, low_load = n, finish, (n.inflight + other) / slots
        elif finish == low:
            load = (n.inflight + other) / slots
            if load < low_load or (load == low_load and name < best.name):
                best, low_load = n, load
    assert best is not None
    return best.name


def locality(task: TaskReq, nodes: Sequence[NodeView], **kw: object) -> str | None:
    """The node already holding most of the task's argument bytes; least-loaded otherwise."""
    cands = candidates(task, nodes)
    if not cands:
        return None
    if task.dep_bytes:
        best = max(cands, key=lambda n: (task.dep_bytes.get(n.name, 0), -_load(n), n.name))
        if task.dep_bytes.get(best.name, 0) > 0:
            return best.name
    return least_loaded(task, nodes, **kw)


Policy = Callable[..., "str | None"]

# The built-in heuristics as plain functions (constant). Third-party and learned policies plug
# in through :class:`aionet.scheduler.placement.PolicyRegistry`, not here.
POLICIES: MappingProxyType[str, Policy] = MappingProxyType(
    {
        "round-robin": round_robin,
        "least-loaded": least_loaded,
        "shortest-expected": shortest_expected,
        "locality": locality,
    }
)


def choose(
    policy: str,
    task: TaskReq,
    nodes: Sequence[NodeView],
    *,
    seq: int = 0,
    estimator: RuntimeEstimator | None = None,
) -> str | None:
    """Run the named policy; None means "nothing has room now" (or nothing is feasible:
    tell the two apart with :func:`feasible`)."""
    try:
        fn = POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown scheduling policy {policy!r}; choose one of {', '.join(POLICIES)}") from None
    return fn(task, nodes, seq=seq, estimator=estimator)


def window_size(slots: float, est_seconds: float | None, *, queue_time: float, max_per_slot: int) -> int:
    """How many of one owner's tasks to keep in flight on a node: its slots plus enough queued
    work to cover about ``queue_time`` seconds per slot (so message batching keeps the node
    busy between round trips), never less than one extra per slot."""
    # unknown yet: stay small (2 per slot) until the first results teach us
    per_slot = 2.0 if est_seconds is None else min(max(queue_time / max(est_seconds, 1e-7), 1.0), float(max_per_slot))
    return max(1, math.ceil(max(slots, 1.0) * (1.0 + per_slot)))


# ---------------------------------------------------------------------------- estimates


class RuntimeEstimator:
    """Per-(function, node) runtimes learned online as exponentially weighted moving averages.

    Also keeps a per-function mean (a prior for nodes that never ran the function) and a
    per-node mean over every function (to size windows and price other owners' queued work).
    """

    __slots__ = ("_by_fn_node", "_by_node", "_summary", "alpha")

    def __init__(self, alpha: float = 0.3):
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = alpha
        self._by_fn_node: dict[str, dict[str, float]] = {}
        self._by_node: dict[str, float] = {}
        self._summary: dict[str, tuple[float, float]] = {}  # fn -> (mean, fastest), until fn's next update

    def update(self, fn: str, node: str, seconds: float) -> None:
        if seconds < 0 or seconds != seconds:  # negative or NaN: ignore bad reports
            return
        a = self.alpha
        per = self._by_fn_node.get(fn)
        if per is None:
            per = self._by_fn_node[fn] = {}
        old = per.get(node)
        per[node] = seconds if old is None else old + a * (seconds - old)
        self._summary.pop(fn, None)
        old_n = self._by_node.get(node)
        self._by_node[node] = seconds if old_n is None else old_n + a * (seconds - old_n)

    def estimate(self, fn: str, node: str) -> float | None:
        per = self._by_fn_node.get(fn)
        return None if per is None else per.get(node)

    def runtimes(self, fn: str) -> Mapping[str, float]:
        """Node -> learned runtime of ``fn`` (the live table: read it, never change it)."""
        return self._by_fn_node.get(fn) or {}

    def node_means(self) -> Mapping[str, float]:
        """Node -> runtime over every function (the live table: read it, never change it)."""
        return self._by_node

    def mean(self, fn: str) -> float | None:
        got = self.summary(fn)
        return None if got is None else got[0]

    def summary(self, fn: str) -> tuple[float, float] | None:
        """``(mean, fastest)`` of ``fn``'s runtimes over the nodes that ran it (None: none did).
        Kept until ``fn`` is next updated: placement asks for it once per task, updates come
        once per completion, and many placements often fall between two completions."""
        got = self._summary.get(fn)
        if got is None:
            per = self._by_fn_node.get(fn)
            if not per:
                return None
            vals = per.values()
            got = self._summary[fn] = (sum(vals) / len(per), min(vals))
        return got

    def node_mean(self, node: str) -> float | None:
        return self._by_node.get(node)

    def forget_node(self, node: str) -> None:
        """A node died: a replacement with the same name may be a different machine."""
        self._by_node.pop(node, None)
        for per in self._by_fn_node.values():
            per.pop(node, None)
        self._summary.clear()

    def snapshot(self) -> dict[str, dict[str, float]]:
        return {fn: dict(per) for fn, per in self._by_fn_node.items()}
