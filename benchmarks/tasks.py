#!/usr/bin/env python
"""Task benchmark: aionet's scheduler vs Dask distributed's LocalCluster, in one run.

Worker nodes are real ``aionet serve`` processes on 127.0.0.1; the client is this process (a
node with ``scheduler.run_local = false``, so it only submits). Dask runs a LocalCluster with
the same number of worker processes and threads, and a synchronous Client in this process.
Measured, each ``--repeat`` times for the throughput and latency rows (median and spread):

1. no-op task throughput, submit: N ``submit()`` calls, then gather all results;
2. no-op task throughput, map: one ``map()`` call over N items;
3. single no-op task round trip (submit, await the result), sequential: p50 and p99;
4. a 2,000-task dependency chain (each task takes the previous result): time to the last;
5. a batch of 2,000 tasks of 10 ms on 3 workers, one worker SIGKILLed after a third of the
   results: time, and whether every result came back exactly once;
6. heterogeneous placement (aionet only): 400 tasks on two workers, one 4x slower, under
   round-robin and shortest-expected (work stealing off, so placement alone decides; a
   round-robin + stealing row is shown too).

    python benchmarks/tasks.py              # full run (about 2-3 minutes)
    python benchmarks/tasks.py --quick      # smoke run
    python benchmarks/tasks.py --no-dask    # aionet only

Task functions live in this file and are named ``tasks:fn``; worker processes get this
directory on PYTHONPATH so they import them (aionet runs only code a node has installed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

HOST = "127.0.0.1"
SLOTS = 2  # cpu slots (aionet) = threads (Dask) per worker process


# ------------------------------------------------------------------ task functions (both sides)
def noop(*_args: Any) -> None:
    return None


async def anoop(*_args: Any) -> None:
    """The async no-op: runs on the worker's event loop, no thread hand-off (observe_instructions.py)."""
    return None


def inc(x: int) -> int:
    return x + 1


def sleep_ms(i: int, ms: float = 10.0) -> int:
    time.sleep(ms / 1000.0)
    return i


async def work(i: int, base: float, slow: dict[str, float]) -> int:
    import aionet

    await asyncio.sleep(base * slow.get(aionet.task_context().node_name, 1.0))
    return i


# ------------------------------------------------------------------ aionet
class AionetCluster:
    """``n`` worker processes (``aionet serve``) plus a client node in this process."""

    def __init__(self, n: int, env: dict[str, str] | None = None, verbose: bool = False):
        self.n = n
        self.env = {
            "PYTHONPATH": os.pathsep.join([str(C.BENCH_DIR), str(C.REPO_DIR)]),
            "AIONET_SCHEDULER_ALLOW_MODULES": "tasks",  # the task functions below
            **(env or {}),
        }
        self.children: list[C.Child] = []
        self.verbose = verbose

    def start(self) -> list[str]:
        C.install_cleanup()
        seed = None
        for i in range(self.n):
            argv = [
                sys.executable,
                "-m",
                "aionet",
                "serve",
                "--name",
                f"w{i}",
                "--listen",
                f"tcp://{HOST}:0",
                "--log-level",
                "info" if self.verbose else "warning",
            ]
            if seed:
                argv += ["--join", seed]
            child = C.Child(argv, label=f"w{i}", env=self.env)
            self.children.append(child)
            info = child.expect("ready", 60)
            seed = seed or info["addresses"][0]
        return [seed] if seed else []

    def kill(self, i: int) -> None:
        p = self.children[i].proc
        if p.poll() is None:
            p.kill()  # SIGKILL: no goodbye, as a crash

    def stop(self) -> None:
        for c in self.children:
            c.kill()
            c.remove_log()


async def _client(seeds: list[str], n_workers: int, **sched: Any) -> Any:
    import aionet
    from aionet.config import Config

    cfg = Config.from_dict({"scheduler": {"run_local": False, **sched}, "log": {"level": "warning"}})
    node = aionet.Node(name=f"client-{os.getpid()}", listen=f"tcp://{HOST}:0", join=seeds, config=cfg)
    await node.start()
    await node.wait_workers(n_workers, timeout=30)  # every worker joined, its resources known
    return node


