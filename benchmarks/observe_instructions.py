#!/usr/bin/env python
"""What metrics and an open dashboard cost, in instructions (valgrind callgrind): a measure
that the shared machine's load does not move, for a bar (2 %) far below its wall-clock noise.

    python benchmarks/observe_instructions.py [--tasks 1500] [--messages 20000] [--json PATH]

Every run is one process holding two nodes over tcp:// (a client that only submits and sends,
and a worker), so every instruction either side executes is counted. Per operation costs come
from differences: a run doing 3N operations minus a run doing N, which cancels start-up and
imports. "on" = both nodes serve ``[http]`` (metrics registry, hook instrument, summary
service). The dashboard's cost is counted apart: instructions per update (gather the cluster
view, encode it, publish it to an open page), measured in-process; at the default 1 s refresh
its share of a busy node is that cost over one second of work at a given rate, reported for the
task rate the scheduler reaches here (``--rate``). Callgrind slows Python about 50x, so timers
(heartbeats, probes, the metrics mode's own periodic work) fire about 50x more often per
operation than at full speed, and more still when the machine is busy and the runs stretch:
run it on a quiet machine (two runs under load 8-10 gave +7.3 % and -0.9 % for the same code).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
BENCH = Path(__file__).resolve().parent


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


async def workload(kind: str, n: float, on: bool) -> None:
    """The measured process: two nodes, ``n`` no-op tasks or 64 B messages, or (``idle``) ``n``
    seconds of nothing: the background (timers, heartbeats) per second of each mode."""
    import aionet
    from aionet.config import Config

    def cfg(extra: dict[str, Any]) -> Config:
        base: dict[str, Any] = {"log": {"level": "warning"}, **extra}
        if on:
            base["http"] = {"port": _free_port()}
        return Config.from_dict(base)

    worker = aionet.Node(name="w0", listen=f"tcp://{HOST}:0", config=cfg({"scheduler": {"allow_modules": ["tasks"]}}))
    await worker.start()
    client = aionet.Node(
        name="client", listen=f"tcp://{HOST}:0", join=[worker.address], config=cfg({"scheduler": {"run_local": False}})
    )
    await client.start()
    try:
        while "w0" not in client.scheduler.owner.views:
            await asyncio.sleep(0.02)
        assert (worker.observer is not None) == on and (client.observer is not None) == on
        if kind == "idle":
            await asyncio.sleep(n)
        elif kind == "tasks":
            n = int(n)
            for start in range(0, n, 500):  # batches: a bounded number in flight
                await client.gather([client.submit("tasks:noop") for _ in range(min(500, n - start))])
        else:
            got, n = 0, int(n)
            for _ in range(n):
                await client.send("w0", "sink", b"x" * 64)
            while got < n:
                got += len(await worker.recv_batch("sink"))
    finally:
        await client.stop()
        await worker.stop()


async def update_cost(updates: int) -> None:
    """The measured process for the dashboard: ``updates`` view refreshes + publishes to a page."""
    import aionet
    from aionet.config import Config

    nodes = []
    try:
        for i in range(2):
            c = Config.from_dict({"http": {"port": _free_port(), "interval": 3600}, "log": {"level": "warning"}})
            node = aionet.Node(
                name=f"n{i}", listen=f"tcp://{HOST}:0", join=[nodes[0].address] if nodes else None, config=c
            )
            await node.start()
            nodes.append(node)
        await nodes[0].wait_members(2, timeout=30)
        obs = nodes[0].observer
        obs._subscribers.add(asyncio.Queue(maxsize=1))  # an open page: every publish encodes for it
        for _ in range(updates):
            await obs.view.refresh()
            obs._publish()
    finally:
        for node in reversed(nodes):
            await node.stop()


def count(args: list[str]) -> tuple[int, float]:
    """Instructions the child executed, all threads (callgrind's 'Collected'), and its wall time."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), str(BENCH.parent)]), "PYTHONHASHSEED": "0"}
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__, *args]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    wall = time.monotonic() - t0
    m = re.search(r"Collected\s*:\s*(\d+)", out.stderr)
    if out.returncode != 0 or m is None:
        raise SystemExit(f"callgrind run failed ({out.returncode}): {' '.join(args)}\n{out.stderr[-3000:]}")
    return int(m.group(1)), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=1500)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--updates", type=int, default=40, help="dashboard updates (0: skip)")
    ap.add_argument("--idle", type=float, default=0.0, help="also measure the background: seconds of idle (0: no)")
    ap.add_argument("--rate", type=float, default=25000, help="tasks/s at which to state the dashboard's share")
    ap.add_argument("--jobs", type=int, default=3, help="callgrind runs at once")
    ap.add_argument("--json")
    ap.add_argument("--_run", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--_updates", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._run:
        kind, n, mode = args._run
        asyncio.run(workload(kind, float(n), mode == "on"))
        return
    if args._updates is not None:
        asyncio.run(update_cost(args._updates))
        return
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.time()
    kinds = [k for k in ("tasks", "messages") if getattr(args, k) > 0]
    runs = {(kind, mode, m): ["--_run", kind, str(m * getattr(args, kind)), mode]
            for kind in kinds for mode in ("off", "on") for m in (1, 3)}  # fmt: skip
    if args.idle > 0:  # the background per wall-second of each mode, under callgrind (information only)
        for mode in ("off", "on"):
            for m in (1, 3):
                runs[("idle", mode, m)] = ["--_run", "idle", str(m * args.idle), mode]
    if args.updates > 0:
        runs[("updates", "", 1)] = ["--_updates", str(args.updates)]
        runs[("updates", "", 3)] = ["--_updates", str(3 * args.updates)]
    with ThreadPoolExecutor(args.jobs) as pool:  # instruction counts do not care how busy the CPUs are
        futures = {key: pool.submit(count, argv) for key, argv in runs.items()}
        got = {key: f.result() for key, f in futures.items()}
    res: dict[str, Any] = {}
    if args.idle > 0:
        res["background"] = {}
        for mode in ("off", "on"):
            (lo, tlo), (hi, thi) = got[("idle", mode, 1)], got[("idle", mode, 3)]
            res["background"][mode] = (hi - lo) / (thi - tlo)
            print(f"idle     {mode:3s}: {res['background'][mode]:,.0f} instructions per wall-second under callgrind")
    for kind in kinds:
        n = getattr(args, kind)
        per: dict[str, float] = {}
        for mode in ("off", "on"):
            (lo, tlo), (hi, thi) = got[(kind, mode, 1)], got[(kind, mode, 3)]
            per[mode] = (hi - lo) / (2 * n)
            print(f"{kind:8s} {mode:3s}: {per[mode]:,.0f} instructions per operation (runs {tlo:.0f} / {thi:.0f} s)")
        res[kind] = {**per, "change_pct": 100 * (per["on"] / per["off"] - 1)}
        print(f"{kind:8s} metrics on: {res[kind]['change_pct']:+.2f} % instructions per operation", flush=True)
    if args.updates > 0 and "tasks" in res:
        (lo, _), (hi, _) = got[("updates", "", 1)], got[("updates", "", 3)]
        upd = (hi - lo) / (2 * args.updates)
        share = 100 * upd / (args.rate * res["tasks"]["off"])
        res["dashboard"] = {"instructions_per_update": upd, "share_pct_at_rate": share, "rate": args.rate}
        print(f"dashboard update: {upd:,.0f} instructions; at 1 update/s while running {args.rate:,.0f} tasks/s: "
              f"{share:.2f} % of the work", flush=True)  # fmt: skip
        total = res["tasks"]["change_pct"] + share
        print(f"tasks, metrics on and a dashboard open: {total:+.2f} % instructions (bar: <= 2 %); "
              f"measured in {time.time() - t0:.0f} s", flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
