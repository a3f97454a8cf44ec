#!/usr/bin/env python
"""What metrics and an open dashboard cost: 64 B message rate and no-op task throughput with
metrics off vs on, in one run.

One worker is a real ``aionet serve`` process; the client (sender, task owner) is this process.
"On" means both nodes serve ``[http]`` (metrics registry, hook instrument, the summary service)
and a dashboard client holds the worker's live stream open (``/events``, default 1 s refresh,
which gathers every member's summary). Modes alternate (off, on, off, on, ...) so drift on a
shared machine hits both alike; the table shows medians and min-max of the repeats.

    python benchmarks/observe_overhead.py                 # 5 repeats of each mode
    python benchmarks/observe_overhead.py --quick         # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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


async def _messages(node: Any, n: int, sent: list[int], clock: Clock) -> tuple[float, float]:
    t0 = clock.now()
    for _ in range(n):
        await node.send("w0", "sink", PAYLOAD)
    sent[0] += n
    await node.request("w0", "bench.wait", sent[0], timeout=120)
    return clock.rates(n, t0)


async def _tasks(node: Any, n: int, clock: Clock) -> tuple[float, float]:
    t0 = clock.now()
    await node.gather([node.submit("tasks:noop") for _ in range(n)])
    return clock.rates(n, t0)


async def _set_observe(node: Any, on: bool, ports: tuple[int, int]) -> None:
    """Metrics and HTTP on both nodes, at the same ports each time (the dashboard reconnects)."""
    from aionet.observe import attach

    if on:
        node.config.http.port = ports[0]
        node.observer = await attach(node)
        await node.request("w0", "bench.observe", ports[1], timeout=10)
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
        "PYTHONPATH": os.pathsep.join([str(C.BENCH_DIR), str(C.REPO_DIR)]),
    }
    argv = [sys.executable, "-m", "aionet", "serve", "--name", "w0", "--listen", f"tcp://{HOST}:0"]
    worker = C.Child([*argv, "--log-level", "warning", "--app", "_observe_app:setup"], label="w0", env=env)
    ports = (_free_port(), _free_port())
    # the dashboard client: connected to the worker's page whenever it serves, retrying otherwise
    reader = C.Child(
        [sys.executable, str(C.BENCH_DIR / "_observe_app.py"), "read", f"http://{HOST}:{ports[1]}"], label="dash"
    )
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
            await _messages(node, args.messages // 5, sent, clock)  # warm-up
            await _tasks(node, args.tasks // 5, clock)
            res: dict[str, dict[str, list[float]]] = {m: {k: [] for k in KEYS} for m in ("off", "on")}
            for r in range(args.repeat):
                for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                    await _set_observe(node, mode == "on", ports)
                    await asyncio.sleep(1.5)  # on: the page has reconnected and refreshed
                    wall, cpu = await _messages(node, args.messages, sent, clock)
                    res[mode]["msg_rate"].append(wall)
                    res[mode]["msg_per_cpu_s"].append(cpu)
                    wall, cpu = await _tasks(node, args.tasks, clock)
                    res[mode]["task_rate"].append(wall)
                    res[mode]["task_per_cpu_s"].append(cpu)
                    m = {k: v[-1] for k, v in res[mode].items()}
                    print(
                        f"  repeat {r + 1} {mode:>3}: {m['msg_rate']:>9.0f} msg/s ({m['msg_per_cpu_s']:>9.0f} per "
                        f"CPU-s) {m['task_rate']:>7.0f} tasks/s ({m['task_per_cpu_s']:>7.0f} per CPU-s)",
                        flush=True,
                    )
                    await _set_observe(node, False, ports)
        finally:
            await node.stop()
    finally:
        reader.kill()
        reader.remove_log()
        worker.kill()
        worker.remove_log()
    out: dict[str, Any] = {}
    for metric in KEYS:
        off, on = C.summarize(res["off"][metric]), C.summarize(res["on"][metric])
        out[metric] = {"off": off, "on": on, "change_pct": 100.0 * (on["median"] / off["median"] - 1.0)}
    return out


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
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--tasks", type=int, default=2_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.messages, args.tasks, args.repeat = 10_000, 500, 2
    out = asyncio.run(run(args))
    out["update_cost"] = asyncio.run(update_cost())
    pairs = {
        k: sorted(on / off for on, off in zip(out[k]["on"]["values"], out[k]["off"]["values"], strict=True))
        for k in KEYS
    }
    out["paired_change_pct"] = {k: 100.0 * (C.median(v) - 1.0) for k, v in pairs.items()}
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("RESULT " + json.dumps(out))
    print(f"\nmetrics off vs on (dashboard open), medians of {args.repeat} alternating repeats (min-max):")
    for metric, unit in (
        ("msg_rate", "64 B msg/s"),
        ("msg_per_cpu_s", "msg/CPU-s"),
        ("task_rate", "no-op tasks/s"),
        ("task_per_cpu_s", "tasks/CPU-s"),
    ):
        o = out[metric]
        print(f"  {unit:>14}: off {o['off']['median']:>9.0f} ({o['off']['min']:.0f}-{o['off']['max']:.0f})  "
              f"on {o['on']['median']:>9.0f} ({o['on']['min']:.0f}-{o['on']['max']:.0f})  "
              f"change {o['change_pct']:+.1f} %  (paired {out['paired_change_pct'][metric]:+.1f} %)")  # fmt: skip
    u = out["update_cost"]
    print(f"  one dashboard update (3 members, all sides): {u['cpu_ms_per_update']:.2f} ms CPU "
          f"= {u['cpu_ms_per_update'] / 10:.2f} % of a core at the 1 s refresh; one /metrics scrape "
          f"{u['cpu_ms_per_scrape']:.2f} ms CPU")  # fmt: skip


if __name__ == "__main__":
    main()
