#!/usr/bin/env python
"""Per-message cost of 64 B sends through the Node, both ends in one process: a profile, or a
fixed amount of work for an instruction counter.

Wall-clock rates on a shared 2-core machine swing 2-3x; instruction counts do not. So:

    # where the time goes (cProfile of sender and receiver together)
    python benchmarks/msg_cost.py --api send --profile

    # instructions per message: run twice under callgrind and divide the difference
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p python benchmarks/msg_cost.py --api send -n 20000
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p python benchmarks/msg_cost.py --api send -n 60000
    python benchmarks/msg_cost.py --callgrind --api send   # does both and prints Ir per message

``--api``: ``send`` (``await node.send`` per message), ``nowait`` (``node.send_nowait``,
awaiting ``node.wait_space`` when the window is full), ``many`` (``await node.send_many``
with lists of 256), ``request64`` (``await node.request`` to an async echo service, 64 in
flight). The receiver drains with ``recv_batch``. ``--loop asyncio`` uses the
stdlib loop (callgrind also works under uvloop here; the choice is recorded in the output).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aionet

PAYLOAD = b"x" * 64
BATCH = 256


async def _produce(tx: aionet.Node, api: str, n: int) -> None:
    if api == "send":
        send = tx.send
        for _ in range(n):
            await send("rx", "c", PAYLOAD)
    elif api == "nowait":
        send_nowait = tx.send_nowait
        i = 0
        while i < n:
            try:
                send_nowait("rx", "c", PAYLOAD)
                i += 1
            except aionet.WouldBlock:
                await tx.wait_space("rx")
    elif api == "request64":  # n requests, 64 in flight
        left = [n]

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                await tx.request("rx", "echo", PAYLOAD)

        await asyncio.gather(*(worker() for _ in range(64)))
    elif api == "many":
        chunk = [PAYLOAD] * BATCH
        left = n
        while left > 0:
            k = min(left, BATCH)
            await tx.send_many("rx", "c", chunk if k == BATCH else chunk[:k])
            left -= k
    else:
        raise SystemExit(f"unknown --api {api!r}")


async def run_once(api: str, n: int, profile: bool) -> float:
    async with (
        aionet.Node(name="rx", listen="tcp://127.0.0.1:0") as rx,
        aionet.Node(name="tx", listen="tcp://127.0.0.1:0", join=[rx.address]) as tx,
    ):
        await tx.send("rx", "warm", 0)
        await rx.recv("warm")

        @rx.service("echo")
        async def echo(x: bytes) -> bytes:
            return x

        async def consume() -> None:
            got = 0
            while got < n and api != "request64":
                got += len(await rx.recv_batch("c"))

        prof = cProfile.Profile() if profile else None
        t0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        await asyncio.gather(_produce(tx, api, n), consume())
        if prof is not None:
            prof.disable()
        dt = time.perf_counter() - t0
        if prof is not None:
            pstats.Stats(prof).sort_stats("tottime").print_stats(28)
        return dt


def callgrind(api: str, small: int, large: int, loop: str) -> None:
    """Ir per message: the difference between two runs, divided by the extra messages."""
    irs = []
    with tempfile.TemporaryDirectory() as d:
        for n in (small, large):
            out = os.path.join(d, f"cg.{n}")
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__]
            cmd += ["--api", api, "-n", str(n), "--loop", loop]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            m = re.search(r"Collected\s*:\s*(\d+)", proc.stderr)
            if m is None:
                raise SystemExit(f"no instruction count in valgrind's output:\n{proc.stderr[-2000:]}")
            irs.append(int(m.group(1)))
    per = (irs[1] - irs[0]) / (large - small)
    print(f"api={api} loop={loop}: {per:,.0f} instructions per message (Ir {irs[0]:,} @ {small}, {irs[1]:,} @ {large})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--api", default="send", choices=("send", "nowait", "many", "request64"))
    ap.add_argument("-n", type=int, default=200_000, help="messages")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of both ends")
    ap.add_argument("--callgrind", action="store_true", help="instructions per message under valgrind")
    ap.add_argument("--loop", default="uvloop", choices=("uvloop", "asyncio"))
    args = ap.parse_args()
    if args.callgrind:
        small = 5_000 if args.api == "request64" else 20_000
        callgrind(args.api, small, 3 * small, args.loop)
        return
    dt = aionet.run(run_once(args.api, args.n, args.profile), use_uvloop=args.loop == "uvloop")
    print(f"api={args.api}: {args.n} messages in {dt:.3f} s = {args.n / dt:,.0f} msg/s (one process, both ends)")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
