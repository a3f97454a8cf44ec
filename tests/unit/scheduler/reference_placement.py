"""The placement code as it was before the hot paths were tuned (issue 16, decision time): plain,
readable, one helper per idea. Tests run it side by side with the tuned code on generated inputs
and require the same decisions, so the tuning can never change where a task goes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aionet.scheduler.learned import HEURISTICS, LEARNED, LearnedPolicy, node_features
from aionet.scheduler.placement import PolicyContext
from aionet.scheduler.policies import EPS, NodeView, RuntimeEstimator, TaskReq, feasible, fits


def _scarce_free(task: TaskReq, nodes: list[NodeView]) -> list[NodeView]:
    scarce = {k: v for k, v in task.resources.items() if k != "cpu" and v > EPS}
    if not scarce:
        return nodes
    free = [n for n in nodes if fits(scarce, n.free)]
    return free or nodes


def _preferred(resource: str, nodes: list[NodeView]) -> list[NodeView]:
    most = max(n.free.get(resource, 0.0) for n in nodes)
    if most <= EPS:
        return nodes
    return [n for n in nodes if n.free.get(resource, 0.0) >= most - EPS]


def candidates(task: TaskReq, nodes: Sequence[NodeView]) -> list[NodeView]:
    cands = _scarce_free(task, [n for n in feasible(task, nodes) if n.has_room(task.priority)])
    return _preferred(task.prefer, cands) if task.prefer and len(cands) > 1 else cands


def _load(n: NodeView) -> float:
    return (n.inflight + n.other) / n.slots


def least_loaded(task: TaskReq, nodes: Sequence[NodeView], **_: object) -> str | None:
    cands = candidates(task, nodes)
    if not cands:
        return None
    return min(cands, key=lambda n: (_load(n), n.name)).name


def shortest_expected(
    task: TaskReq, nodes: Sequence[NodeView], *, estimator: RuntimeEstimator | None = None, **_: object
) -> str | None:
    cands = candidates(task, nodes)
    if not cands:
        return None
    est = estimator or RuntimeEstimator()
    fn_mean = est.mean(task.fn)

    def finish(n: NodeView) -> tuple[float, float, str]:
        own = est.estimate(task.fn, n.name)
        if own is None:
            own = fn_mean if fn_mean is not None else 0.0
        per_task = est.node_mean(n.name) or own
        wait = (n.backlog + n.other * per_task) / n.slots
        return (wait + own, _load(n), n.name)

    return min(cands, key=finish).name


def locality(task: TaskReq, nodes: Sequence[NodeView], **kw: object) -> str | None:
    cands = candidates(task, nodes)
    if not cands:
        return None
    if task.dep_bytes:
        best = max(cands, key=lambda n: (task.dep_bytes.get(n.name, 0), -_load(n), n.name))
        if task.dep_bytes.get(best.name, 0) > 0:
            return best.name
    return least_loaded(task, nodes, **kw)


REF_HEURISTICS = {"shortest-expected": shortest_expected, "least-loaded": least_loaded, "locality": locality}
assert set(REF_HEURISTICS) == set(HEURISTICS)


class ReferenceLearned(LearnedPolicy):
    """The learned policy with its decision path as it was: separate candidate filtering, the
    fused loop reading ``NodeView.slots``, features recomputed for the chosen node."""

    def _arm(self) -> str:
        if self.follow is not None:
            return self.follow
        if self.rng.random() >= self.cfg.probe:
            return self.fallback or LEARNED
        return self._probe_arm()

    def choose(self, task: TaskReq, nodes: Sequence[NodeView], ctx: PolicyContext) -> str | None:
        est = ctx.estimator or RuntimeEstimator()
        per = est.runtimes(task.fn)
        if not per:
            return shortest_expected(task, nodes, estimator=est)
        mean = est.mean(task.fn) or 0.0
        cfg = self.cfg
        track = mean >= cfg.learn_all_above or self.rng.random() * cfg.learn_all_above < mean
        arm = self._arm() if track else (self.fallback or LEARNED)
        if arm != LEARNED:
            name = REF_HEURISTICS[arm](task, nodes, estimator=est)
            if name is None or not track:
                return name
            n = next(v for v in nodes if v.name == name)
        else:
            cands = candidates(task, nodes)
            if not cands:
                return None
            n = None
        self.decisions += 1
        best = min(per.values())
        scale = max(mean, cfg.min_scale)
        dep_total = sum(task.dep_bytes.values()) if task.dep_bytes else 0
        if n is None:
            if track and len(cands) > 1 and self.rng.random() < self.epsilon:
                n = cands[self.rng.randrange(len(cands))]
            else:
                n = self._ref_cheapest(task, cands, per, est.node_means(), mean, scale, best, dep_total)
        if not track:
            return n.name
        pend = self._pending
        if len(pend) >= cfg.max_pending:
            del pend[next(iter(pend))]
        pend[task.tid] = (node_features(task, n, est, scale, best, dep_total), arm, scale)
        return n.name

    def _ref_cheapest(
        self,
        task: TaskReq,
        cands: list[NodeView],
        per: Mapping[str, float],
        node_mean: Mapping[str, float],
        mean: float,
        scale: float,
        best: float,
        dep_total: int,
    ) -> NodeView:
        w0, w_run, w_wait, w_queued, w_cont, w_load, w_slow, w_remote, w_gpu, w_unknown = self.model.wt
        inv = 1.0 / scale
        inv_best = 1.0 / best if best > 0.0 else 0.0
        gpu_task = task.resources.get("gpu", 0.0) > EPS
        deps = task.dep_bytes
        out, low = cands[0], float("inf")
        for n in cands:
            name = n.name
            r = per.get(name)
            c = w0
            if r is None:
                r = mean
                c += w_unknown
            slots = n.slots
            busy = n.inflight + n.other
            load = busy / slots
            wait = (n.backlog + n.other * node_mean.get(name, r)) / slots
            c += w_run * r * inv + w_wait * wait * inv + w_cont * r * load * inv + w_load * load
            if busy > slots:
                c += w_queued * (busy - slots) * (wait / busy) * inv
            if inv_best:
                c += w_slow * (r * inv_best - 1.0)
            if dep_total:
                c += w_remote * (1.0 - deps.get(name, 0) / dep_total)
            if not gpu_task and n.total.get("gpu", 0.0) > EPS:
                c += w_gpu
            if c < low:
                out, low = n, c
        return out
