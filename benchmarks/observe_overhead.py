#!/usr/bin/env python
"""What metrics and an open dashboard cost: 64 B message rate and no-op task throughput with
metrics off vs on, in one run.

One worker is a real ``aionet serve`` process; the client (sender, task owner) is this process.
"On" means both nodes serve ``[http]`` (metrics registry, hook instrument, the summary service)
and a dashboard client holds the worker's live stream open (``/events``, default 1 s refresh,
which gathers every member's summary). Each segment runs for ``--seconds`` (messages, then
tasks, with a bounded window in flight); modes alternate in pairs (off-on, on-off, ...), and
the result is the mean change of each "on" segment over the "off" segment next to it, with a
95 % confidence interval: drift on a shared machine (other tenants, CPU frequency) moves both
segments of a pair alike, and cancels out of their ratio. Rates per CPU-second of both
processes are shown too (less moved by other tenants than the wall clock).

    python benchmarks/observe_overhead.py                 # 10 pairs of 2 s segments
    python benchmarks/observe_overhead.py --quick         # smoke run

The instruction counts of benchmarks/observe_instructions.py resolve far smaller differences.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import psutil

HOST = "127.0.0.1"
KEYS = ("msg_rate", "task_rate", "msg_per_cpu_s", "task_per_cpu_s")
PAYLOAD = b"x" * 64


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Clock:
    """Wall time and the CPU time of both processes (this one and the worker): on a shared
    machine the wall-clock rate swings with other tenants; work per CPU-second does much less."""

    def __init__(self, worker_pid: int) -> None:
        self.worker = psutil.Process(worker_pid)

    def now(self) -> tuple[float, float]:
        w = self.worker.cpu_times()
        return time.perf_counter(), time.process_time() + w.user + w.system

    def rates(self, n: int, t0: tuple[float, float]) -> tuple[float, float]:
        wall, cpu = self.now()
        return n / (wall - t0[0]), n / max(cpu - t0[1], 1e-9)


async def _messages(node: Any, seconds: float, sent: list[int], clock: Clock) -> tuple[float, float]:
    """64 B messages for ``seconds`` (in chunks), then until the worker has drained them all."""
    t0 = clock.now()
    n = 0
    while time.perf_counter() - t0[0] < seconds:
        for _ in range(2000):
            await node.send("w0", "sink", PAYLOAD)
        n += 2000
        await asyncio.sleep(0)  # send() does not yield while the link has room: let the loop run
    sent[0] += n
    await node.request("w0", "bench.wait", sent[0], timeout=120)
    return clock.rates(n, t0)


async def _tasks(node: Any, seconds: float, clock: Clock) -> tuple[float, float]:
    """No-op tasks for ``seconds``: batches of 1000, the next submitted before the last is awaited,
    so the worker never runs dry between batches."""
    t0 = clock.now()
    n, pending = 0, None
    while time.perf_counter() - t0[0] < seconds:
        refs = [node.submit("tasks:noop") for _ in range(1000)]
        n += len(refs)
        if pending is not None:
            await node.gather(pending)
        pending = refs
    if pending is not None:
        await node.gather(pending)
    return clock.rates(n, t0)


async def _set_observe(node: Any, on: bool, ports: tuple[int, int], page: bool = True) -> None:
    """Metrics and HTTP on both nodes, at the same ports each time; "on" returns once the
    dashboard page has reconnected to the worker and received an update."""
    from aionet.observe import attach

    if on:
        node.config.http.port = ports[0]
        node.observer = await attach(node)
        await node.request("w0", "bench.observe", ports[1], timeout=10)
        deadline = time.monotonic() + 20
        while page and not await node.request("w0", "bench.page", None, timeout=10):
            if time.monotonic() > deadline:
                raise SystemExit("the dashboard page did not connect to the worker")
            await asyncio.sleep(0.05)
    else:
        await node.request("w0", "bench.observe", 0, timeout=10)
        if node.observer is not None:
            await node.observer.close()
            node.observer = None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import aionet
    from aionet.config import Config

    env = {
        "AIONET_SCHEDULER_ALLOW_MODULES": "tasks",
        "AIONET_HTTP_INTERVAL": str(args.refresh),
        "PYTHONPATH": os.pathsep.join([str(C.BENCH_DIR), str(C.REPO_DIR)]),
    }
    argv = [sys.executable, "-m", "aionet", "serve", "--name", "w0", "--listen", f"tcp://{HOST}:0"]
    worker = C.Child([*argv, "--log-level", "warning", "--app", "_observe_app:setup"], label="w0", env=env)
    ports = (_free_port(), _free_port())
    # the dashboard client: connected to the worker's page whenever it serves, retrying otherwise
    reader = C.Child(
        [sys.executable, str(C.BENCH_DIR / "_observe_app.py"), "read", f"http://{HOST}:{ports[1]}"], label="dash"
    ) if not args.no_page else None  # fmt: skip
    res: dict[str, dict[str, list[float]]] = {m: {k: [] for k in KEYS} for m in ("off", "on")}
    try:
        seed = (await asyncio.to_thread(worker.expect, "ready", 60))["addresses"][0]
        cfg = Config.from_dict({"scheduler": {"run_local": False}, "log": {"level": "warning"}})
        node = aionet.Node(name="client", listen=f"tcp://{HOST}:0", join=[seed], config=cfg)
        await node.start()
        try:
            while "w0" not in node.scheduler.owner.views:
                await asyncio.sleep(0.02)
            sent = [0]
            clock = Clock(worker.pid)
            for on in (False, True):  # warm-up, both modes
                await _set_observe(node, on, ports, not args.no_page)
                await _messages(node, args.seconds / 4, sent, clock)
                await _tasks(node, args.seconds / 4, clock)
            await _set_observe(node, False, ports)
            for r in range(args.pairs):
                for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                    await _set_observe(node, mode == "on", ports, not args.no_page)
                    wall, cpu = await _messages(node, args.seconds, sent, clock)
                    res[mode]["msg_rate"].append(wall)
                    res[mode]["msg_per_cpu_s"].append(cpu)
                    wall, cpu = await _tasks(node, args.seconds, clock)
                    res[mode]["task_rate"].append(wall)
                    res[mode]["task_per_cpu_s"].append(cpu)
                    m = {k: v[-1] for k, v in res[mode].items()}
                    print(
                        f"  pair {r + 1} {mode:>3}: {m['msg_rate']:>9.0f} msg/s ({m['msg_per_cpu_s']:>9.0f} per "
                        f"CPU-s) {m['task_rate']:>7.0f} tasks/s ({m['task_per_cpu_s']:>7.0f} per CPU-s)",
                        flush=True,
                    )
                    await _set_observe(node, False, ports)
        finally:
            await node.stop()
    finally:
        if reader is not None:
            reader.kill()
            reader.remove_log()
        worker.kill()
        worker.remove_log()
    out: dict[str, Any] = {}
    for metric in KEYS:
        off, on = C.summarize(res["off"][metric]), C.summarize(res["on"][metric])
        out[metric] = {
            "off": off,
            "on": on,
            "change_pct": 100.0 * (on["median"] / off["median"] - 1.0),
            "paired": paired_change(res["on"][metric], res["off"][metric]),
        }
    return out


# two-sided 95 % quantiles of Student's t, by degrees of freedom (31 and more: 2.0)
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18,
        15: 2.13, 20: 2.09, 25: 2.06, 30: 2.04}  # fmt: skip


def _t95(df: int) -> float:
    return _T95[max(k for k in _T95 if k <= df)] if df <= 30 else 2.0


def paired_change(on: list[float], off: list[float]) -> dict[str, float]:
    """Mean change of "on" over the "off" run next to it (pairs ran back to back), in %, with a
    95 % confidence interval (t on the log ratios): drift between pairs cancels out of each ratio."""
    logs = [math.log(a / b) for a, b in zip(on, off, strict=True)]
    mean = statistics.fmean(logs)
    half = _t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else math.inf
    pct = lambda x: 100.0 * (math.exp(x) - 1.0)  # noqa: E731
    return {"mean_pct": pct(mean), "lo_pct": pct(mean - half), "hi_pct": pct(mean + half), "pairs": len(logs)}


async def update_cost(updates: int = 300) -> dict[str, float]:
    """CPU seconds one dashboard update costs, all sides included: three in-process nodes with
    [http] on (so the members' summary handlers run in this process too), one page open. At a
    1 s refresh this is the fraction of one core the open dashboard takes, whatever the load."""
    import aionet
    from aionet.config import Config

    nodes = []
    try:
        for i in range(3):
            cfg = Config.from_dict({"http": {"port": _free_port(), "interval": 3600}, "log": {"level": "warning"}})
            join = [nodes[0].address] if nodes else None
            n = aionet.Node(name=f"n{i}", listen=f"tcp://{HOST}:0", join=join, config=cfg)
            await n.start()
            nodes.append(n)
        while sum(m["state"] == "alive" for m in nodes[0].members().values()) < 3:
            await asyncio.sleep(0.05)
        obs = nodes[0].observer
        await obs.view.refresh()
        obs._subscribers.add(asyncio.Queue(maxsize=1))  # a page: publish encodes for it
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(updates):
            obs._publish()
            await obs.view.refresh()
            obs._publish()
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        scrape_c0 = time.process_time()
        for _ in range(50):
            obs.metrics.exposition()
        scrape = (time.process_time() - scrape_c0) / 50
    finally:
        for n in reversed(nodes):
            await n.stop()
    return {
        "cpu_ms_per_update": 1e3 * cpu / updates,
        "wall_ms_per_update": 1e3 * wall / updates,
        "cpu_ms_per_scrape": 1e3 * scrape,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0, help="each measured segment (messages, then tasks)")
    ap.add_argument("--pairs", type=int, default=10, help="off/on pairs (order alternates: off-on, on-off, ...)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-page", action="store_true", help="metrics on without a dashboard page (to tell them apart)")
    ap.add_argument("--refresh", type=float, default=1.0, help="the worker's dashboard refresh interval, s")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.pairs = 0.5, 2
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    out = C.run_async(run(args))
    out["load"] = [load0, os.getloadavg()[0]]
    out["update_cost"] = C.run_async(update_cost())
    print("RESULT " + json.dumps(out))
    print(
        f"\nmetrics off vs on (dashboard open), {args.pairs} pairs of {args.seconds:g} s segments in one run "
        f"of {time.monotonic() - t0:.0f} s; load average {load0:.1f} -> {out['load'][1]:.1f} "
        f"on {os.cpu_count()} CPUs"
    )
    print("  medians (min-max); paired: mean change of on over the off next to it, [95 % CI]")
    for metric, unit in (
        ("msg_rate", "64 B msg/s"),
        ("msg_per_cpu_s", "msg/CPU-s"),
        ("task_rate", "no-op tasks/s"),
        ("task_per_cpu_s", "tasks/CPU-s"),
    ):
        o, p = out[metric], out[metric]["paired"]
        print(f"  {unit:>14}: off {o['off']['median']:>9.0f} ({o['off']['min']:.0f}-{o['off']['max']:.0f})  "
              f"on {o['on']['median']:>9.0f} ({o['on']['min']:.0f}-{o['on']['max']:.0f})  "
              f"paired {p['mean_pct']:+.1f} % [{p['lo_pct']:+.1f}, {p['hi_pct']:+.1f}]")  # fmt: skip
    u = out["update_cost"]
    print(f"  one dashboard update (3 members, all sides): {u['cpu_ms_per_update']:.2f} ms CPU "
          f"= {u['cpu_ms_per_update'] / 10:.2f} % of a core at the 1 s refresh; one /metrics scrape "
          f"{u['cpu_ms_per_scrape']:.2f} ms CPU")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
