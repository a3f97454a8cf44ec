#!/usr/bin/env python
"""What busy polling costs and buys, per traffic pattern: CPU per process and request latency.

``node.busy_poll_us`` keeps a node's event loop polling for a window after each message
instead of sleeping. That buys latency (no wake-up per message) and costs CPU whenever the
window expires with nothing to read. How much depends on the traffic, so this script runs
the same patterns with each window given (fresh processes each, the window set through
``AIONET_NODE_BUSY_POLL_US``, which the children inherit):

* ``idle``: a cluster of ``--nodes`` processes with no application traffic (heartbeats,
  membership, load publication only): each process's CPU use.
* ``R/s``: one client process sending ``R`` requests per second (paced, one at a time) to an
  echo service in another process, inside that idle cluster: the p50 / p99 round trip and
  the CPU use of the client and the server.

CPU use is user + system seconds per second of wall clock (1.0 = one core busy throughout),
read with ``psutil`` over the measured seconds only.

    python3 benchmarks/busy_poll_cost.py                         # windows 0 and 50 us
    python3 benchmarks/busy_poll_cost.py --windows 0,50,200 --rates 100,1000,5000 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from _common import end_children


async def _member(seed: str | None, name: str) -> None:
    from aionet import Node

    async with Node(name=name, listen="tcp://127.0.0.1:0", join=[seed] if seed else []) as node:

        @node.service("bench.echo")
        def echo(x: Any) -> Any:
            return x

        print(node.address, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes it


async def _client(seed: str, rate: float, seconds: float, members: list[str]) -> None:
    import psutil

    from aionet import Node

    async with Node(name="client", listen="tcp://127.0.0.1:0", join=[seed]) as node:
        await node.wait_members(members, timeout=30)
        srv = members[0]
        msg = b"x" * 64
        for _ in range(50):  # warm-up
            await node.request(srv, "bench.echo", msg, timeout=10)
        print("ready", flush=True)
        sys.stdin.readline()  # the parent samples the server's CPU, then says go
        me = psutil.Process()
        c0, t0 = sum(me.cpu_times()[:2]), time.perf_counter()
        lat: list[float] = []
        period, nxt = 1.0 / rate, t0
        while (now := time.perf_counter()) < t0 + seconds:
            if nxt > now:
                await asyncio.sleep(nxt - now)
            nxt += period
            s = time.perf_counter()
            await node.request(srv, "bench.echo", msg, timeout=10)
            lat.append(time.perf_counter() - s)
        el = time.perf_counter() - t0
        cpu = (sum(me.cpu_times()[:2]) - c0) / el
        lat.sort()
        print(
            json.dumps(
                {
                    "n": len(lat),
                    "p50_us": 1e6 * lat[len(lat) // 2],
                    "p99_us": 1e6 * lat[int(len(lat) * 0.99)],
                    "cpu": cpu,
                    "rate": len(lat) / el,
                }
            ),
            flush=True,
        )


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _cpu(procs: list[Any]) -> list[float]:
    return [sum(p.cpu_times()[:2]) for p in procs]


def run_window(window: float, nodes: int, rates: list[float], seconds: float) -> dict[str, Any]:
    """One cluster with this window: its idle cost, then each paced rate."""
    import psutil

    env = dict(os.environ, AIONET_NODE_BUSY_POLL_US=f"{window:g}")
    procs: list[subprocess.Popen[str]] = []
    out: dict[str, Any] = {"window_us": window}
    try:
        seed = _spawn(["--_member", "m0"], env)
        procs.append(seed)
        addr = seed.stdout.readline().strip()  # type: ignore[union-attr]
        for i in range(1, nodes):
            p = _spawn(["--_member", f"m{i}", "--_seed", addr], env)
            procs.append(p)
            p.stdout.readline()  # type: ignore[union-attr]
        ps = [psutil.Process(p.pid) for p in procs]
        time.sleep(2.0)  # let membership settle: its start-up traffic is not the idle cost
        c0, t0 = _cpu(ps), time.perf_counter()
        time.sleep(seconds)
        el = time.perf_counter() - t0
        out["idle_cpu"] = [(b - a) / el for a, b in zip(c0, _cpu(ps), strict=True)]
        members = [f"m{i}" for i in range(nodes)]
        for rate in rates:
            cli = _spawn(["--_client", addr, "--_rate", str(rate), "--_seconds", str(seconds), *members], env)
            try:
                assert cli.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
                s0, ts = _cpu(ps[:1]), time.perf_counter()
                cli.stdin.write("go\n")  # type: ignore[union-attr]
                cli.stdin.flush()  # type: ignore[union-attr]
                row = json.loads(cli.stdout.readline())  # type: ignore[union-attr]
                row["srv_cpu"] = (_cpu(ps[:1])[0] - s0[0]) / (time.perf_counter() - ts)
                out[f"{rate:g}/s"] = row
            finally:
                end_children([cli])
    finally:
        end_children(procs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", default="0,50", help="busy-poll windows in us, comma-separated (default: 0,50)")
    ap.add_argument("--rates", default="100,1000,4000", help="paced requests per second (default: 100,1000,4000)")
    ap.add_argument("--nodes", type=int, default=3, help="cluster size, the echo server included (default: 3)")
    ap.add_argument("--seconds", type=float, default=5.0, help="per measurement (default: 5)")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds over the windows (default: 1)")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--_member", help=argparse.SUPPRESS)
    ap.add_argument("--_seed", help=argparse.SUPPRESS)
    ap.add_argument("--_client", help=argparse.SUPPRESS)
    ap.add_argument("--_rate", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--_seconds", type=float, help=argparse.SUPPRESS)
    ap.add_argument("members", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._member or args._client:
        import uvloop

        if args._member:
            uvloop.run(_member(args._seed, args._member))
        else:
            uvloop.run(_client(args._client, args._rate, args._seconds, args.members))
        return
    windows = [float(w) for w in args.windows.split(",")]
    rates = [float(r) for r in args.rates.split(",")]
    rows = []
    for rnd in range(args.rounds):
        for w in windows:
            row = run_window(w, args.nodes, rates, args.seconds)
            row["round"] = rnd
            rows.append(row)
            idle = row["idle_cpu"]
            print(
                f"round {rnd} window {w:g} us: idle CPU per process {statistics.median(idle):.4f}"
                f" (max {max(idle):.4f}) over {args.nodes} processes",
                flush=True,
            )
            for r in rates:
                c = row[f"{r:g}/s"]
                print(
                    f"   {r:6g} req/s: p50 {c['p50_us']:6.0f} us  p99 {c['p99_us']:6.0f} us"
                    f"  CPU client {c['cpu']:.3f}  server {c['srv_cpu']:.3f}  (achieved {c['rate']:.0f}/s)",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
