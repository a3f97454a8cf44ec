#!/usr/bin/env python
"""Placement simulator: the scheduler's own policy objects on a virtual-time cluster.

No processes, no sockets: a discrete-event simulation of one owner placing tasks on
heterogeneous nodes, using exactly what the real owner uses (``PolicyRegistry`` policy objects,
``NodeView`` snapshots, ``RuntimeEstimator``, ``window_size`` windows, ``Completion`` feedback).

The workload (seeded; every policy sees the same tasks, arrival times and noise):

* nodes: two GPU nodes (4 cpu slots, 2 GPUs; "vector" work runs 6x faster there), two fast-CPU
  nodes (8 slots, parsing twice as fast) and two slow nodes (8 slots, 1.5-2x slower);
* task types: ``parse`` (cpu), ``vector`` (cpu, much faster on a GPU node), ``train``
  (needs ``gpu=1``) and ``io`` (reads 4 MB held on one node: remote reads pay 10 ms);
* bursty arrivals: a two-state Markov-modulated Poisson process (bursts at 1.7x the mean
  rate, lulls at 0.5x);
* a mid-run shift at half the tasks: the mix moves towards ``vector`` and ``train`` and one
  fast-CPU node becomes 3x slower (a worker slowed by a noisy neighbour).

Reported per policy: mean and p99 completion time (arrival to result), utilisation (busy
slot-seconds over slot-seconds until the last completion), and after the shift the mean
completion time of every window of 1,000 tasks, learned against the best heuristic in that
window. ``--json`` writes everything; ``--plot`` draws the windows (needs matplotlib).

    python benchmarks/placement_sim.py                 # 40,000 tasks, about a minute
    python benchmarks/placement_sim.py --tasks 6000 --seed 3 --json sim.json --plot sim.png
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aionet.scheduler.learned import LearnedConfig, LearnedPolicy
from aionet.scheduler.placement import Completion, PlacementPolicy, PolicyContext, PolicyRegistry, PolicySet
from aionet.scheduler.policies import NodeView, RuntimeEstimator, TaskReq, candidates, shortest_expected, window_size

POLICIES = ("round-robin", "least-loaded", "shortest-expected", "locality", "learned")
HEURISTICS = POLICIES[:-1]

# base runtimes (seconds) and what each task type asks for
TYPES: dict[str, dict[str, Any]] = {
    "parse": {"base": 0.004, "res": {"cpu": 1.0}},
    "vector": {"base": 0.020, "res": {"cpu": 1.0}},
    "train": {"base": 0.030, "res": {"cpu": 1.0, "gpu": 1.0}},
    "io": {"base": 0.006, "res": {"cpu": 1.0}, "bytes": 4 * 2**20},
}
REMOTE_READ = 0.010  # seconds to fetch an io task's input from another node
MIX_BEFORE = {"parse": 0.49, "vector": 0.27, "train": 0.02, "io": 0.22}
MIX_AFTER = {"parse": 0.31, "vector": 0.44, "train": 0.03, "io": 0.22}


@dataclass
class SimNode:
    name: str
    cpu: int
    gpu: int
    factor: dict[str, float]  # runtime multiplier per task type
    running_cpu: int = 0
    running_gpu: int = 0
    queue: deque[Task] = field(default_factory=deque)
    busy: float = 0.0  # slot-seconds spent running


@dataclass
class Task:
    tid: int
    kind: str
    arrival: float
    noise: float
    data_at: str | None
    req: TaskReq
    node: str = ""
    placed: float = 0.0
    est: float = 0.0
    runtime: float = 0.0
    done: float = -1.0


class Perturbed:
    """``shortest-expected`` with a small share of placements sent to a random candidate: the
    noise floor of the window bar. Near saturation the queueing is chaotic, so two runs that
    differ in a handful of placements already differ by more than 5 % in some windows."""

    def __init__(self, share: float, seed: int):
        self.share = share
        self.rng = random.Random(seed)

    def choose(self, task: TaskReq, nodes: Sequence[NodeView], ctx: PolicyContext) -> str | None:
        if self.rng.random() < self.share:
            cands = candidates(task, nodes)
            return cands[self.rng.randrange(len(cands))].name if cands else None
        return shortest_expected(task, nodes, estimator=ctx.estimator)


def make_nodes() -> list[SimNode]:
    gpu = {"parse": 1.0, "vector": 0.15, "train": 1.0, "io": 1.0}
    fast = {"parse": 0.5, "vector": 0.8, "train": 1.0, "io": 0.8}
    slow = {"parse": 1.5, "vector": 2.0, "train": 1.0, "io": 1.3}
    return [
        SimNode("gpu-1", 8, 2, dict(gpu)),
        SimNode("gpu-2", 8, 2, dict(gpu)),
        SimNode("fast-1", 8, 0, dict(fast)),
        SimNode("fast-2", 8, 0, dict(fast)),
        SimNode("slow-1", 8, 0, dict(slow)),
        SimNode("slow-2", 8, 0, dict(slow)),
    ]


def make_workload(n: int, seed: int, rate: float) -> list[tuple[float, str, float, str | None]]:
    """(arrival, type, noise, data node) per task: bursty arrivals, a mix shift at n/2."""
    rng = random.Random(seed)
    names = [nd.name for nd in make_nodes()]
    out = []
    t = 0.0
    burst = False
    phase_end = rng.expovariate(1.0 / 0.5)
    for i in range(n):
        mix = MIX_BEFORE if i < n // 2 else MIX_AFTER
        t += rng.expovariate(rate * (1.7 if burst else 0.5))
        while t > phase_end:
            burst = not burst
            phase_end += rng.expovariate(1.0 / (0.3 if burst else 0.5))
        kind = rng.choices(list(mix), weights=list(mix.values()))[0]
        noise = rng.lognormvariate(0.0, 0.25)
        data_at = rng.choice(names) if "bytes" in TYPES[kind] else None
        out.append((t, kind, noise, data_at))
    return out


class Sim:
    """One owner, one policy, virtual time."""

    def __init__(self, policy: PlacementPolicy, workload: list[tuple[float, str, float, str | None]], shift_at: int):
        self.policy = policy
        self.nodes = {nd.name: nd for nd in make_nodes()}
        self.views = {
            nd.name: NodeView(nd.name, {"cpu": float(nd.cpu), "gpu": float(nd.gpu)}, free={"gpu": float(nd.gpu)})
            for nd in self.nodes.values()
        }
        for v in self.views.values():
            v.window = window_size(v.slots, None, queue_time=0.05, max_per_slot=256)
        self.live = list(self.views.values())
        self.est = RuntimeEstimator()
        self.ctx = PolicyContext(estimator=self.est)
        self.learner = policy if hasattr(policy, "observe") else None
        self.events: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.ready: deque[Task] = deque()
        self.tasks: list[Task] = []
        self.shift_at = shift_at
        self.placed = 0
        self.decide_ns = 0
        for i, (t, kind, noise, data_at) in enumerate(workload):
            spec = TYPES[kind]
            deps = {data_at: spec["bytes"]} if data_at else {}
            req = TaskReq(kind, spec["res"], 0, deps, None, frozenset(), i)
            self.tasks.append(Task(i, kind, t, noise, data_at, req))
            self._push(t, 0, i)

    def _push(self, t: float, kind: int, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    def run(self) -> None:
        while self.events:
            now, _, kind, payload = heapq.heappop(self.events)
            if kind == 0:  # arrival
                if payload == self.shift_at:
                    self.nodes["fast-1"].factor = {k: v * 3.0 for k, v in self.nodes["fast-1"].factor.items()}
                self.ready.append(self.tasks[payload])
            else:  # a task finished
                self._finish(now, payload)
            self._dispatch(now)

    def _dispatch(self, now: float) -> None:
        ready = self.ready
        deferred = []
        ctx = self.ctx
        ctx.now = now
        while ready:
            task = ready.popleft()
            ctx.seq = self.placed
            t0 = time.perf_counter_ns()
            name = self.policy.choose(task.req, self.live, ctx)
            self.decide_ns += time.perf_counter_ns() - t0
            if name is None:
                deferred.append(task)
                if "gpu" not in task.req.resources or len(deferred) >= 64:
                    break
                continue
            self._place(now, task, name)
        ready.extendleft(reversed(deferred))

    def _place(self, now: float, task: Task, name: str) -> None:
        self.placed += 1
        v = self.views[name]
        est = self.est.estimate(task.kind, name)
        task.est = est if est is not None else (self.est.mean(task.kind) or 0.0)
        v.inflight += 1
        v.backlog += task.est
        for k, amt in task.req.resources.items():
            if k != "cpu":
                v.free[k] = v.free.get(k, 0.0) - amt
        task.node, task.placed = name, now
        nd = self.nodes[name]
        nd.queue.append(task)
        self._start(now, nd)

    def _start(self, now: float, nd: SimNode) -> None:
        """Start queued tasks in order while slots (and GPUs) are free (a GPU task waits for a
        GPU without blocking cpu tasks behind it, as the worker's resource-aware queue does)."""
        if nd.running_cpu >= nd.cpu:
            return
        kept: deque[Task] = deque()
        while nd.queue and nd.running_cpu < nd.cpu:
            task = nd.queue.popleft()
            gpu = task.req.resources.get("gpu", 0.0) > 0
            if gpu and nd.running_gpu >= nd.gpu:
                kept.append(task)
                continue
            nd.running_cpu += 1
            nd.running_gpu += gpu
            spec = TYPES[task.kind]
            rt = spec["base"] * nd.factor[task.kind] * task.noise
            if task.data_at is not None and task.data_at != nd.name:
                rt += REMOTE_READ
            task.runtime = rt
            nd.busy += rt
            self._push(now + rt, 1, task)
        kept.extend(nd.queue)
        nd.queue = kept

    def _finish(self, now: float, task: Task) -> None:
        nd = self.nodes[task.node]
        nd.running_cpu -= 1
        nd.running_gpu -= task.req.resources.get("gpu", 0.0) > 0
        task.done = now
        v = self.views[task.node]
        v.inflight -= 1
        v.backlog -= task.est
        if v.inflight <= 0:
            v.inflight, v.backlog = 0, 0.0
        for k, amt in task.req.resources.items():
            if k != "cpu":
                v.free[k] = v.free.get(k, 0.0) + amt
        self.est.update(task.kind, task.node, task.runtime)
        v.window = window_size(v.slots, self.est.node_mean(task.node), queue_time=0.05, max_per_slot=256)
        if self.learner is not None:
            behind = max(0, int(v.inflight - v.slots))
            self.learner.observe(
                Completion(task.tid, task.kind, task.node, task.runtime, now - task.placed, behind, v.slots)
            )
        self._start(now, nd)


def summarise(sim: Sim, window: int) -> dict[str, Any]:
    ct = [t.done - t.arrival for t in sim.tasks]
    end = max(t.done for t in sim.tasks)
    slots = sum(nd.cpu for nd in sim.nodes.values())
    after = ct[sim.shift_at :]
    wins = [statistics.fmean(after[i : i + window]) for i in range(0, len(after) - window + 1, window)]
    srt = sorted(ct)
    return {
        "mean": statistics.fmean(ct),
        "p99": srt[int(0.99 * (len(srt) - 1))],
        "utilisation": sum(nd.busy for nd in sim.nodes.values()) / (slots * end),
        "busy_slot_seconds": sum(nd.busy for nd in sim.nodes.values()),
        "makespan": end,
        "mean_before_shift": statistics.fmean(ct[: sim.shift_at]),
        "mean_after_shift": statistics.fmean(after),
        "windows_after_shift": wins,
        "decide_us_mean": sim.decide_ns / 1000 / max(sim.placed, 1),
    }


def simulate(
    tasks: int = 40_000,
    seed: int = 1,
    rate: float = 2400.0,
    window: int = 1000,
    policies: tuple[str, ...] = POLICIES,
    noise_floor: float = 0.0,
    **learned_kw: Any,
) -> dict[str, Any]:
    """Run every policy on the same seeded workload (same tasks, arrival times and noise; windows
    are aligned by task index); the learned policy's state is in ``learned_stats``. With
    ``noise_floor`` > 0, also run shortest-expected with that share of random placements and
    report its windows against plain shortest-expected's (``noise_floor`` in the result)."""
    workload = make_workload(tasks, seed, rate)
    reg = PolicyRegistry(use_entry_points=False)
    out: dict[str, Any] = {"tasks": tasks, "seed": seed, "rate": rate, "window": window, "policies": {}}
    for name in policies:
        pol = LearnedPolicy(LearnedConfig(seed=seed, **learned_kw)) if name == "learned" else reg.get(name)
        sim = Sim(pol, workload, tasks // 2)
        sim.run()
        out["policies"][name] = summarise(sim, window)
        if isinstance(pol, LearnedPolicy):
            out["learned_stats"] = pol.stats()
    res = out["policies"]
    if noise_floor > 0 and "shortest-expected" in res:
        sim = Sim(Perturbed(noise_floor, seed), workload, tasks // 2)
        sim.run()
        pert = summarise(sim, window)["windows_after_shift"]
        se = res["shortest-expected"]["windows_after_shift"]
        r = [p / b for p, b in zip(pert, se, strict=True)]
        out["noise_floor"] = {
            "share": noise_floor,
            "worst_window_vs_shortest_expected_pct": 100 * (max(r) - 1),
            "windows_over_5pct": sum(x > 1.05 for x in r),
        }
    if "learned" in res:
        heur = [h for h in HEURISTICS if h in res]
        worst = 0.0
        ratios = []
        for i, lw in enumerate(res["learned"]["windows_after_shift"]):
            best = min(res[h]["windows_after_shift"][i] for h in heur)
            ratios.append(lw / best)
            worst = max(worst, lw / best)
        out["learned_vs_best_heuristic_per_window"] = ratios
        out["bars"] = {
            "vs_round_robin_pct": 100 * (1 - res["learned"]["mean"] / res["round-robin"]["mean"])
            if "round-robin" in res
            else None,
            "vs_shortest_expected_pct": 100 * (1 - res["learned"]["mean"] / res["shortest-expected"]["mean"])
            if "shortest-expected" in res
            else None,
            "worst_window_vs_best_heuristic_pct": 100 * (worst - 1),
            "windows_over_5pct": sum(x > 1.05 for x in ratios),
        }
    return out


def decision_time(
    n_nodes: int, runtime: float = 0.01, rounds: int = 7, calls: int = 3000
) -> dict[str, dict[str, float]]:
    """Microseconds per task for each policy on a warmed-up snapshot of ``n_nodes`` nodes:
    ``choose`` alone (median), and ``choose`` plus the completion bookkeeping a learning policy
    adds (mean per task). Policies are interleaved round by round and the best round is kept,
    so a busy machine inflates the numbers less."""
    est = RuntimeEstimator()
    names = [f"n{i}" for i in range(n_nodes)]
    for i, nm in enumerate(names):
        est.update("m:f", nm, runtime * (1 + i % 3))
    nodes = [
        NodeView(nm, {"cpu": 4.0}, window=10**9, inflight=i % 7, backlog=runtime * (i % 7))
        for i, nm in enumerate(names)
    ]
    sets = {name: PolicySet(est, time.monotonic, PolicyRegistry(use_entry_points=False)) for name in POLICIES}
    pols = {name: ps.get(name) for name, ps in sets.items()}
    best = {name: {"choose_us": math.inf, "with_learning_us": math.inf} for name in POLICIES}
    tid = 0
    for _ in range(rounds):
        for name, pol in pols.items():
            ps = sets[name]
            ctx = ps.ctx
            ts = []
            t_all = time.perf_counter_ns()
            for _i in range(calls):
                tid += 1
                task = TaskReq("m:f", {"cpu": 1.0}, tid=tid)
                t0 = time.perf_counter_ns()
                node = pol.choose(task, nodes, ctx)
                ts.append(time.perf_counter_ns() - t0)
                if ps.observers and node is not None:
                    ps.observe(tid, "m:f", nodes[0], node, runtime, 0.0, 0)
            per_task = (time.perf_counter_ns() - t_all) / calls / 1000
            ts.sort()
            b = best[name]
            b["choose_us"] = min(b["choose_us"], ts[len(ts) // 2] / 1000)
            b["with_learning_us"] = min(b["with_learning_us"], per_task)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=40_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=float, default=2400.0, help="mean arrivals per second")
    ap.add_argument("--window", type=int, default=1000, help="tasks per comparison window after the shift")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--plot", type=Path, help="draw the post-shift windows here (needs matplotlib)")
    ap.add_argument("--decisions", action="store_true", help="only time one decision per policy (2, 6, 16 nodes)")
    ap.add_argument(
        "--noise-floor",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="also run shortest-expected with this share of random placements (e.g. 0.002) and report its "
        "worst post-shift window against plain shortest-expected: how far apart two near-identical runs drift",
    )
    a = ap.parse_args()
    if a.decisions:
        res = {}
        for runtime, label in ((0.01, "10 ms tasks (every completion learned from)"), (2e-5, "20 us tasks (sampled)")):
            print(f"\nmicroseconds per task, {label}: choose median / choose + completion bookkeeping")
            print(f"{'policy':<18}" + "".join(f"{f'{k} nodes':>18}" for k in (2, 6, 16)))
            r = res[str(runtime)] = {str(k): decision_time(k, runtime) for k in (2, 6, 16)}
            for name in POLICIES:
                cells = "".join(f"{v[name]['choose_us']:9.1f} / {v[name]['with_learning_us']:5.1f}" for v in r.values())
                print(f"{name:<18}{cells}")
        if a.json:
            a.json.write_text(json.dumps(res, indent=1))
        return
    t0 = time.perf_counter()
    out = simulate(a.tasks, a.seed, a.rate, a.window, noise_floor=a.noise_floor)
    res = out["policies"]
    print(f"{a.tasks} tasks, seed {a.seed}, {a.rate:g} tasks/s mean rate, shift at task {a.tasks // 2}")
    print(f"{'policy':<18} {'mean ms':>8} {'p99 ms':>8} {'util':>6} {'before':>8} {'after':>8} {'us/dec':>7}")
    for name, r in res.items():
        print(
            f"{name:<18} {1e3 * r['mean']:8.2f} {1e3 * r['p99']:8.2f} {r['utilisation']:6.1%} "
            f"{1e3 * r['mean_before_shift']:8.2f} {1e3 * r['mean_after_shift']:8.2f} {r['decide_us_mean']:7.1f}"
        )
    if "bars" in out:
        b = out["bars"]
        print("\nwindows of", a.window, "tasks after the shift (mean ms):")
        heads = list(res)
        print("  " + " ".join(f"{h[:12]:>12}" for h in heads) + "  learned/best")
        for i, ratio in enumerate(out["learned_vs_best_heuristic_per_window"]):
            row = " ".join(f"{1e3 * res[h]['windows_after_shift'][i]:12.2f}" for h in heads)
            print(f"  {row}  {ratio:11.3f}")
        print(
            f"\nlearned vs round-robin: {b['vs_round_robin_pct']:+.1f}% lower mean (bar >= 27%)\n"
            f"learned vs shortest-expected: {b['vs_shortest_expected_pct']:+.1f}% lower mean (bar >= 10%)\n"
            f"worst post-shift window vs best heuristic: {b['worst_window_vs_best_heuristic_pct']:+.1f}% (bar <= +5%), "
            f"{b['windows_over_5pct']} of {len(out['learned_vs_best_heuristic_per_window'])} windows over +5%"
        )
        if "noise_floor" in out:
            nf = out["noise_floor"]
            print(
                f"noise floor: shortest-expected with {nf['share']:.1%} random placements vs plain: worst window "
                f"{nf['worst_window_vs_shortest_expected_pct']:+.1f}%, {nf['windows_over_5pct']} windows over +5%"
            )
        print("learned:", json.dumps({k: v for k, v in out["learned_stats"].items() if k != "weights"}))
        print("weights:", {k: round(v, 3) for k, v in out["learned_stats"]["weights"].items()})
    print(f"({time.perf_counter() - t0:.1f} s wall)")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    if a.plot:
        plot(out, a.plot)


def plot(out: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, r in out["policies"].items():
        ax.plot([1e3 * w for w in r["windows_after_shift"]], label=name, marker="o" if name == "learned" else None)
    ax.set_xlabel(f"window of {out['window']} tasks after the shift")
    ax.set_ylabel("mean completion time (ms)")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    print("plot written to", path)


if __name__ == "__main__":
    main()
