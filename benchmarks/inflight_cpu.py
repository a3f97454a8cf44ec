#!/usr/bin/env python
"""Requests in flight between two processes: the rate, and whether both sides keep busy.

``benchmarks/p2p.py``'s "64 in flight" row gives the rate alone. On a 2-core machine that
rate is bounded by each side's CPU per request *and* by how much of the time each side has
work: if the two processes take turns (one writes a batch, then waits while the other
handles it), each idles and the rate stays near what one process would do alone. This
script prints, per round: requests/s, each process's CPU use (user + system seconds per
second: 1.0 is one core busy throughout), the CPU microseconds per request on each side, and
the server's read and write syscalls per request (``/proc/PID/io``), which show how the
requests were batched.

    python3 benchmarks/inflight_cpu.py                      # 64 in flight, tcp://, 5 rounds of 2 s
    python3 benchmarks/inflight_cpu.py --transport zmq+tcp --concurrency 16

Compare trees with ``PYTHONPATH=OTHER_TREE python3 benchmarks/inflight_cpu.py`` (the server
child inherits the environment), interleaving runs of each: wall-clock rates swing widely on a
shared machine, CPU per request and CPU use much less.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from _common import end_children


def _io(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/io") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


async def _server(transport: str) -> None:
    from aionet import Node

    async with Node(name="srv", listen=f"{transport}://127.0.0.1:0") as node:

        @node.service("bench.echo")
        async def echo(x: Any) -> Any:
            return x

        print(node.address, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes it


async def _client(args: argparse.Namespace, addr: str, srv_pid: int) -> None:
    import psutil

    from aionet import Node

    me, srv = psutil.Process(), psutil.Process(srv_pid)
    async with Node(name="cli", listen=f"{args.transport}://127.0.0.1:0", join=[addr]) as cli:
        await cli.wait_members(["srv"], timeout=30)
        msg = b"x" * 64
        done = [0]

        async def worker(until: float) -> None:
            while time.perf_counter() < until:
                await cli.request("srv", "bench.echo", msg, timeout=30)
                done[0] += 1

        rows = []
        print(
            f"{args.concurrency} in flight over {args.transport}://, rounds of {args.seconds:g} s (the first: warm-up)"
        )
        print("   req/s   cpu cli  cpu srv  us/req cli  us/req srv  srv reads/req  srv writes/req")
        for r in range(args.rounds + 1):
            done[0] = 0
            c0, s0, io0 = sum(me.cpu_times()[:2]), sum(srv.cpu_times()[:2]), _io(srv_pid)
            t0 = time.perf_counter()
            await asyncio.gather(*(worker(t0 + args.seconds) for _ in range(args.concurrency)))
            el = time.perf_counter() - t0
            c1, s1, io1 = sum(me.cpu_times()[:2]), sum(srv.cpu_times()[:2]), _io(srv_pid)
            n = max(1, done[0])
            row = (n / el, (c1 - c0) / el, (s1 - s0) / el, 1e6 * (c1 - c0) / n, 1e6 * (s1 - s0) / n)
            reads, writes = (io1[0] - io0[0]) / n, (io1[1] - io0[1]) / n
            if r:
                rows.append(row)
            print(
                f"{row[0] / 1e3:7.1f}k  {row[1]:7.2f}  {row[2]:7.2f}  {row[3]:10.1f}  {row[4]:10.1f}"
                f"  {reads:13.3f}  {writes:14.3f}{'' if r else '   (warm-up)'}"
            )
        med = [statistics.median(col) for col in zip(*rows, strict=True)]
        print(
            f"median: {med[0] / 1e3:.1f}k req/s, CPU use {med[1]:.2f} / {med[2]:.2f},"
            f" {med[3]:.1f} / {med[4]:.1f} us CPU per request (client / server)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport", default="tcp", help="tcp or zmq+tcp (default: tcp)")
    ap.add_argument("--concurrency", type=int, default=64, help="requests in flight (default: 64)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="per round")
    ap.add_argument("--_serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    import uvloop

    if args._serve:
        uvloop.run(_server(args.transport))
        return
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--_serve", "--transport", args.transport],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        addr = child.stdout.readline().strip()
        if not addr:
            raise SystemExit("the server process did not start (run it with --_serve to see why)")
        uvloop.run(_client(args, addr, child.pid))
    finally:
        end_children([child], timeout=10)


if __name__ == "__main__":
    main()