async def aionet_basic(seeds: list[str], p: dict[str, Any]) -> dict[str, Any]:
    node = await _client(seeds, 2)
    out: dict[str, Any] = {"submit": [], "map": [], "rt_p50_us": [], "rt_p99_us": [], "chain_s": None}
    try:
        await node.gather([node.submit("tasks:noop") for _ in range(2000)])  # warm-up
        for _ in range(p["repeat"]):
            n = p["n"]
            t = time.perf_counter()
            refs = [node.submit("tasks:noop") for _ in range(n)]
            res = await node.gather(refs)
            dt = time.perf_counter() - t
            assert len(res) == n
            out["submit"].append(n / dt)
            t = time.perf_counter()
            res = await node.map("tasks:noop", range(n))
            dt = time.perf_counter() - t
            assert len(res) == n
            out["map"].append(n / dt)
            lat = []
            for _ in range(p["rt"]):
                t0 = time.perf_counter_ns()
                await node.submit("tasks:noop")
                lat.append(time.perf_counter_ns() - t0)
            s = C.latency_stats_us(lat)
            out["rt_p50_us"].append(s["p50"])
            out["rt_p99_us"].append(s["p99"])
        t = time.perf_counter()
        ref = node.submit("tasks:inc", 0)
        for _ in range(p["chain"] - 1):
            ref = node.submit("tasks:inc", ref)
        last = await ref
        out["chain_s"] = time.perf_counter() - t
        assert last == p["chain"], last
        out["stats"] = node.scheduler.stats().owner.as_dict()
    finally:
        await node.stop()
    return out


async def aionet_kill(seeds: list[str], cluster: AionetCluster, p: dict[str, Any]) -> dict[str, Any]:
    node = await _client(seeds, 3)
    n = p["kill_n"]
    try:
        got: list[int] = []
        t = time.perf_counter()
        refs = [node.submit("tasks:sleep_ms", i, 10.0, retries=3) for i in range(n)]
        killed_at = None
        for i, ref in enumerate(refs):
            got.append(await ref)
            if killed_at is None and i >= n // 3:
                cluster.kill(1)
                killed_at = time.perf_counter() - t
        dt = time.perf_counter() - t
        stats = node.scheduler.stats().owner.as_dict()
    finally:
        await node.stop()
    ok = sorted(got) == list(range(n))
    return {
        "seconds": dt,
        "exactly_once": ok,
        "killed_at_s": killed_at,
        "resubmitted": stats["resubmitted"],
        "duplicates_dropped": stats["duplicates_dropped"],
    }


async def aionet_hetero(seeds: list[str], policy: str, steal: bool, p: dict[str, Any]) -> dict[str, Any]:
    node = await _client(seeds, 2, policy=policy)
    try:
        slow = {"w1": 4.0}
        base = p["hetero_base"]
        t = time.perf_counter()
        res = await node.map(
            "tasks:work", range(p["hetero_n"]), [base] * p["hetero_n"], [slow] * p["hetero_n"], resources={"cpu": 1}
        )
        dt = time.perf_counter() - t
        assert sorted(res) == list(range(p["hetero_n"]))
    finally:
        await node.stop()
    return {"seconds": dt}


