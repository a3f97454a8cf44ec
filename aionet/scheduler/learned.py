"""``policy = "learned"``: a contextual bandit that learns what a placement really costs.

Each candidate node is described by a few features the owner already has (the function's
learned runtime there, the queued work ahead, the load, how much slower the node is than the
best one for this function, argument bytes that would have to move, whether a spare GPU would be
tied up). A linear model predicts the *cost* of placing the task there, in units of the
function's mean runtime, and the policy picks the cheapest node. The cost it learns from is the
task's completion time plus a utilisation term: the runtime it consumed times the tasks that
queued behind it (the delay it imposed on others). Minimising only one's own completion time is
what ``shortest-expected`` does; charging for the capacity used is what lets the learned policy
keep fast nodes for the work they are fastest at when the cluster is busy.

The model starts at exactly ``shortest-expected`` (weight 1 on runtime and on queued work) and
moves away from it only as evidence arrives (ridge regression towards that prior, with
forgetting so it tracks a changing workload). The weight on queued work stays at the prior by
default: the queue the owner sees is a noisy measure of the real wait, regression shrinks the
weight of a noisy input, and a model that under-prices queues piles work onto fast nodes and
drains a backlog late (see ``CostModel._solve``). Exploration is epsilon-greedy with a decaying
epsilon. A guard runs a small random share of placements with the heuristics and compares costs
over a sliding window; whenever the learned choices cost more than the best heuristic's by more
than ``margin``, the heuristic takes over (the learned model keeps learning from probes) until
the learned model is better again, so a workload shift can cost only a bounded amount. While a
heuristic holds, only the learned arm probes. Samples measured behind long queues count less
(``LearnedConfig.backlog_discount``): their cost is mostly queueing the features cannot see.

Everything here is pure: no clocks, no I/O except :meth:`LearnedPolicy.save` / :meth:`load`.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import Any

import numpy as np

from .placement import Completion, PolicyContext
from .policies import EPS, NodeView, RuntimeEstimator, TaskReq, candidates, least_loaded, locality, shortest_expected

__all__ = ["FEATURES", "CostModel", "LearnedConfig", "LearnedPolicy", "node_features", "sample_weight"]

FEATURES = ("bias", "runtime", "wait", "queued", "contention", "load", "slowdown", "remote", "spare_gpu", "unknown")
# the prior: predicted cost = expected runtime + work queued (not running) ahead of the task
PRIOR = (0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
HEURISTICS = {"shortest-expected": shortest_expected, "least-loaded": least_loaded, "locality": locality}
LEARNED = "learned"


@dataclass(frozen=True, slots=True)
class LearnedConfig:
    """Knobs of the learned policy (the defaults are what the simulator's numbers used)."""

    epsilon: float = 0.05  # initial exploration rate (uniform random feasible node)
    epsilon_min: float = 0.002
    epsilon_decay: float = 2000.0  # decisions until epsilon halves
    ridge: float = 20.0  # pull towards the prior (in samples' worth of evidence)
    memory: float = 1600.0  # samples: older evidence fades with this time constant, so the model tracks shifts
    batch: int = 32  # completions per refit and guard check (smaller reacts faster to a shift; costs ~1 us a task)
    probe: float = 0.1  # share of placements made by the heuristics (the guard's evidence)
    window: int = 64  # completions per arm the guard compares
    margin: float = 0.05  # the learned arm may cost this much more before the guard steps in
    heuristics: tuple[str, ...] = ("shortest-expected", "least-loaded")
    # weights held at the prior (see CostModel._solve); learning "queued" too made windows after
    # a shift near saturation up to 79 % worse than shortest-expected's (BENCHMARKS.md, issue 16)
    fixed: tuple[str, ...] = ("queued",)
    # a sample counts 1 / (1 + wait + queued) ** backlog_discount (in mean runtimes): a cost measured
    # in a backlog is mostly queueing the features cannot see, and fitted at full weight it taught
    # spurious weights (remote data "cheap", GPU nodes "cheap") that made post-shift windows near
    # saturation up to 23 % worse than shortest-expected's (BENCHMARKS.md, issue 16). 0: all count.
    backlog_discount: float = 2.0
    learn_all_above: float = 0.001  # s: shorter tasks teach on a sample (mean runtime / this of them)
    min_scale: float = 0.001  # s: costs are in units of max(mean runtime, this) (sub-ms tasks cost messaging)
    max_pending: int = 65536  # placements awaiting completion (older ones are forgotten)
    max_records: int = 200_000  # rows kept for offline training when recording
    seed: int | None = None

    def __post_init__(self) -> None:
        for h in self.heuristics:
            if h not in HEURISTICS:
                raise ValueError(f"unknown heuristic {h!r} for the guard; choose from {', '.join(HEURISTICS)}")
        if not self.heuristics:
            raise ValueError("the guard needs at least one heuristic")
        if not 0.0 <= self.probe < 1.0 or not 0.0 <= self.epsilon <= 1.0:
            raise ValueError("probe must be in [0, 1) and epsilon in [0, 1]")
        if not self.memory > 0 or self.batch < 1 or self.window < 2:
            raise ValueError("memory must be positive, batch >= 1, window >= 2")
        if not self.backlog_discount >= 0.0:
            raise ValueError("backlog_discount must be >= 0 (0 counts every sample fully)")


def node_features(
    task: TaskReq, n: NodeView, est: RuntimeEstimator, scale: float, best: float, dep_total: int
) -> list[float]:
    """The feature vector (see :data:`FEATURES`) of placing ``task`` on ``n``; times are in
    units of ``scale`` (the function's mean runtime) so one model fits fast and slow functions."""
    r = est.estimate(task.fn, n.name)
    unknown = r is None
    if r is None:
        r = est.mean(task.fn) or 0.0
    per_task = est.node_mean(n.name) or r
    slots = n.slots
    load = (n.inflight + n.other) / slots
    wait = (n.backlog + n.other * per_task) / slots
    busy = n.inflight + n.other
    queued = (busy - slots) * (wait / busy) if busy > slots else 0.0  # the share of it not yet running
    remote = 0.0
    if dep_total:
        remote = 1.0 - task.dep_bytes.get(n.name, 0) / dep_total
    spare_gpu = 1.0 if n.total.get("gpu", 0.0) > EPS and task.resources.get("gpu", 0.0) <= EPS else 0.0
    return [
        1.0,
        r / scale,
        wait / scale,
        queued / scale,
        r * load / scale,
        load,
        r / best - 1.0 if best > 0.0 else 0.0,
        remote,
        spare_gpu,
        1.0 if unknown else 0.0,
    ]


WAIT, QUEUED = FEATURES.index("wait"), FEATURES.index("queued")


def sample_weight(x: Sequence[float], discount: float) -> float:
    """How much one (features, cost) sample counts: ``1 / (1 + wait + queued) ** discount``.

    The work queued ahead of a task is known only roughly (the owner's estimate of running and
    queued work), so a cost measured behind a long queue is mostly queueing noise; at full weight
    such samples pull the other weights towards whatever happened to coincide with the backlog.
    Samples from idle nodes (wait = queued = 0) count fully; NaN features count fully too (the
    fit then rejects them as before)."""
    if not discount:
        return 1.0
    d = 1.0 + x[WAIT] + x[QUEUED]
    return d**-discount if d > 1.0 else 1.0


class CostModel:
    """Weighted ridge regression of placement cost on :data:`FEATURES`, towards a prior, with
    forgetting.

    Kept as sufficient statistics (``A = sum v x x^T``, ``b = sum v x y``, ``v`` the sample's
    :func:`sample_weight`), refitted every ``batch`` samples with one small solve, so learning
    costs well under a microsecond per completion."""

    def __init__(
        self,
        ridge: float = 20.0,
        memory: float = math.inf,
        prior: Sequence[float] = PRIOR,
        fixed: Sequence[str] = (),
        backlog_discount: float = 0.0,
    ):
        d = len(FEATURES)
        if len(prior) != d:
            raise ValueError(f"prior needs {d} weights ({', '.join(FEATURES)})")
        unknown = set(fixed) - set(FEATURES)
        if unknown:
            raise ValueError(f"cannot fix unknown features {sorted(unknown)}; features are {', '.join(FEATURES)}")
        self.fixed = np.array([f in fixed for f in FEATURES])
        self.ridge = float(ridge)
        self.memory = float(memory)  # samples; inf: never forget
        self.discount = float(backlog_discount)
        self.prior = np.asarray(prior, dtype=np.float64)
        self.A = np.zeros((d, d))
        self.b = np.zeros(d)
        self.w = self.prior.copy()
        self.wt: tuple[float, ...] = tuple(self.w.tolist())  # plain floats for the decision path
        self.samples = 0
        self._xs: list[list[float]] = []
        self._ys: list[float] = []
        self._vs: list[float] = []

    def predict(self, x: Sequence[float]) -> float:
        return sum(w * v for w, v in zip(self.wt, x, strict=True))

    def add(self, x: list[float], y: float) -> None:
        """Buffer one (features, cost) sample; call :meth:`fit` to fold the buffer in."""
        if y == y and abs(y) < 1e9:  # drop NaN and absurd outliers (a clock jump)
            self._xs.append(x)
            self._ys.append(y)
            self._vs.append(sample_weight(x, self.discount))

    def pending(self) -> int:
        return len(self._ys)

    def fit(self) -> None:
        """Fold buffered samples into the statistics (older ones decayed) and re-solve."""
        if self._ys:
            X = np.asarray(self._xs, dtype=np.float64)
            y = np.asarray(self._ys, dtype=np.float64)
            Xv = X * np.asarray(self._vs, dtype=np.float64)[:, None]
            self._xs, self._ys, self._vs = [], [], []
            fade = math.exp(-len(y) / self.memory)  # per sample, whatever the batch size
            self.A *= fade
            self.b *= fade
            self.A += Xv.T @ X
            self.b += Xv.T @ y
            self.samples += len(y)
        self._solve()

    def fit_offline(self, X: np.ndarray, y: np.ndarray) -> None:
        """Replace what was learned with a fit of recorded samples (rows of :data:`FEATURES`)."""
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != len(FEATURES) or X.shape[0] != y.shape[0]:
            raise ValueError(f"need X of shape (n, {len(FEATURES)}) and y of shape (n,), got {X.shape}, {y.shape}")
        ok = np.isfinite(y) & np.isfinite(X).all(axis=1)
        X, y = X[ok], y[ok]
        Xv = X * np.array([sample_weight(x, self.discount) for x in X.tolist()])[:, None]
        self.A = Xv.T @ X
        self.b = Xv.T @ y
        self.samples = len(y)
        self._solve()

    def _solve(self) -> None:
        """Ridge towards the prior for the free weights; fixed weights stay at the prior (the
        regression then explains what they leave over). Fixing the queued-work weight matters:
        the queue estimate is a noisy measure of the real wait, and regression on a noisy input
        shrinks its weight (attenuation), which would make the policy pile work onto fast nodes."""
        lam = self.ridge
        free = ~self.fixed
        k = int(free.sum())
        w = self.prior.copy()
        if k == len(w):  # nothing fixed: the plain ridge solve (no fancy indexing on the hot path)
            try:
                w = np.linalg.solve(self.A + lam * np.eye(k), self.b + lam * self.prior)
            except np.linalg.LinAlgError:
                return
        elif k:
            A_ff = self.A[np.ix_(free, free)]
            rhs = self.b[free] - self.A[np.ix_(free, self.fixed)] @ self.prior[self.fixed] + lam * self.prior[free]
            try:
                w[free] = np.linalg.solve(A_ff + lam * np.eye(k), rhs)
            except np.linalg.LinAlgError:
                return
        if np.isfinite(w).all():
            self.w = w
            self.wt = tuple(w.tolist())

    def state(self) -> dict[str, np.ndarray]:
        return {"w": self.w, "A": self.A, "b": self.b, "prior": self.prior, "samples": np.array(self.samples)}

    def set_state(self, st: Any) -> None:
        d = len(FEATURES)
        w = np.asarray(st["w"], dtype=np.float64)
        if w.shape != (d,):
            raise ValueError(f"weights have shape {w.shape}, expected ({d},): saved by another version?")
        self.w = w
        self.wt = tuple(w.tolist())
        self.A = np.asarray(st["A"], dtype=np.float64)
        self.b = np.asarray(st["b"], dtype=np.float64)
        self.prior = np.asarray(st["prior"], dtype=np.float64)
        self.samples = int(st["samples"])


class LearnedPolicy:
    """The ``learned`` placement policy (see the module docstring). One instance per owner."""

    def __init__(self, config: LearnedConfig | None = None, *, record: bool = False, follow: str | None = None):
        """``record``: keep (features, cost) rows of every completed placement for offline
        training (:meth:`records`). ``follow``: place exactly as that heuristic does while
        learning from its placements (to record a heuristic, or to warm up in shadow mode)."""
        self.cfg = cfg = config or LearnedConfig()
        if follow is not None and follow not in HEURISTICS:
            raise ValueError(f"follow must be one of {', '.join(HEURISTICS)}, not {follow!r}")
        self.follow = follow
        self.model = CostModel(cfg.ridge, cfg.memory, fixed=cfg.fixed, backlog_discount=cfg.backlog_discount)
        self.rng = random.Random(cfg.seed)
        self.decisions = 0
        self.fallback: str | None = None  # the heuristic in charge while the guard holds
        self.windows: dict[str, deque[float]] = {a: deque(maxlen=cfg.window) for a in (LEARNED, *cfg.heuristics)}
        self.switches = 0
        self._pending: dict[int, tuple[list[float], str, float]] = {}
        self.wants = self._pending.__contains__  # the owner skips completions we did not track
        self._record = record
        self._rows_x: deque[list[float]] = deque(maxlen=cfg.max_records)
        self._rows_y: deque[float] = deque(maxlen=cfg.max_records)
        self._probe_turn = 0
        self._level: float | None = None  # moving average of every arm's cost (see observe)

    # ------------------------------------------------------------------ deciding
    @property
    def epsilon(self) -> float:
        c = self.cfg
        return max(c.epsilon_min, c.epsilon / (1.0 + self.decisions / c.epsilon_decay))

    def _probe_arm(self) -> str:
        """Which other arm makes this probe placement. While a heuristic holds, always the learned
        arm: it is the only one whose evidence can end the hand-over, and a probe by another
        heuristic (least-loaded sends work to idle slow nodes) is the expensive kind in the
        backlog that usually caused the hand-over. Otherwise mostly the best-looking heuristic."""
        c = self.cfg
        self._probe_turn += 1
        if self.fallback is not None:
            return LEARNED
        others = c.heuristics
        if len(others) > 1 and self._probe_turn % 4:  # 3 probes in 4 go to the best-looking other arm
            return min(others, key=self._arm_cost)
        return others[self._probe_turn % len(others)]

    def _arm_cost(self, arm: str) -> float:
        """An arm's mean relative cost over its window (unknown: 0, so it gets probed)."""
        w = self.windows[arm]
        return sum(w) / len(w) if len(w) >= self.cfg.window // 2 else 0.0

    def choose(self, task: TaskReq, nodes: Sequence[NodeView], ctx: PolicyContext) -> str | None:
        est = ctx.estimator or RuntimeEstimator()
        got = est.summary(task.fn)
        if got is None:  # never ran anywhere: nothing to learn from yet
            return shortest_expected(task, nodes, estimator=est)
        mean, best = got
        mean = mean or 0.0
        # learn from every placement of tasks that run at least ``learn_all_above``; from a
        # proportional sample of shorter ones, so bookkeeping stays a small share of the work
        cfg = self.cfg
        rng = self.rng
        track = mean >= cfg.learn_all_above or rng.random() * cfg.learn_all_above < mean
        # who decides: the learned model, or a heuristic (a probe, or the fallback while the guard holds)
        if not track:
            arm = self.fallback or LEARNED
        elif self.follow is not None:
            arm = self.follow
        elif rng.random() >= cfg.probe:
            arm = self.fallback or LEARNED
        else:
            arm = self._probe_arm()
        scale = cfg.min_scale if cfg.min_scale > mean else mean  # max(mean, min_scale), NaN included
        deps = task.dep_bytes
        dep_total = sum(deps.values()) if deps else 0
        if arm != LEARNED:
            name = HEURISTICS[arm](task, nodes, estimator=est)
            if name is None or not track:
                return name
            n = next(v for v in nodes if v.name == name)
            self.decisions += 1
        else:
            per, node_means = est.runtimes(task.fn), est.node_means()
            n, count = self._cheapest(task, nodes, per, node_means, mean, scale, best, dep_total)
            if n is None:
                return None
            self.decisions += 1
            if track and count > 1 and rng.random() < self.epsilon:
                cands = candidates(task, nodes)
                n = cands[rng.randrange(len(cands))]
            if not track:
                return n.name
        pend = self._pending
        if len(pend) >= cfg.max_pending:  # lost tasks never complete: forget the oldest
            del pend[next(iter(pend))]
        pend[task.tid] = (node_features(task, n, est, scale, best, dep_total), arm, scale)
        return n.name

    def _cheapest(
        self,
        task: TaskReq,
        nodes: Sequence[NodeView],
        per: Mapping[str, float],
        node_mean: Mapping[str, float],
        mean: float,
        scale: float,
        best: float,
        dep_total: int,
    ) -> tuple[NodeView | None, int]:
        """The candidate (see :func:`~aionet.scheduler.policies.candidates`) the model predicts
        cheapest, and how many candidates there were. This is the per-task hot path, so for the
        common task (cpu only, no pins or preferences) the candidate filter, :func:`node_features`
        and the dot product are fused into one loop over plain floats with nothing called per node.
        The arithmetic is exactly that of the plain version in the tests (same operations, same
        order), so the choice is too."""
        res = task.resources
        if len(res) == 1 and "cpu" in res and task.affinity is None and not task.exclude and not task.prefer:
            pool, need = nodes, res["cpu"]
        else:  # already filtered: the checks below then pass for every node
            pool, need = candidates(task, nodes), 0.0
        w0, w_run, w_wait, w_queued, w_cont, w_load, w_slow, w_remote, w_gpu, w_unknown = self.model.wt
        inv = 1.0 / scale
        inv_best = 1.0 / best if best > 0.0 else 0.0
        gpu_task = res.get("gpu", 0.0) > EPS
        deps = task.dep_bytes
        prio = task.priority
        per_get = per.get
        node_mean_get = node_mean.get
        out, low, count = None, math.inf, 0
        for n in pool:
            if not (n.inflight < n.window or prio > n.max_prio):  # NodeView.has_room
                continue
            total = n.total
            cpu = total.get("cpu")
            if cpu is None:
                if need > EPS:  # fits() counts an unlisted resource as zero
                    continue
                cpu = 1.0
            elif need > EPS and cpu + EPS < need:
                continue
            count += 1
            slots = 1.0 if cpu < 1.0 else cpu  # NodeView.slots: max(cpu, 1.0), NaN included
            name = n.name
            r = per_get(name)
            c = w0
            if r is None:
                r = mean
                c += w_unknown
            other = n.other
            busy = n.inflight + other
            load = busy / slots
            wait = (n.backlog + other * node_mean_get(name, r)) / slots
            c += w_run * r * inv + w_wait * wait * inv + w_cont * r * load * inv + w_load * load
            if busy > slots:
                c += w_queued * (busy - slots) * (wait / busy) * inv
            if inv_best:
                c += w_slow * (r * inv_best - 1.0)
            if dep_total:
                c += w_remote * (1.0 - deps.get(name, 0) / dep_total)
            if not gpu_task and total.get("gpu", 0.0) > EPS:
                c += w_gpu
            if c < low:
                out, low = n, c
        if out is None and count:  # every cost NaN or infinite: the first candidate, as min() would
            out = candidates(task, nodes)[0]
        return out, count

    # ------------------------------------------------------------------ learning
    @staticmethod
    def cost(done: Completion, scale: float) -> float:
        """What a placement cost, in units of the function's mean runtime: its completion time
        plus the delay its runtime imposed on the tasks queued behind it (utilisation term)."""
        return (done.latency + done.runtime * done.behind / max(done.slots, 1.0)) / scale

    def observe(self, done: Completion) -> None:
        p = self._pending.pop(done.tid, None)
        if p is None:
            return
        x, arm, scale = p
        y = self.cost(done, scale)
        self.model.add(x, y)
        # the guard compares arms on cost relative to the current level of all costs, so a burst
        # that raises everyone's cost does not count against the arm whose samples are recent
        level = self._level = y if self._level is None else self._level + 0.02 * (y - self._level)
        self.windows[arm].append(y / level if level > 0 else 1.0)
        if self._record:
            self._rows_x.append(x)
            self._rows_y.append(y)
        if self.model.pending() >= self.cfg.batch:
            self.model.fit()
            self._guard()

    def _guard(self) -> None:
        """Hand placement to the best heuristic while the learned arm costs more than it."""
        c = self.cfg
        full = c.window // 2
        means = {a: sum(w) / len(w) for a, w in self.windows.items() if len(w) >= full}
        learned = means.pop(LEARNED, None)
        if learned is None or not means:
            return
        best = min(means, key=means.__getitem__)
        if self.fallback is None:
            if learned > means[best] * (1.0 + c.margin):
                self.fallback = best
                self.switches += 1
        elif learned < means[best]:
            self.fallback = None
            self.switches += 1
        elif best != self.fallback:
            self.fallback = best

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | PathLike[str]) -> None:
        """Write the weights and the evidence behind them (``.npz``)."""
        np.savez(path, features=np.array(FEATURES), decisions=np.array(self.decisions), **self.model.state())

    def load(self, path: str | PathLike[str]) -> None:
        """Continue from weights saved by :meth:`save` (ValueError if the features differ)."""
        with np.load(path) as st:
            if tuple(str(f) for f in st["features"]) != FEATURES:
                raise ValueError(f"{path}: weights were saved for features {list(st['features'])}, not {FEATURES}")
            self.model.set_state(st)
            self.decisions = int(st["decisions"])

    def records(self) -> tuple[np.ndarray, np.ndarray]:
        """Recorded (features, cost) rows (with ``record=True``), for :meth:`train_offline`."""
        return np.asarray(list(self._rows_x), dtype=np.float64).reshape(-1, len(FEATURES)), np.asarray(self._rows_y)

    def save_records(self, path: str | PathLike[str]) -> None:
        X, y = self.records()
        np.savez(path, X=X, y=y, features=np.array(FEATURES))

    def train_offline(self, X: np.ndarray | str | PathLike[str], y: np.ndarray | None = None) -> None:
        """Fit the model to recorded placements: arrays, or a file from :meth:`save_records`."""
        if y is None:
            with np.load(X) as st:
                X, y = st["X"], st["y"]
        self.model.fit_offline(np.asarray(X), y)

    def stats(self) -> dict[str, Any]:
        """How the policy is doing (for benchmarks and debugging)."""
        return {
            "decisions": self.decisions,
            "epsilon": self.epsilon,
            "fallback": self.fallback,
            "switches": self.switches,
            "samples": self.model.samples,
            "weights": dict(zip(FEATURES, self.model.wt, strict=True)),
        }
