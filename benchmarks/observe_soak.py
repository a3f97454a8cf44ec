#!/usr/bin/env python
"""Dashboard soak: the RSS of the node serving the dashboard after an hour-equivalent of live
updates (bar: at most 50 MB growth; dask/distributed and ray dashboards have leaked here).

This process is the dashboard's node (``[http]`` on, refresh ``--interval`` s instead of 1 s, so
3,600 updates, an hour at the default refresh, take minutes). Two ``aionet serve`` workers with
``[http]`` on answer its per-update summary requests; two dashboard clients hold the live stream
open; meanwhile this node sends 64 B messages and requests to the workers and runs no-op tasks,
so counters, histograms and event buffers all move. RSS is sampled after a warm-up (the baseline)
and every 10 % of the run.

    python benchmarks/observe_soak.py                  # 3,600 updates
    python benchmarks/observe_soak.py --updates 600    # smoke run
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
MB = 1e6


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


async def _traffic(node: Any, stop: asyncio.Event) -> int:
    """Messages, requests and tasks, paced so the dashboard's refresh is not starved."""
    n = 0
    while not stop.is_set():
        for w in ("w0", "w1"):
            for _ in range(50):
                await node.send(w, "sink", b"x" * 64)
            await node.request(w, "aionet.echo", n, timeout=30)
        await node.gather([node.submit("tasks:noop") for _ in range(10)])
        n += 1
        await asyncio.sleep(0.01)
    return n


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import aionet
    from aionet.config import Config

    env = {
        "AIONET_SCHEDULER_ALLOW_MODULES": "tasks",
        "PYTHONPATH": os.pathsep.join([str(C.BENCH_DIR), str(C.REPO_DIR)]),
    }
    workers, readers = [], []
    proc = psutil.Process()
    try:
        seed = None
        for i in range(2):
            argv = [sys.executable, "-m", "aionet", "serve", "--name", f"w{i}", "--listen", f"tcp://{HOST}:0"]
            argv += ["--log-level", "warning", "--app", "_observe_app:setup"] + (["--join", seed] if seed else [])
            w = C.Child(argv, label=f"w{i}", env={**env, "AIONET_HTTP_PORT": str(_free_port())})
            workers.append(w)
            seed = seed or (await asyncio.to_thread(w.expect, "ready", 60))["addresses"][0]
            if i:
                await asyncio.to_thread(w.expect, "ready", 60)
        cfg = Config.from_dict(
            {
                "http": {"port": _free_port(), "interval": args.interval},
                "scheduler": {"allow_modules": ["tasks"]},
                "log": {"level": "warning"},
            }
        )
        node = aionet.Node(name="dash", listen=f"tcp://{HOST}:0", join=[seed], config=cfg)
        await node.start()
        obs = node.observer
        stop = asyncio.Event()
        try:
            while sum(m["state"] == "alive" for m in node.members().values()) < 3:
                await asyncio.sleep(0.05)
            for i in range(2):
                r = C.Child([sys.executable, str(C.BENCH_DIR / "_observe_app.py"), "read", obs.url], label=f"page{i}")
                readers.append(r)
                await asyncio.to_thread(r.expect, "READY", 30)
            traffic = asyncio.get_running_loop().create_task(_traffic(node, stop))
            warm = args.updates // 20
            while obs.updates < warm:
                await asyncio.sleep(0.1)
            base = proc.memory_info().rss
            t0 = time.monotonic()
            samples = [(obs.updates, 0.0)]
            step = max(1, args.updates // 10)
            while obs.updates < warm + args.updates:
                await asyncio.sleep(0.2)
                if obs.updates >= samples[-1][0] + step:
                    samples.append((obs.updates, (proc.memory_info().rss - base) / MB))
                    print(f"  {obs.updates - warm:>6} updates  RSS {proc.memory_info().rss / MB:7.1f} MB  "
                          f"growth {samples[-1][1]:+6.1f} MB", flush=True)  # fmt: skip
            stop.set()
            rounds = await traffic
            end = proc.memory_info().rss
        finally:
            stop.set()
            await node.stop()
    finally:
        for c in readers + workers:
            c.kill()
            c.remove_log()
    return {
        "updates": args.updates,
        "interval_s": args.interval,
        "seconds": time.monotonic() - t0,
        "traffic_rounds": rounds,
        "rss_base_mb": base / MB,
        "rss_end_mb": end / MB,
        "growth_mb": (end - base) / MB,
        "samples": samples,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=3600, help="an hour at the default 1 s refresh")
    ap.add_argument("--interval", type=float, default=0.02, help="refresh interval during the soak (s)")
    args = ap.parse_args()
    out = asyncio.run(run(args))
    print(
        f"\n{out['updates']} dashboard updates in {out['seconds']:.0f} s ({out['traffic_rounds']} traffic rounds): "
        f"RSS {out['rss_base_mb']:.1f} -> {out['rss_end_mb']:.1f} MB, growth {out['growth_mb']:+.1f} MB (bar: <= 50 MB)"
    )
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