# ------------------------------------------------------------------ dask
def dask_basic(p: dict[str, Any]) -> dict[str, Any]:
    from distributed import Client, LocalCluster

    out: dict[str, Any] = {"submit": [], "map": [], "rt_p50_us": [], "rt_p99_us": [], "chain_s": None}
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=SLOTS,
            processes=True,
            dashboard_address=None,
            host=HOST,
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.gather([client.submit(noop, i, pure=False) for i in range(200)])  # warm-up
        for _ in range(p["repeat"]):
            n = p["dask_n"]
            t = time.perf_counter()
            futs = [client.submit(noop, i, pure=False) for i in range(n)]
            client.gather(futs)
            out["submit"].append(n / (time.perf_counter() - t))
            del futs
            t = time.perf_counter()
            futs = client.map(noop, range(n), pure=False)
            client.gather(futs)
            out["map"].append(n / (time.perf_counter() - t))
            del futs
            lat = []
            for _ in range(p["dask_rt"]):
                t0 = time.perf_counter_ns()
                client.submit(noop, pure=False).result()
                lat.append(time.perf_counter_ns() - t0)
            s = C.latency_stats_us(lat)
            out["rt_p50_us"].append(s["p50"])
            out["rt_p99_us"].append(s["p99"])
        t = time.perf_counter()
        fut = client.submit(inc, 0, pure=False)
        for _ in range(p["chain"] - 1):
            fut = client.submit(inc, fut, pure=False)
        last = fut.result()
        out["chain_s"] = time.perf_counter() - t
        assert last == p["chain"], last
    return out


