#!/usr/bin/env python
"""Allreduce bandwidth and latency: aionet vs torch.distributed (gloo) vs MPI, same run.

N local processes per implementation, float32 sum-allreduce of each size; rank 0 reports the
median time over ``--iters`` calls after a warm-up, and the table shows nccl-tests' columns:
algbw = bytes / time, busbw = algbw * 2 (n - 1) / n (what each link carries, comparable across
group sizes), plus #wrong (elements differing from the expected sum on any rank). aionet's rows
also give CPU time, minor page faults and context switches per call, summed over the ranks
(``getrusage`` around each timed call): the cost of a call, which other tenants' load moves less
than it moves wall time. ``--algorithm ring,direct`` alternates aionet's algorithms call by call
in the same processes, so a load change hits each alike. aionet writes its result into a
preallocated ``out=`` as the MPI worker's ``Allreduce(x, y)`` does (gloo reduces in place);
``--out new`` measures a fresh result array per call (rows in BENCHMARKS.md before 2026-11-27
05:10 UTC), ``--out new,out`` both.

- aionet: ``aionet.Node`` processes over tcp://127.0.0.1, ``node.group().allreduce``;
- gloo: ``torch.distributed`` with the gloo backend over TCP (skipped without torch);
- mpi-tcp / mpi-shm: mpi4py ``Allreduce`` under Open MPI's ``mpirun``, ``--mca btl tcp,self``
  and ``vader,self`` (skipped without ``mpirun`` and mpi4py; Debian's ``python3-mpi4py`` for
  ``/usr/bin/python3`` works: ``--mpi-python``).

    python benchmarks/collectives.py --nodes 2,4 --sizes 8,1M,16M,64M
    python benchmarks/collectives.py --quick --json /tmp/coll.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parent.parent


def parse_size(s: str) -> int:
    s = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def iters_for(nbytes: int, base: int) -> int:
    return max(3, min(base, int(base * (1 << 20) / max(nbytes, 1))))


def check(out: Any, n: int, np: Any) -> int:
    return int(np.count_nonzero(np.asarray(out) != n))


# ---------------------------------------------------------------------------- workers
def worker_aionet(
    rank: int, n: int, seed: str | None, sizes: list[int], iters: int, algorithm: str = "auto", out: str = "out"
) -> None:
    import resource

    import numpy as np

    from aionet import Node

    async def main() -> None:
        node = Node(name=f"r{rank}", listen="tcp://127.0.0.1:0", join=[seed] if seed else None)
        await node.start()
        try:
            if rank == 0:
                print("ADDR", node.address, flush=True)
            names = [f"r{i}" for i in range(n)]
            t0 = time.monotonic()
            while not all(node.members().get(m, {}).get("state") == "alive" for m in names):
                if time.monotonic() - t0 > 30:
                    raise SystemExit("members did not all join")
                await asyncio.sleep(0.01)
            grp = node.group(members=names, name="bench")
            await grp.barrier()
            # several variants alternate call by call, so a change in the machine's load hits each alike;
            # "+out": the result goes to a preallocated out= (as MPI's Allreduce(x, y) here)
            algs = [a + ("+out" if o == "out" else "") for a in algorithm.split(",") for o in out.split(",")]
            for nbytes in sizes:
                x = np.ones(max(1, nbytes // 4), dtype=np.float32)
                y = np.empty_like(x)
                k = iters_for(nbytes, iters)

                async def call(variant: str, x: Any = x, y: Any = y) -> Any:
                    alg, _, to = variant.partition("+")
                    return await grp.allreduce(x, algorithm=alg, out=y if to else None)

                for alg in algs:
                    await call(alg)
                times: dict[str, list[float]] = {a: [] for a in algs}
                cost = {a: np.zeros(3) for a in algs}  # CPU s, page faults, context switches
                wrong = 0
                for i in range(k * len(algs)):
                    alg = algs[i % len(algs)]
                    await grp.barrier()
                    u0 = resource.getrusage(resource.RUSAGE_SELF)
                    t = time.perf_counter()
                    res = await call(alg)
                    times[alg].append(time.perf_counter() - t)
                    u1 = resource.getrusage(resource.RUSAGE_SELF)
                    cost[alg] += (
                        u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime,
                        u1.ru_minflt - u0.ru_minflt,
                        u1.ru_nvcsw + u1.ru_nivcsw - u0.ru_nvcsw - u0.ru_nivcsw,
                    )
                    wrong += check(res, n, np)
                wrong = sum(await grp.allgather(wrong))
                for alg in algs:
                    # per call, summed over the ranks: what the run costs the machine, which
                    # load inflates less than it inflates wall time
                    c = np.sum(await grp.allgather(cost[alg] / k), axis=0).tolist()
                    if rank == 0:
                        rec = {"bytes": x.nbytes, "times": times[alg], "wrong": wrong, "algorithm": alg}
                        print("RESULT", json.dumps({**rec, "cpu": c[0], "minflt": c[1], "switches": c[2]}), flush=True)
            await grp.barrier()
        finally:
            await node.stop()

    import uvloop

    uvloop.run(main())


def worker_gloo(rank: int, n: int, port: int, sizes: list[int], iters: int) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    try:
        for nbytes in sizes:
            x = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
            k = iters_for(nbytes, iters)
            y = x.clone()
            dist.all_reduce(y)
            times, wrong = [], 0
            for _ in range(k):
                y.copy_(x)
                dist.barrier()
                t = time.perf_counter()
                dist.all_reduce(y)
                times.append(time.perf_counter() - t)
                wrong += check(y.numpy(), n, np)
            w = torch.tensor([wrong])
            dist.all_reduce(w)
            if rank == 0:
                print("RESULT", json.dumps({"bytes": x.numel() * 4, "times": times, "wrong": int(w)}), flush=True)
    finally:
        dist.destroy_process_group()


MPI_WORKER = r"""
import json, sys, time
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, n = comm.Get_rank(), comm.Get_size()
sizes, base = json.loads(sys.argv[1]), int(sys.argv[2])
for nbytes in sizes:
    x = np.ones(max(1, nbytes // 4), dtype=np.float32)
    y = np.empty_like(x)
    k = max(3, min(base, int(base * (1 << 20) / max(nbytes, 1))))
    comm.Allreduce(x, y)
    times, wrong = [], 0
    for _ in range(k):
        comm.Barrier()
        t = time.perf_counter()
        comm.Allreduce(x, y)
        times.append(time.perf_counter() - t)
        wrong += int(np.count_nonzero(y != n))
    wrong = comm.allreduce(wrong)
    if rank == 0:
        print("RESULT", json.dumps({"bytes": x.nbytes, "times": times, "wrong": wrong}), flush=True)
"""


# ---------------------------------------------------------------------------- drivers
def collect(procs: list[subprocess.Popen[str]], first: subprocess.Popen[str], timeout: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    assert first.stdout is not None
    for line in first.stdout:
        if line.startswith("RESULT "):
            out.append(json.loads(line[7:]))
        if time.monotonic() > deadline:
            break
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return out


def run_aionet(
    n: int, sizes: list[int], iters: int, timeout: float, algorithm: str = "auto", out: str = "out"
) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, str(SCRIPT), "--worker", "aionet", "--size", str(n), "--sizes", json.dumps(sizes)]
    base += ["--iters", str(iters), "--algorithm", algorithm, "--out", out]
    first = subprocess.Popen([*base, "--rank", "0"], stdout=subprocess.PIPE, text=True, env=env)
    assert first.stdout is not None
    line = first.stdout.readline()
    if not line.startswith("ADDR "):
        first.kill()
        raise RuntimeError(f"aionet rank 0 did not start: {line!r}")
    seed = line.split()[1]
    rest = [subprocess.Popen([*base, "--rank", str(r), "--seed", seed], env=env) for r in range(1, n)]
    return collect([first, *rest], first, timeout)


def run_gloo(n: int, sizes: list[int], iters: int, timeout: float) -> list[dict[str, Any]]:
    port = free_port()
    base = [sys.executable, str(SCRIPT), "--worker", "gloo", "--size", str(n), "--sizes", json.dumps(sizes)]
    base += ["--iters", str(iters), "--port", str(port)]
    procs = [subprocess.Popen([*base, "--rank", str(r)], stdout=subprocess.PIPE, text=True) for r in range(n)]
    return collect(procs, procs[0], timeout)


def run_mpi(n: int, sizes: list[int], iters: int, timeout: float, btl: str, python: str) -> list[dict[str, Any]]:
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n), "--mca", "btl", btl]
    if "tcp" in btl:
        cmd += ["--mca", "btl_tcp_if_include", "lo"]
    cmd += [python, "-c", MPI_WORKER, json.dumps(sizes), str(iters)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return collect([p], p, timeout)


def available(args: argparse.Namespace) -> dict[str, str | None]:
    """impl -> None if it can run here, else why not."""
    out: dict[str, str | None] = {"aionet": None}
    try:
        import torch.distributed as dist

        out["gloo"] = None if dist.is_available() else "torch.distributed unavailable"
    except ImportError:
        out["gloo"] = "torch not installed (pip install torch==2.13.0)"
    if shutil.which("mpirun") is None:
        why: str | None = "mpirun not found (apt-get install openmpi-bin python3-mpi4py)"
    else:
        ok = subprocess.run([args.mpi_python, "-c", "import mpi4py, numpy"], capture_output=True).returncode == 0
        hint = "apt-get install python3-mpi4py python3-numpy"
        why = None if ok else f"{args.mpi_python} cannot import mpi4py and numpy ({hint})"
    out["mpi-tcp"] = out["mpi-shm"] = why
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="2,4", help="group sizes, comma separated")
    ap.add_argument("--sizes", default="8,64K,1M,16M,64M", help="bytes per rank, comma separated (K/M/G)")
    ap.add_argument("--impls", default="aionet,gloo,mpi-tcp,mpi-shm")
    ap.add_argument("--iters", type=int, default=20, help="timed calls at 1 MiB (more below, fewer above)")
    ap.add_argument("--quick", action="store_true", help="8 B, 1 MiB and 16 MiB, 2 and 4 nodes, fewer calls")
    ap.add_argument("--mpi-python", default="/usr/bin/python3", help="python with mpi4py for the MPI runs")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument(
        "--algorithm",
        default="auto",
        help="aionet's allreduce algorithm (auto, ring, doubling, direct, tree); several, comma separated, "
        "alternate call by call",
    )
    ap.add_argument(
        "--out",
        default="out",
        help="aionet's result: 'new' array per call, 'out' (a preallocated out=, as the MPI worker's "
        "Allreduce(x, y)), or 'new,out' alternated",
    )
    # worker mode (internal)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--seed", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "aionet":
        return worker_aionet(
            args.rank, args.size, args.seed, json.loads(args.sizes), args.iters, args.algorithm, args.out
        )
    if args.worker == "gloo":
        return worker_gloo(args.rank, args.size, args.port, json.loads(args.sizes), args.iters)
    if args.quick:
        args.sizes, args.iters = "8,1M,16M", min(args.iters, 10)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    groups = [int(n) for n in args.nodes.split(",")]
    impls = args.impls.split(",")
    avail = available(args)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for n in groups:
        for impl in impls:
            if avail.get(impl):
                print(f"skip {impl}: {avail[impl]}", file=sys.stderr)
                continue
            t = time.monotonic()
            if impl == "aionet":
                res = run_aionet(n, sizes, args.iters, args.timeout, args.algorithm, args.out)
            elif impl == "gloo":
                res = run_gloo(n, sizes, args.iters, args.timeout)
            else:
                btl = "tcp,self" if impl == "mpi-tcp" else "vader,self"
                res = run_mpi(n, sizes, args.iters, args.timeout, btl, args.mpi_python)
            results.setdefault(str(n), {})[impl] = res
            print(f"  n={n} {impl:8s} {time.monotonic() - t:5.1f}s", file=sys.stderr)
    table(results, impls)
    if args.json:
        Path(args.json).write_text(json.dumps({"sizes": sizes, "results": results}, indent=1))


def table(results: dict[str, dict[str, list[dict[str, Any]]]], impls: list[str]) -> None:
    print("float32 sum-allreduce, median time over the timed calls (spread: min-max); busbw = algbw * 2(n-1)/n")
    print(
        f"{'n':>2} {'size':>9} {'impl':>8} {'time us':>10} {'(min-max)':>19} {'algbw GB/s':>10} {'busbw GB/s':>10}"
        f" {'#wrong':>6}"
    )
    for n, by_impl in results.items():
        nn = int(n)
        best: dict[int, dict[str, float]] = {}
        for impl in impls:
            for r in by_impl.get(impl, []):
                med = statistics.median(r["times"])
                alg = r["bytes"] / med / 1e9
                bus = alg * 2 * (nn - 1) / nn
                best.setdefault(r["bytes"], {})[impl] = bus if r["bytes"] >= 1 << 20 else -med
                lo, hi = min(r["times"]) * 1e6, max(r["times"]) * 1e6
                cost = ""
                if "cpu" in r:  # aionet's ranks, summed
                    cost = f"  {r['algorithm']}: cpu {r['cpu'] * 1e3:.2f} ms/call, {r['minflt']:.0f} minflt"
                    cost += f", {r['switches']:.1f} csw"
                print(
                    f"{n:>2} {r['bytes']:>9} {impl:>8} {med * 1e6:>10.1f} {f'({lo:.0f}-{hi:.0f})':>19} "
                    f"{alg:>10.3f} {bus:>10.3f} {r['wrong']:>6}{cost}"
                )
        for nbytes, by in sorted(best.items()):
            if "aionet" not in by or len(by) < 2:
                continue
            others = {k: v for k, v in by.items() if k in ("gloo", "mpi-tcp")}  # the bar: TCP peers
            if not others:
                continue
            if nbytes >= 1 << 20:
                k, v = max(others.items(), key=lambda kv: kv[1])
                print(f"   n={n} {nbytes} B: aionet busbw / best other ({k}) = {by['aionet'] / v:.2f}x")
            else:
                k, v = max(others.items(), key=lambda kv: kv[1])  # least negative = fastest
                print(f"   n={n} {nbytes} B: aionet time / fastest other ({k}) = {by['aionet'] / v:.2f}x")


if __name__ == "__main__":
    main()
