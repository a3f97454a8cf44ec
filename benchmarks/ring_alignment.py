#!/usr/bin/env python
"""What the arrays' placement costs aionet's compiled ring: N bare processes (no node), a TCP
loopback ring, the same allreduce with x and y placed differently, alternated call by call.

Each variant places both arrays at an offset from a page boundary ("numpy" is ``np.empty``, 16
bytes into its mapping for large arrays; "torch+64" is where torch's allocator puts a large tensor).
Alternating in one set of processes makes a load swing hit every variant alike. Every rank prints
the median wall time and CPU (its ring thread's user + sys, RUSAGE_THREAD) per call per variant;
the driver prints the mean over ranks.

    python benchmarks/ring_alignment.py --nodes 4 --size 64M --iters 8
    python benchmarks/ring_alignment.py --nodes 2 --size 16M --iters 16 --variants numpy,0,64,1024
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from collectives import parse_size  # benchmarks/collectives.py, beside this script

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parent.parent


def placed(count: int, variant: str, np: Any) -> Any:
    """float32 array of ``count`` elements: numpy's own, or ``variant`` bytes past a page."""
    if variant == "numpy":
        return np.empty(count, np.float32)
    past = int(variant.removeprefix("torch+"))
    raw = np.empty(count * 4 + 4096 + past, np.uint8)
    start = -raw.ctypes.data % 4096 + past
    return raw[start : start + count * 4].view(np.float32)


def worker(rank: int, n: int, ports: list[int], nbytes: int, iters: int, variants: list[str], segment: int) -> None:
    import numpy as np

    from aionet.collectives.native import load_native

    lib = load_native()
    if isinstance(lib, str):
        raise SystemExit(lib)
    ls = socket.create_server(("127.0.0.1", ports[rank]))
    deadline = time.monotonic() + 30
    while True:
        try:
            right = socket.create_connection(("127.0.0.1", ports[(rank + 1) % n]))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    left, _ = ls.accept()
    ls.close()
    for s in (left, right):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
    abort_r, _abort_w = os.pipe()
    count = nbytes // 4
    bufs = {}
    for v in variants:
        x, y = placed(count, v, np), placed(count, v, np)
        x[:] = 1
        y[:] = 0
        bufs[v] = (x, y)
    seg = segment // 4
    seq = 0
    cost: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    wrong = 0
    for i in range(iters + 1):  # the first round is the warm-up
        for v, (x, y) in bufs.items():
            u0, t0 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
            rc = lib.allreduce(left.fileno(), right.fileno(), abort_r, x, y, None, 0, 0, n, rank, seg, seq)
            dt, u1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_THREAD)
            seq += 1
            if rc[0] != 0:
                raise SystemExit(f"rank {rank}: the ring failed: {rc}")
            wrong += int(np.count_nonzero(y != n))
            if i:
                cost[v].append((dt, u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime))
    out = {v: [statistics.median(c[0] for c in cs), statistics.median(c[1] for c in cs)] for v, cs in cost.items()}
    print("RESULT", json.dumps({"rank": rank, "wrong": wrong, "variants": out}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--size", default="64M", help="bytes per rank (K/M/G)")
    ap.add_argument("--iters", type=int, default=8, help="timed calls per variant")
    ap.add_argument(
        "--variants",
        default="numpy,0,16,8,torch+64",
        help="comma separated: 'numpy', or bytes past a page (0, 8, 16, 64, ...); 'torch+64' is torch's placement",
    )
    ap.add_argument("--segment", help="bytes per piece (K/M; default: the native ring's, SEGMENT_BYTES)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ports", help=argparse.SUPPRESS)
    args = ap.parse_args()
    nbytes, variants = parse_size(args.size), args.variants.split(",")
    if args.segment is None:
        sys.path.insert(0, str(ROOT))
        from aionet.collectives.native import SEGMENT_BYTES

        args.segment = str(SEGMENT_BYTES)
    segment = parse_size(args.segment)
    if args.worker is not None:
        return worker(args.worker, args.nodes, json.loads(args.ports), nbytes, args.iters, variants, segment)
    ports = []
    holders = []
    for _ in range(args.nodes):  # distinct free ports, held until all are chosen
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        holders.append(s)
        ports.append(s.getsockname()[1])
    for s in holders:
        s.close()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, str(SCRIPT), "--nodes", str(args.nodes), "--size", args.size]
    base += ["--iters", str(args.iters), "--variants", args.variants, "--ports", json.dumps(ports)]
    base += ["--segment", str(segment)]
    procs = [
        subprocess.Popen([*base, "--worker", str(r)], stdout=subprocess.PIPE, text=True, env=env)
        for r in range(args.nodes)
    ]
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=args.timeout)
            results += [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if len(results) != args.nodes:
        raise SystemExit(f"{len(results)} of {args.nodes} ranks reported")
    print(
        f"{args.nodes} ranks, {nbytes} bytes, float32 sum, {segment >> 10} KiB pieces, "
        f"{args.iters} calls per variant, alternated"
    )
    print(f"{'variant':>10} {'ms/call':>8} {'CPU ms/call':>12}   (mean over ranks of each rank's median; #wrong)")
    for v in variants:
        wall = statistics.mean(r["variants"][v][0] for r in results) * 1e3
        cpu = statistics.mean(r["variants"][v][1] for r in results) * 1e3
        print(f"{v:>10} {wall:8.1f} {cpu:12.1f}")
    print("#wrong", sum(r["wrong"] for r in results))


if __name__ == "__main__":
    main()