def dask_kill(p: dict[str, Any]) -> dict[str, Any]:
    import signal

    from distributed import Client, LocalCluster, as_completed

    n = p["kill_n"]
    with (
        LocalCluster(
            n_workers=3,
            threads_per_worker=SLOTS,
            processes=True,
            dashboard_address=None,
            host=HOST,
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        pids = client.run(os.getpid)
        victim = sorted(pids.values())[1]
        t = time.perf_counter()
        futs = [client.submit(sleep_ms, i, 10.0, pure=False) for i in range(n)]
        got = []
        killed_at = None
        for fut in as_completed(futs):
            got.append(fut.result())
            if killed_at is None and len(got) >= n // 3:
                os.kill(victim, signal.SIGKILL)
                killed_at = time.perf_counter() - t
        dt = time.perf_counter() - t
    return {"seconds": dt, "exactly_once": sorted(got) == list(range(n)), "killed_at_s": killed_at}


# ------------------------------------------------------------------ driver
def med(values: list[float]) -> dict[str, Any]:
    return C.summarize(values)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller volumes, one repeat")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--json", default=str(C.RESULTS_DIR / "tasks.json"))
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    from aionet.log import configure

    configure("info" if args.verbose else "warning")
    q = args.quick
    p = {
        "repeat": 1 if q else args.repeat,
        "n": 5000 if q else 20000,
        "dask_n": 500 if q else 2000,
        "rt": 500 if q else 2000,
        "dask_rt": 100 if q else 300,
        "chain": 2000,
        "kill_n": 2000,
        "hetero_n": 400,
        "hetero_base": 0.005,
    }
    res: dict[str, Any] = {"environment": C.environment(), "config": p}

    print("aionet: 2 worker processes ...", flush=True)
    cl = AionetCluster(2, verbose=args.verbose)
    try:
        seeds = cl.start()
        res["aionet"] = C.run_async(aionet_basic(seeds, p))
    finally:
        cl.stop()
    print("aionet: kill one of 3 workers during a batch ...", flush=True)
    cl = AionetCluster(3, verbose=args.verbose)
    try:
        seeds = cl.start()
        res["aionet_kill"] = C.run_async(aionet_kill(seeds, cl, p))
    finally:
        cl.stop()
    print("aionet: heterogeneous placement ...", flush=True)
    res["hetero"] = {}
    for policy, steal in (("round-robin", False), ("shortest-expected", False), ("round-robin", True)):
        cl = AionetCluster(2, env={"AIONET_SCHEDULER_STEAL": "true" if steal else "false"}, verbose=args.verbose)
        try:
            seeds = cl.start()
            label = policy + (" + stealing" if steal else "")
            res["hetero"][label] = C.run_async(aionet_hetero(seeds, policy, steal, p))
        finally:
            cl.stop()
    if not args.no_dask:
        try:
            import distributed  # noqa: F401

            print("dask: LocalCluster, 2 worker processes ...", flush=True)
            res["dask"] = dask_basic(p)
            print("dask: kill one of 3 workers during a batch ...", flush=True)
            res["dask_kill"] = dask_kill(p)
        except ImportError as exc:
            res["dask_unavailable"] = str(exc)

    a, d = res["aionet"], res.get("dask")
    rows = []

    def row(label: str, key: str, unit: str, higher: bool) -> None:
        sa = med(a[key])
        sd = med(d[key]) if d else None
        ratio = "-"
        if sd and sd["median"]:
            r = sa["median"] / sd["median"] if higher else sd["median"] / sa["median"]
            ratio = f"{r:.1f}x"
        rows.append([f"{label} ({unit})", C.fmt_summary(sa), C.fmt_summary(sd) if sd else "n/a", ratio])
        res.setdefault("summary", {})[key] = {"aionet": sa, "dask": sd}

    row("no-op throughput, submit+gather", "submit", "tasks/s", True)
    row("no-op throughput, map", "map", "tasks/s", True)
    row("single task round trip p50", "rt_p50_us", "us", False)
    row("single task round trip p99", "rt_p99_us", "us", False)
    ca, cd = a["chain_s"], d["chain_s"] if d else None
    rows.append(
        [
            f"{p['chain']}-task dependency chain (s)",
            C.fmt_num(ca),
            C.fmt_num(cd) if cd else "n/a",
            f"{cd / ca:.1f}x" if cd else "-",
        ]
    )
    ka, kd = res["aionet_kill"], res.get("dask_kill")
    rows.append(
        [
            f"{p['kill_n']} x 10 ms, 1 of 3 workers killed (s)",
            C.fmt_num(ka["seconds"]),
            C.fmt_num(kd["seconds"]) if kd else "n/a",
            f"{kd['seconds'] / ka['seconds']:.1f}x" if kd else "-",
        ]
    )
    rows.append(["  every result exactly once", str(ka["exactly_once"]), str(kd["exactly_once"]) if kd else "n/a", ""])
    C.print_table(
        "Tasks: aionet vs Dask LocalCluster (ratio: >1 means aionet is better)",
        ["", "aionet", "dask", "ratio"],
        rows,
        plain=args.plain,
        footer=f"median (min-max) of {p['repeat']} repeats; aionet N={p['n']}, dask N={p['dask_n']}",
    )
    h = res["hetero"]
    hrows = [[k, f"{v['seconds']:.2f}"] for k, v in h.items()]
    speedup = h["round-robin"]["seconds"] / h["shortest-expected"]["seconds"]
    hrows.append(["shortest-expected speed-up over round-robin", f"{speedup:.2f}x"])
    C.print_table(
        f"Heterogeneous placement: {p['hetero_n']} tasks, worker w1 4x slower (s)",
        ["policy", "seconds"],
        hrows,
        plain=args.plain,
    )

    bars = []
    if d:
        tp = med(a["submit"])["median"] / med(d["submit"])["median"]
        bars.append(["no-op throughput >= 10x Dask", f"{tp:.1f}x", "PASS" if tp >= 10 else "FAIL"])
        rt = med(a["rt_p50_us"])["median"] / med(d["rt_p50_us"])["median"]
        bars.append(["round trip p50 <= 1/20 of Dask", f"1/{1 / rt:.0f}", "PASS" if rt <= 1 / 20 else "FAIL"])
    bars.append(
        ["kill 1 of 3: every result exactly once", str(ka["exactly_once"]), "PASS" if ka["exactly_once"] else "FAIL"]
    )
    bars.append(
        ["shortest-expected >= 1.5x faster than round-robin", f"{speedup:.2f}x", "PASS" if speedup >= 1.5 else "FAIL"]
    )
    C.print_table("Bars", ["bar", "measured", ""], bars, plain=args.plain)
    res["bars"] = bars
    path = C.write_json(args.json, res)
    print(f"wrote {path}")
    return 0 if all(b[2] == "PASS" for b in bars) else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
