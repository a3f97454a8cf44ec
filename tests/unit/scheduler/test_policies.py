"""Placement policies, windows, the estimator, the priority queue and preemption choice: pure."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.scheduler.policies import (
    POLICIES,
    NodeView,
    RuntimeEstimator,
    TaskReq,
    choose,
    feasible,
    fits,
    unsatisfiable_reason,
    window_size,
)
from aionet.scheduler.queue import Preemptible, ResourcePool, TaskQueue, pick_preemptions
from aionet.scheduler.state import normalize_resources

RES_NAMES = ["cpu", "gpu", "memory", "ssd"]

amounts = st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0, 8.0])
resources = st.dictionaries(st.sampled_from(RES_NAMES), amounts, max_size=4)


@st.composite
def node_views(draw: st.DrawFn) -> list[NodeView]:
    n = draw(st.integers(0, 6))
    out = []
    for i in range(n):
        total = draw(resources)
        free = {k: draw(st.sampled_from([0.0, v / 2, v])) for k, v in total.items()}
        window = draw(st.integers(1, 20))
        out.append(
            NodeView(
                f"n{i}",
                total,
                free=free,
                inflight=draw(st.integers(0, window + 3)),
                window=window,
                other=draw(st.integers(0, 10)),
                backlog=draw(st.floats(0, 5)),
                max_prio=draw(st.integers(-1, 3)),
            )
        )
    return out


@st.composite
def task_reqs(draw: st.DrawFn, names: list[str] | None = None) -> TaskReq:
    res = draw(resources)
    return TaskReq(
        draw(st.sampled_from(["m:f", "m:g"])),
        res,
        priority=draw(st.integers(-1, 4)),
        dep_bytes=draw(st.dictionaries(st.sampled_from([f"n{i}" for i in range(6)]), st.integers(0, 10**6))),
    )


@settings(max_examples=200, deadline=None)
@given(nodes=node_views(), task=task_reqs(), policy=st.sampled_from(sorted(POLICIES)), seq=st.integers(0, 50))
def test_every_policy_honours_hard_constraints(nodes, task, policy, seq):
    est = RuntimeEstimator()
    est.update("m:f", "n0", 0.01)
    est.update("m:f", "n1", 0.04)
    name = choose(policy, task, nodes, seq=seq, estimator=est)
    if name is None:
        return
    node = next(n for n in nodes if n.name == name)
    assert fits(task.resources, node.total), "placed on a node that can never run it"
    assert node.has_room(task.priority), "placed on a node whose window is full"
    # a scarce resource asked for is free on the chosen node whenever any candidate had it free
    scarce = {k: v for k, v in task.resources.items() if k != "cpu" and v > 0}
    if scarce and policy != "round-robin":
        cands = [n for n in feasible(task, nodes) if n.has_room(task.priority)]
        if any(fits(scarce, n.free) for n in cands):
            assert fits(scarce, node.free)


@settings(max_examples=150, deadline=None)
@given(nodes=node_views(), task=task_reqs(), policy=st.sampled_from(sorted(POLICIES)))
def test_no_choice_only_when_nothing_has_room_or_nothing_is_feasible(nodes, task, policy):
    name = choose(policy, task, nodes, seq=0, estimator=RuntimeEstimator())
    feas = feasible(task, nodes)
    if name is None and policy != "round-robin":
        assert not any(n.has_room(task.priority) for n in feas)
    if not feas:
        assert name is None
        assert "no node" in unsatisfiable_reason(task, nodes)


def test_gpu_task_never_lands_on_cpu_node_and_fails_fast_with_reason():
    nodes = [NodeView("cpu1", {"cpu": 8, "gpu": 0}), NodeView("cpu2", {"cpu": 8})]
    task = TaskReq("m:f", {"cpu": 1, "gpu": 1})
    for policy in POLICIES:
        assert choose(policy, task, nodes) is None
    assert not feasible(task, nodes)
    reason = unsatisfiable_reason(task, nodes)
    assert "gpu=1" in reason and "cpu1" in reason and "cpu2" in reason
    gpu = NodeView("g", {"cpu": 4, "gpu": 1}, free={"cpu": 4, "gpu": 1})
    for policy in POLICIES:
        assert choose(policy, task, [*nodes, gpu]) == "g"


def test_prefers_node_with_free_gpu():
    busy = NodeView("busy", {"cpu": 4, "gpu": 1}, free={"cpu": 4, "gpu": 0})
    idle = NodeView("idle", {"cpu": 4, "gpu": 1}, free={"cpu": 4, "gpu": 1}, inflight=3)
    task = TaskReq("m:f", {"cpu": 1, "gpu": 1})
    for policy in ("least-loaded", "shortest-expected", "locality"):
        assert choose(policy, task, [busy, idle]) == "idle"


def test_round_robin_is_strict_rotation():
    nodes = [NodeView(n, {"cpu": 2}, window=100) for n in ("a", "b", "c")]
    task = TaskReq("m:f", {"cpu": 1})
    assert [choose("round-robin", task, nodes, seq=i) for i in range(6)] == ["a", "b", "c", "a", "b", "c"]
    nodes[1].inflight, nodes[1].max_prio = 100, 0  # b is full: round-robin waits for it rather than skipping it
    assert choose("round-robin", task, nodes, seq=1) is None


def test_least_loaded_counts_other_owners_and_slots():
    a = NodeView("a", {"cpu": 2}, inflight=2, window=50)
    b = NodeView("b", {"cpu": 8}, inflight=4, window=50)
    task = TaskReq("m:f", {"cpu": 1})
    assert choose("least-loaded", task, [a, b]) == "b"  # 4/8 < 2/2
    b.other = 20
    assert choose("least-loaded", task, [a, b]) == "a"


def test_shortest_expected_splits_work_by_speed():
    """Simulate placing 400 tasks on two nodes, one 4x slower: the fast one gets ~4/5."""
    est = RuntimeEstimator()
    est.update("m:f", "fast", 0.01)
    est.update("m:f", "slow", 0.04)
    nodes = [NodeView("fast", {"cpu": 1}, window=10**6), NodeView("slow", {"cpu": 1}, window=10**6)]
    task = TaskReq("m:f", {"cpu": 1})
    counts = {"fast": 0, "slow": 0}
    for _ in range(400):
        name = choose("shortest-expected", task, nodes, estimator=est)
        assert name is not None
        counts[name] += 1
        view = next(n for n in nodes if n.name == name)
        view.inflight += 1
        view.backlog += est.estimate("m:f", name) or 0.0
    assert 300 <= counts["fast"] <= 340, counts
    # finishing times come out balanced
    assert math.isclose(counts["fast"] * 0.01, counts["slow"] * 0.04, rel_tol=0.15)


def test_locality_prefers_holder_then_least_loaded():
    a = NodeView("a", {"cpu": 2}, window=10)
    b = NodeView("b", {"cpu": 2}, window=10, inflight=5, max_prio=0)
    task = TaskReq("m:f", {"cpu": 1}, dep_bytes={"b": 10**8, "a": 10})
    assert choose("locality", task, [a, b]) == "b"
    b.inflight = 10  # holder full: fall back to the least loaded with room
    assert choose("locality", task, [a, b]) == "a"
    assert choose("locality", TaskReq("m:f", {"cpu": 1}), [a, NodeView("c", {"cpu": 2}, window=10)]) in "ac"


def test_affinity_and_exclusion():
    nodes = [NodeView("a", {"cpu": 2}), NodeView("b", {"cpu": 2})]
    assert choose("least-loaded", TaskReq("m:f", {"cpu": 1}, affinity="b"), nodes) == "b"
    assert choose("least-loaded", TaskReq("m:f", {"cpu": 1}, exclude=frozenset({"a"})), nodes) == "b"
    t = TaskReq("m:f", {"cpu": 1}, affinity="zz")
    assert choose("least-loaded", t, nodes) is None and "pinned to node 'zz'" in unsatisfiable_reason(t, nodes)


def test_high_priority_bypasses_full_window():
    n = NodeView("a", {"cpu": 1}, inflight=5, window=5, max_prio=0)
    assert choose("least-loaded", TaskReq("m:f", {"cpu": 1}, priority=0), [n]) is None
    assert choose("least-loaded", TaskReq("m:f", {"cpu": 1}, priority=9), [n]) == "a"


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown scheduling policy"):
        choose("random", TaskReq("m:f", {}), [])


@given(slots=st.floats(0, 64), est=st.one_of(st.none(), st.floats(0, 100)), qt=st.floats(0.001, 1))
def test_window_size_bounds(slots, est, qt):
    w = window_size(slots, est, queue_time=qt, max_per_slot=256)
    s = max(slots, 1.0)
    assert math.ceil(s * 2) <= w <= math.ceil(s * 257)


def test_window_grows_for_short_tasks_and_shrinks_for_long():
    assert window_size(2, 1e-5, queue_time=0.05, max_per_slot=256) == 2 * 257
    assert window_size(2, 0.01, queue_time=0.05, max_per_slot=256) == 12
    assert window_size(2, 10.0, queue_time=0.05, max_per_slot=256) == 4


def test_estimator_ewma_and_priors():
    e = RuntimeEstimator(alpha=0.5)
    assert e.estimate("f", "a") is None and e.mean("f") is None
    e.update("f", "a", 1.0)
    e.update("f", "a", 3.0)
    assert e.estimate("f", "a") == 2.0
    e.update("f", "b", 4.0)
    assert e.mean("f") == 3.0
    e.update("f", "b", -1.0)  # ignored
    e.update("f", "b", float("nan"))  # ignored
    assert e.estimate("f", "b") == 4.0
    e.forget_node("b")
    assert e.estimate("f", "b") is None and e.node_mean("b") is None
    with pytest.raises(ValueError):
        RuntimeEstimator(alpha=0)


def test_normalize_resources():
    assert normalize_resources(None) == {"cpu": 1.0}
    r = normalize_resources({"gpu": 1, "memory": "2GiB"})
    assert r == {"cpu": 1.0, "gpu": 1.0, "memory": float(2 * 2**30)}
    assert normalize_resources({"cpu": 0}) == {"cpu": 0.0}
    for bad in ({"cpu": -1}, {"gpu": "lots"}, {"gpu": True}, {1: 1}):
        with pytest.raises((TypeError, ValueError)):
            normalize_resources(bad)


# ---------------------------------------------------------------------------- queue


class Item:
    def __init__(self, prio: int, seq: int, res: dict | None = None):
        self.prio = prio
        self.seq = seq
        self.queued = False
        self.res = res or {"cpu": 1.0}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.booleans()), max_size=60))
def test_queue_orders_by_priority_then_fifo_with_removal(ops):
    q = TaskQueue()
    items = []
    for prio, remove in ops:
        it = Item(prio, q.next_seq())
        q.push(it)
        items.append((it, remove))
    for it, remove in items:
        if remove:
            assert q.remove(it)
            assert not q.remove(it)
    expected = sorted((it for it, r in items if not r), key=lambda i: (-i.prio, i.seq))
    assert len(q) == len(expected)
    got = []
    while (x := q.pop()) is not None:
        got.append(x)
    assert got == expected
    assert len(q) == 0 and q.peek() is None


def test_queue_tail_and_first_fitting():
    q = TaskQueue()
    its = [Item(p, q.next_seq(), {"cpu": 1.0, "gpu": 1.0} if p == 5 else None) for p in (5, 1, 0, 0)]
    for it in its:
        q.push(it)
    tail = q.tail(2)
    assert tail == [its[3], its[2]]  # lowest priority, newest first
    assert q.first_fitting({"cpu": 4.0}, 8) is its[1]  # the gpu head does not fit; the best cpu one does
    assert q.tail(10, accept=lambda i: i.prio == 1) == [its[1]]


def test_resource_pool_roundtrip():
    p = ResourcePool({"cpu": 2.0, "gpu": 1.0})
    req = {"cpu": 1.0, "gpu": 1.0}
    assert p.fits(req)
    p.acquire(req)
    assert not p.fits(req) and p.fits({"cpu": 1.0})
    p.release(req)
    assert p.free == p.total
    assert not p.could_ever_fit({"gpu": 2.0})


def test_pick_preemptions_rules():
    free = {"cpu": 0.0, "gpu": 0.0}
    running = [
        Preemptible("low-old", 0, 1.0, {"cpu": 1.0}),
        Preemptible("low-new", 0, 2.0, {"cpu": 1.0}),
        Preemptible("mid", 3, 3.0, {"cpu": 1.0}),
        Preemptible("gpu", 0, 0.5, {"cpu": 0.0, "gpu": 1.0}),
    ]
    # lowest priority first, most recently started first; only what is needed
    assert pick_preemptions({"cpu": 1.0}, 5, free, running) == ["low-new"]
    assert pick_preemptions({"cpu": 2.0}, 5, free, running) == ["low-new", "low-old"]
    # never equal or higher priority
    assert pick_preemptions({"cpu": 3.0}, 3, free, running) is None
    # only tasks that free what is missing
    assert pick_preemptions({"cpu": 0.0, "gpu": 1.0}, 1, free, running) == ["gpu"]
    # nothing to do when it already fits
    assert pick_preemptions({"cpu": 1.0}, 5, {"cpu": 1.0}, running) == []


@settings(max_examples=200, deadline=None)
@given(
    need=st.floats(0.5, 4),
    prio=st.integers(0, 5),
    running=st.lists(st.tuples(st.integers(0, 5), st.floats(0, 2)), max_size=8),
)
def test_pick_preemptions_properties(need, prio, running):
    rs = [Preemptible(i, p, float(i), {"cpu": c}) for i, (p, c) in enumerate(running)]
    got = pick_preemptions({"cpu": need}, prio, {"cpu": 0.0}, rs)
    if got is None:
        assert sum(r.res["cpu"] for r in rs if r.prio < prio) < need
        return
    chosen = [r for r in rs if r.key in got]
    assert all(r.prio < prio for r in chosen)
    assert sum(r.res["cpu"] for r in chosen) + 1e-9 >= need
