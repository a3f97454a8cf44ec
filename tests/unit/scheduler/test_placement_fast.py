"""The tuned placement hot paths decide exactly as the plain reference code does
(``reference_placement.py``): same candidates, same heuristic choices, and the learned policy
places the same tasks on the same nodes, explores and learns identically, on generated inputs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.scheduler.learned import FEATURES, LearnedConfig, LearnedPolicy
from aionet.scheduler.placement import Completion, PolicyContext
from aionet.scheduler.policies import NodeView, RuntimeEstimator, TaskReq, candidates, least_loaded, locality
from aionet.scheduler.policies import shortest_expected as se

from . import reference_placement as ref
from .test_policies import node_views, task_reqs

cpu_tasks = st.builds(
    TaskReq,
    st.sampled_from(["m:f", "m:g"]),
    st.sampled_from([{"cpu": 1.0}, {"cpu": 0.0}, {"cpu": 4.0}, {"gpu": 1.0}, {"memory": 2.0}]),
    priority=st.integers(-1, 4),
    dep_bytes=st.dictionaries(st.sampled_from([f"n{i}" for i in range(6)]), st.integers(0, 10**6), max_size=2),
)
tasks = st.one_of(task_reqs(), cpu_tasks)
runtimes = st.lists(st.one_of(st.floats(1e-5, 5), st.sampled_from([0.0, 0.01, 0.02])), max_size=6)


def estimator(nodes: list[NodeView], rts: list[float]) -> RuntimeEstimator:
    est = RuntimeEstimator()
    for n, r in zip(nodes, rts, strict=False):  # some nodes stay unknown
        est.update("m:f", n.name, r)
        est.update("m:g", n.name, 2 * r)
    return est


@settings(max_examples=300, deadline=None)
@given(nodes=node_views(), task=tasks, rts=runtimes)
def test_heuristics_and_candidates_match_the_reference(nodes, task, rts) -> None:
    est = estimator(nodes, rts)
    assert [n.name for n in candidates(task, nodes)] == [n.name for n in ref.candidates(task, nodes)]
    assert least_loaded(task, nodes) == ref.least_loaded(task, nodes)
    assert se(task, nodes, estimator=est) == ref.shortest_expected(task, nodes, estimator=est)
    assert locality(task, nodes) == ref.locality(task, nodes)


weights = st.lists(st.floats(-3, 3, allow_nan=False), min_size=len(FEATURES), max_size=len(FEATURES))


@settings(max_examples=150, deadline=None)
@given(
    nodes=node_views(),
    seq=st.lists(st.tuples(tasks, st.floats(1e-4, 0.05)), min_size=1, max_size=40),
    rts=runtimes,
    w=weights,
    probe=st.sampled_from([0.0, 0.1, 0.5]),
    eps=st.sampled_from([0.0, 0.05, 0.5]),
    seed=st.integers(0, 3),
)
def test_learned_policy_matches_the_reference_decision_for_decision(nodes, seq, rts, w, probe, eps, seed) -> None:
    """Same seed, same inputs: the same node every time, the same features recorded, the same
    weights after refits (so the rest of a run is the same too)."""
    cfg = LearnedConfig(seed=seed, probe=probe, epsilon=eps, batch=4, window=4)
    fast, plain = LearnedPolicy(cfg), ref.ReferenceLearned(cfg)
    fast.model.wt = plain.model.wt = tuple(w)
    est = estimator(nodes, rts)
    ctx = PolicyContext(estimator=est)
    for tid, (task, runtime) in enumerate(seq):
        t = TaskReq(task.fn, task.resources, task.priority, task.dep_bytes, task.affinity, task.exclude, tid)
        got, want = fast.choose(t, nodes, ctx), plain.choose(t, nodes, ctx)
        assert got == want
        assert fast._pending.get(tid) == plain._pending.get(tid)
        if got is not None:
            done = Completion(tid, t.fn, got, runtime, runtime * 1.5, tid % 3, 2.0)
            fast.observe(done)
            plain.observe(done)
            est.update(t.fn, got, runtime)
    assert fast.model.wt == plain.model.wt
    assert fast.decisions == plain.decisions and fast.fallback == plain.fallback
