#!/usr/bin/env python
"""Per-operation cost of one caller's cache put/get and plain request, both nodes in one
process: a profile, or a fixed amount of work for an instruction counter.

``benchmarks/cache.py`` compares against redis-py in wall-clock ops/s, which swings +-25 % on
a shared machine; instruction counts do not. The client node ``client`` and the server node
``server`` (``cache.replicas = 1``) share one event loop over TCP on 127.0.0.1; keys are chosen
so that ``server`` is their only replica (every put and get is remote), as in cache.py.
Counted per operation: the work of both nodes and of the event loop.

    python benchmarks/cache_op_cost.py --op put            # wall time per op (one caller)
    python benchmarks/cache_op_cost.py --op get --profile  # cProfile of both ends (PROFILE_TOP=n: rows)
    python benchmarks/cache_op_cost.py --callgrind         # instructions per op, every --op

``--op``: ``put`` / ``get`` (remote, 16-byte values), ``local_get`` (a key this node holds),
``request`` (``node.request`` to a sync echo service, 64 B), ``request_t`` (the same with a
timeout, as the cache's calls pass one), ``async_t`` (the same to an ``async def`` echo, as
``benchmarks/p2p.py`` calls it). ``--concurrency 16`` runs that many callers.
Environment: ``CACHE_OP_WARMUP`` (ops before measuring, default 2000: fewer keeps a run under
valgrind short), ``PROFILE_TOP`` (rows of ``--profile``, default 30), ``CACHE_OP_ACK_DELAY``
(seconds: both links' delayed-ack timer, 5 ms by default, set to this after the warm-up).

Under valgrind the 5 ms delayed-ack timer fires about once per round trip (in real time, once
per ~40), so a change that arms it less often (a reply carrying the ack before the read
callback ends) reads larger there than it is; with ``CACHE_OP_ACK_DELAY=10`` it does not fire
in the measured loop (requests and replies carry each other's acks) and only the per-request
path is counted.

The script puts its own tree first on ``sys.path``: to compare two trees, run each tree's copy
(``OTHER_TREE/benchmarks/cache_op_cost.py``); ``PYTHONPATH`` does not choose the tree.

Under valgrind an op runs ~50x slower, so work done per second rather than per op (the
cache's once-a-second TTL sweep, heartbeats, delayed acks) is counted in per-op figures
about 50x too heavily; the more loaded the machine, the more so. Compare trees run side
by side, never with a figure from another hour.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import os
import pstats
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OPS = ("put", "get", "local_get", "request", "request_t", "async_t")
VALUE = b"x" * 16


async def setup(op: str, concurrency: int) -> tuple[Any, Any, Any]:
    """Two nodes, keys placed, warmed up; returns (the op's coroutine over n, client, server)."""
    import aionet
    from aionet.config import Config

    # background timers (heartbeats, load publishing) slowed down: under valgrind a run lasts
    # a minute, and their instructions would otherwise be counted as the ops'
    quiet = {
        "heartbeat": {"interval": 5.0, "load_interval": 30.0},
        "scheduler": {"steal": False, "steal_interval": 30.0},
    }
    cfg = Config.from_dict({"cache": {"replicas": 1}, **quiet}, env={})
    b = aionet.Node(name="server", listen="tcp://127.0.0.1:0", config=cfg)
    await b.start()
    b.add_service("bench.echo", lambda x: x)

    async def aecho(x: Any) -> Any:
        return x

    b.add_service("bench.aecho", aecho)
    a = aionet.Node(name="client", listen="tcp://127.0.0.1:0", join=[b.address], config=cfg)
    await a.start()
    cache = a.cache
    while len(cache.service.placement.members) < 2:
        await asyncio.sleep(0.01)
    remote = [k for k in (f"k{i}" for i in range(4000)) if cache.owners(k) == ("server",)][:1000]
    local = [k for k in (f"m{i}" for i in range(4000)) if cache.owners(k) == ("client",)][:1000]
    await asyncio.sleep(cache.cfg.settle)  # past the settle window after joining
    for k in remote + local:
        await cache.put(k, VALUE)
    payload = b"x" * 64
    calls = {
        "put": lambda i: cache.put(remote[i % 1000], VALUE),
        "get": lambda i: cache.get(remote[i % 1000]),
        "local_get": lambda i: cache.get(local[i % 1000]),
        "request": lambda _i: a.request("server", "bench.echo", payload),
        "request_t": lambda _i: a.request("server", "bench.echo", payload, timeout=5.0),
        "async_t": lambda _i: a.request("server", "bench.aecho", payload, timeout=5.0),
    }
    call = calls[op]
    for i in range(int(os.environ.get("CACHE_OP_WARMUP", "2000"))):  # warm-up
        await call(i)
    ack_delay = os.environ.get("CACHE_OP_ACK_DELAY")
    if ack_delay:  # both links' delayed-ack timer stretched (see the module docstring)
        for node, peer in ((a, "server"), (b, "client")):
            node._peers[peer].link.ack_delay = float(ack_delay)

    async def run(n: int) -> None:
        it = iter(range(n))

        async def worker() -> None:
            for i in it:
                await call(i)

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    return run, a, b


def measure(op: str, n: int, concurrency: int, profile: bool) -> float:
    """Seconds for ``n`` ops. The measured loop alone runs inside ``functools.reduce``, so
    callgrind's ``--toggle-collect=functools_reduce`` counts it and nothing else."""
    from aionet.runner import loop_factory

    loop = loop_factory()()
    try:
        run, a, b = loop.run_until_complete(setup(op, concurrency))
        prof = cProfile.Profile() if profile else None
        t0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        functools.reduce(lambda _acc, _x: loop.run_until_complete(run(n)), [0], None)
        if prof is not None:
            prof.disable()
        dt = time.perf_counter() - t0
        if prof is not None:
            pstats.Stats(prof).sort_stats("tottime").print_stats(int(os.environ.get("PROFILE_TOP", "30")))
        loop.run_until_complete(a.stop())
        loop.run_until_complete(b.stop())
        return dt
    finally:
        loop.close()


def callgrind(ops: list[str], n: int, concurrency: int) -> None:
    """Instructions per op: only the measured loop is counted (start-up, joining and the
    warm-up are not)."""
    with tempfile.TemporaryDirectory() as d:
        for op in ops:
            out = os.path.join(d, f"cg.{op}")
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no"]
            cmd += ["--toggle-collect=functools_reduce", sys.executable, __file__]
            cmd += ["--op", op, "-n", str(n), "--concurrency", str(concurrency)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            m = re.search(r"Collected\s*:\s*(\d+)", proc.stderr)
            if m is None:
                raise SystemExit(f"no instruction count in valgrind's output:\n{proc.stderr[-2000:]}")
            print(f"op={op} concurrency={concurrency}: {int(m.group(1)) / n:,.0f} instructions per op", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="put", choices=OPS)
    ap.add_argument("-n", type=int, default=20_000, help="operations")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of both ends")
    ap.add_argument("--callgrind", action="store_true", help="instructions per op under valgrind (every --op)")
    ap.add_argument("--ops", default=",".join(OPS), help="with --callgrind: which ops (comma-separated)")
    args = ap.parse_args()
    if args.callgrind:
        callgrind(args.ops.split(","), min(args.n, 5_000), args.concurrency)
        return
    dt = measure(args.op, args.n, args.concurrency, args.profile)
    print(f"op={args.op} concurrency={args.concurrency}: {1e6 * dt / args.n:.1f} us per op ({args.n} ops)")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
