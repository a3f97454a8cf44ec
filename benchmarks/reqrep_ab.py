#!/usr/bin/env python
"""Request/reply p50 of two or more aionet trees against raw uvloop, interleaved in one run.

``p2p.py`` measures one tree per run, and on a shared machine the load moves between runs by
more than a change to the request path does. This runs only the latency row (64 B, one caller,
``request(..., timeout=5)`` to an ``async def`` echo over tcp:// on 127.0.0.1, as ``p2p.py``
does), for raw uvloop ping-pong and for each tree in turn, in every round, with the order
rotated per round; each measurement is a fresh server and client process pair, the tree
chosen by ``PYTHONPATH``. It prints each round's p50s and each tree's p50 / raw's p50 from the
same round, then the median of those ratios.

    python3 benchmarks/reqrep_ab.py --trees /tmp/main_copy,. --rounds 5 -n 3000
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
from pathlib import Path
from typing import Any

from p2p import _U32, _RawEcho, _RawPing  # the same raw ping-pong p2p.py times

PAYLOAD = b"x" * 64


async def _serve(impl: str) -> None:
    loop = asyncio.get_running_loop()
    if impl == "raw":
        srv = await loop.create_server(_RawEcho, "127.0.0.1", 0)
        print(json.dumps({"port": srv.sockets[0].getsockname()[1]}), flush=True)
        await asyncio.Event().wait()
    import aionet

    node = aionet.Node(name="srv", listen="tcp://127.0.0.1:0")
    await node.start()

    async def echo(x: Any) -> Any:
        return x

    node.add_service("bench.echo", echo)
    print(json.dumps({"address": node.address}), flush=True)
    await asyncio.Event().wait()


async def _client(impl: str, info: dict[str, Any], n: int, warmup: int) -> list[int]:
    clock = time.perf_counter_ns
    samples: list[int] = []
    if impl == "raw":
        loop = asyncio.get_running_loop()
        tr, proto = await loop.create_connection(_RawPing, "127.0.0.1", info["port"])
        msg = _U32.pack(len(PAYLOAD)) + PAYLOAD
        for i in range(warmup + n):
            fut = proto.waiter = loop.create_future()
            t0 = clock()
            tr.write(msg)
            await fut
            if i >= warmup:
                samples.append(clock() - t0)
        tr.close()
        return samples
    import aionet

    cli = aionet.Node(name="cli", listen="tcp://127.0.0.1:0", join=[info["address"]])
    await cli.start()
    request = cli.request
    for i in range(warmup + n):
        t0 = clock()
        await request("srv", "bench.echo", PAYLOAD, timeout=5)
        if i >= warmup:
            samples.append(clock() - t0)
    await cli.stop()
    return samples


def _run_loop(coro: Any) -> Any:
    from aionet.runner import run

    return run(coro)


def measure(impl: str, tree: str | None, n: int, warmup: int) -> float:
    """p50 in microseconds of one fresh server/client process pair."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = tree
    me = str(Path(__file__).resolve())
    srv = subprocess.Popen([sys.executable, me, "--_role", "server", "--_impl", impl], stdout=subprocess.PIPE, env=env)
    try:
        assert srv.stdout is not None
        line = srv.stdout.readline()
        if not line:
            raise SystemExit(f"{impl} server ({tree}) did not start")
        args = [sys.executable, me, "--_role", "client", "--_impl", impl, "--_info", line.decode().strip()]
        args += ["-n", str(n), "--warmup", str(warmup)]
        out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=True)
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        srv.kill()
        srv.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", default=".", help="comma list of aionet source trees (PYTHONPATH for each)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=3000, help="measured round trips per process pair")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--_role")
    ap.add_argument("--_impl")
    ap.add_argument("--_info")
    args = ap.parse_args()
    if args._role == "server":
        _run_loop(_serve(args._impl))
        return
    if args._role == "client":
        samples = _run_loop(_client(args._impl, json.loads(args._info), args.n, args.warmup))
        print(f"{statistics.median(samples) / 1000:.2f}")
        return
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    impls: list[tuple[str, str | None]] = [("raw", trees[0])] + [("aionet", t) for t in trees]
    ratios: dict[str, list[float]] = {t: [] for t in trees}
    for r in range(args.rounds):
        order = impls[r % len(impls) :] + impls[: r % len(impls)]
        p50 = {(impl, tree): measure(impl, tree, args.n, args.warmup) for impl, tree in order}
        raw = p50[("raw", trees[0])]
        cells = [f"raw {raw:.1f} us"]
        for t in trees:
            v = p50[("aionet", t)]
            ratios[t].append(v / raw)
            cells.append(f"{t}: {v:.1f} us ({v / raw:.2f}x)")
        load = os.getloadavg()[0]
        print(f"round {r + 1} ({time.strftime('%H:%M:%S')}, load {load:.1f}): " + ", ".join(cells), flush=True)
    for t in trees:
        rs = ratios[t]
        print(f"{t}: p50 / raw median {statistics.median(rs):.2f}x (min {min(rs):.2f}, max {max(rs):.2f})")


if __name__ == "__main__":
    main()
