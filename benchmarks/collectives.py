#!/usr/bin/env python
"""Allreduce bandwidth and latency: aionet vs torch.distributed (gloo) vs MPI, same run.

N local processes per implementation, float32 sum-allreduce of each size; rank 0 reports the
median time over ``--iters`` calls after a warm-up, and the table shows nccl-tests' columns:
algbw = bytes / time, busbw = algbw * 2 (n - 1) / n (what each link carries, comparable across
group sizes), plus #wrong (elements differing from the expected sum on any rank). Every row also
gives CPU time, minor page faults and context switches per call, summed over the ranks
(``getrusage`` around each timed call, all threads): the cost of a call, which other tenants' load
moves less than it moves wall time; and ``cpu-bound``, the busbw if that CPU were the only limit
on this machine's cores (MPI's ranks poll while they wait, so its CPU and that bound include the
polling); and ``runq``, the time the ranks' threads were runnable but waited for a CPU (Linux
schedstat run delay, summed over ranks and threads, read before each call's barrier: reading
it costs ~30 us per thread, which read after the barrier delayed each call's start by the
slowest rank's read, more for ranks with more threads; from 2026-11-28 12:40 UTC): waiting for
the machine, which a rank with more threads or a higher priority (``chrt -f 10``) gets less of,
not for its peers.
``--algorithm ring,direct``
alternates aionet's algorithms call by call in the same processes, so a load change hits each
alike. By default aionet alternates a preallocated ``out=`` (as the MPI worker's
``Allreduce(x, y)``) and in place (``out=`` the input, as gloo reduces and as raw's in-place
ring), and the table takes the better of the two, as it does for raw (in place was added
2026-11-27 14:40 UTC; rows before that are out of place only); ``--out new`` measures a fresh
result array per call (rows in BENCHMARKS.md before 2026-11-27 05:10 UTC). ``--arrays`` allocates
every implementation's arrays alike (from 2026-11-29 02:42 UTC; gloo's were torch's own before,
the others numpy's): on a page by default, or as numpy or torch place them; the kernel's copy into
the receiving array depends on where it starts (BENCHMARKS.md, "Array alignment"). cring's arrays
are its own, 2 MiB-aligned.

- aionet: ``aionet.Node`` processes over tcp://127.0.0.1, ``node.group().allreduce``, started
  with the settings ``aionet launch`` gives its ranks (from 2026-11-28 15:10 UTC: with more ranks
  than cores, ``AIONET_COLLECTIVES_PIPELINE_SEGMENTS=1``, whole ring chunks; from 17:40 UTC with
  at least as many ranks as cores, so n = 2 on 2 cores too; from 21:00 UTC, with more ranks than
  cores, also ``AIONET_NODE_BUSY_POLL_US=0``, so n = 4 on 2 cores runs without busy polling;
  unless set already);
- gloo: ``torch.distributed`` with the gloo backend over TCP (skipped without torch);
- mpi-tcp / mpi-shm: mpi4py ``Allreduce`` under Open MPI's ``mpirun``, ``--mca btl tcp,self``
  and ``vader,self`` (skipped without ``mpirun`` and mpi4py; Debian's ``python3-mpi4py`` for
  ``/usr/bin/python3`` works: ``--mpi-python``);
- raw (``--impls raw``, not in the default set): the yardstick, a ring reduce-scatter + allgather
  with no framework at all (plain blocking TCP_NODELAY sockets on 127.0.0.1, a sender thread, numpy
  ``out=`` reductions, pipelined in ``--segment`` pieces), out of place and in place alternated call
  by call; the ratios X/raw say how far each implementation is from what the algorithm reaches on
  this machine, and whether 1.2x the best TCP peer is above it;
- cring (``--impls cring``, not in the default set, sizes of 1 MiB and up): the same ring in C
  (``benchmarks/ring_floor.c``, compiled with ``cc -O3 -march=native`` into the temp directory on
  first use): one thread per rank, non-blocking sockets and ``poll``, the first ``--segment``
  size as its piece; its CPU per call is the floor any implementation over this machine's TCP
  sockets stands on.

    python benchmarks/collectives.py --nodes 2,4 --sizes 8,1M,16M,64M
    python benchmarks/collectives.py --quick --json /tmp/coll.json
    python benchmarks/collectives.py --nodes 2,4 --sizes 16M,64M --iters 10 --impls aionet,gloo,mpi-tcp,raw
    python benchmarks/collectives.py --nodes 2,4 --sizes 16M,64M --iters 10 --impls aionet,gloo,mpi-tcp --rounds 5
    python benchmarks/collectives.py --nodes 2,4 --sizes 16M,64M --impls raw --segment 256K,1M,4M
    python benchmarks/collectives.py --nodes 2 --sizes 16M --impls aionet,mpi-tcp,cring --segment 8M --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import inspect
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
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


def runq_s() -> float:
    """Seconds this process's threads have spent runnable but waiting for a CPU (Linux
    schedstat run delay; 0 elsewhere): a rank that waits for the machine, not for its peers."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    total = 0
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return total / 1e9


def alloc(count: int, np: Any) -> Any:
    """An uninitialized float32 array for the timed calls, allocated alike for every
    implementation (``--arrays``, passed to the workers as BENCH_ARRAYS): "aligned" starts it on a
    page, as aionet.collectives.empty_aligned does; "numpy" is ``np.empty`` (16 bytes into its
    mapping for a large array); "torch" 64 bytes past a page, where torch's CPU allocator puts a
    large tensor (gloo's own, before 2026-11-29). Where the kernel receives into changes the cost
    on this machine (BENCHMARKS.md, "Array alignment"), so implementations compared on different
    allocations would partly measure the allocator."""
    how = os.environ.get("BENCH_ARRAYS", "aligned")
    if how == "numpy":
        return np.empty(count, np.float32)
    past = 64 if how == "torch" else 0
    raw = np.empty(count * 4 + 4096 + past, np.uint8)
    start = -raw.ctypes.data % 4096 + past
    return raw[start : start + count * 4].view(np.float32)


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
            # "+out": the result goes to a preallocated out= (as MPI's Allreduce(x, y) here);
            # "+inplace": out= the input itself (as gloo, and the raw ring's in-place variant)
            suffix = {"new": "", "out": "+out", "inplace": "+inplace"}
            algs = [a + suffix[o] for a in algorithm.split(",") for o in out.split(",")]
            for nbytes in sizes:
                x, y = alloc(max(1, nbytes // 4), np), alloc(max(1, nbytes // 4), np)
                x[:] = 1
                z = alloc(x.size, np)  # the in-place variant's buffer, reset to x before each call
                k = iters_for(nbytes, iters)

                async def call(variant: str, x: Any = x, y: Any = y, z: Any = z) -> Any:
                    alg, _, to = variant.partition("+")
                    if to == "inplace":
                        return await grp.allreduce(z, algorithm=alg, out=z)
                    return await grp.allreduce(x, algorithm=alg, out=y if to else None)

                for alg in algs:
                    z[:] = x
                    await call(alg)
                times: dict[str, list[float]] = {a: [] for a in algs}
                cost = {a: np.zeros(4) for a in algs}  # CPU s, page faults, context switches, run-queue s
                wrong = 0
                for i in range(k * len(algs)):
                    alg = algs[i % len(algs)]
                    if alg.endswith("+inplace"):
                        z[:] = x  # untimed, as the raw ring's reset and the gloo worker's copy_
                    q0 = runq_s()  # before the barrier: reading /proc per thread takes 100s of us
                    await grp.barrier()
                    u0 = resource.getrusage(resource.RUSAGE_SELF)
                    t = time.perf_counter()
                    res = await call(alg)
                    times[alg].append(time.perf_counter() - t)
                    u1, q1 = resource.getrusage(resource.RUSAGE_SELF), runq_s()
                    cost[alg] += (
                        u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime,
                        u1.ru_minflt - u0.ru_minflt,
                        u1.ru_nvcsw + u1.ru_nivcsw - u0.ru_nvcsw - u0.ru_nivcsw,
                        q1 - q0,
                    )
                    wrong += check(res, n, np)
                wrong = sum(await grp.allgather(wrong))
                for alg in algs:
                    # per call, summed over the ranks: what the run costs the machine, which
                    # load inflates less than it inflates wall time
                    c = np.sum(await grp.allgather(cost[alg] / k), axis=0).tolist()
                    if rank == 0:
                        rec = {"bytes": x.nbytes, "times": times[alg], "wrong": wrong, "algorithm": alg}
                        print(
                            "RESULT",
                            json.dumps({**rec, "cpu": c[0], "minflt": c[1], "switches": c[2], "runq": c[3]}),
                            flush=True,
                        )
            await grp.barrier()
        finally:
            await node.stop()

    import uvloop

    uvloop.run(main())


def worker_gloo(rank: int, n: int, port: int, sizes: list[int], iters: int) -> None:
    import resource

    import numpy as np
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    try:
        for nbytes in sizes:
            x = torch.from_numpy(alloc(max(1, nbytes // 4), np))
            x.fill_(1)
            k = iters_for(nbytes, iters)
            y = torch.from_numpy(alloc(x.numel(), np))  # reduced in place, reset to x before each call
            y.copy_(x)
            dist.all_reduce(y)
            times, wrong, cost = [], 0, np.zeros(4)
            for _ in range(k):
                y.copy_(x)
                q0 = runq_s()  # all threads, gloo's own included; before the barrier (it is slow)
                dist.barrier()
                u0 = resource.getrusage(resource.RUSAGE_SELF)
                t = time.perf_counter()
                dist.all_reduce(y)
                times.append(time.perf_counter() - t)
                u1, q1 = resource.getrusage(resource.RUSAGE_SELF), runq_s()
                cost += (
                    u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime,
                    u1.ru_minflt - u0.ru_minflt,
                    u1.ru_nvcsw + u1.ru_nivcsw - u0.ru_nvcsw - u0.ru_nivcsw,
                    q1 - q0,
                )
                wrong += check(y.numpy(), n, np)
            w = torch.tensor([float(wrong), *(cost / k)], dtype=torch.float64)
            dist.all_reduce(w)
            c = w.tolist()
            if rank == 0:
                rec = {"bytes": x.numel() * 4, "times": times, "wrong": int(c[0]), "algorithm": "in place"}
                print(
                    "RESULT",
                    json.dumps({**rec, "cpu": c[1], "minflt": c[2], "switches": c[3], "runq": c[4]}),
                    flush=True,
                )
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------- raw sockets (the yardstick)
RAW_SEGMENT = 4 << 20  # bytes per pipelined piece: of 256 KiB-8 MiB, 4-8 MiB cost the least CPU (BENCHMARKS.md)


class RawRing:
    """A ring allreduce with no framework, the yardstick for the busbw bar: what the algorithm reaches here.

    Rank r holds a TCP_NODELAY socket to its right neighbour (sends only) and one from its left
    (receives only). A sender thread does ``sendall`` of memoryviews (the GIL is released during
    the copy into the kernel) while the calling thread ``recv_into``s a preallocated segment buffer
    and reduces it with ``np.add(..., out=)``; each reduced segment is queued for sending at once,
    so the reduction of segment k overlaps the transfer of segment k+1 and the ring's steps overlap.
    Measured (BENCHMARKS.md): above gloo and MPI at n = 2; at n = 4 (4 ranks, 4 sender threads, 2
    cores) it costs about gloo's CPU per byte but waits more, so there it is no upper bound.
    """

    def __init__(self, rank: int, n: int, ports: list[int], sockbuf: int) -> None:
        import queue
        import threading

        self.rank, self.n = rank, n
        lsock = socket.socket()
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if sockbuf:  # set before listen/connect so the window scales to it
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)
        lsock.bind(("127.0.0.1", ports[rank]))
        lsock.listen(1)
        right = socket.socket()
        if sockbuf:
            right.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockbuf)
        deadline = time.monotonic() + 30
        while True:
            try:
                right.connect(("127.0.0.1", ports[(rank + 1) % n]))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        self.left, _ = lsock.accept()
        lsock.close()
        self.right = right
        for s in (self.left, self.right):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.todo: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._send_loop, daemon=True)
        self.thread.start()
        self.token = bytearray(1)

    def _send_loop(self) -> None:
        sendall, get, put = self.right.sendall, self.todo.get, self.done.put
        while True:
            item = get()
            if item is None:
                put(None)
            elif item is False:
                return
            else:
                try:
                    sendall(item)
                except BaseException as e:  # reported to the caller, which raises it
                    put(e)
                    return

    def _recv(self, view: memoryview) -> None:
        recv_into, got, want = self.left.recv_into, 0, len(view)
        while got < want:  # MSG_WAITALL: one Python call per segment, not one per arriving packet
            k = recv_into(view[got:], 0, socket.MSG_WAITALL)
            if not k:
                raise ConnectionError("left neighbour closed")
            got += k

    def barrier(self) -> None:
        """A token twice around the ring: nobody leaves before everyone has arrived."""
        one = memoryview(self.token)
        for _ in range(2):
            if self.rank == 0:
                self.right.sendall(b"\0")
                self._recv(one)
            else:
                self._recv(one)
                self.right.sendall(b"\0")

    def allreduce(self, x: Any, y: Any, rbuf: Any, segment: int) -> None:
        """y = sum over ranks of x (y may be x: in place), in pieces of ``segment`` bytes received into rbuf."""
        import numpy as np

        n, r, put = self.n, self.rank, self.todo.put
        if n == 1:
            if y is not x:
                y[:] = x
            return
        step = max(1, segment // x.itemsize)
        bounds = [len(x) * i // n for i in range(n + 1)]

        def segs(c: int) -> list[tuple[int, int]]:
            return [(a, min(a + step, bounds[c + 1])) for a in range(bounds[c], bounds[c + 1], step)]

        xb, yb = memoryview(x).cast("B"), memoryview(y).cast("B")
        rb = memoryview(rbuf).cast("B")
        isz = x.itemsize
        for a, b in segs(r):  # reduce-scatter step 0 sends this rank's own chunk of the input
            put(xb[a * isz : b * isz])
        for s in range(n - 1):  # reduce-scatter: receive a partial sum, add ours, pass it on
            for a, b in segs((r - s - 1) % n):
                self._recv(rb[: (b - a) * isz])
                np.add(x[a:b], rbuf[: b - a], out=y[a:b])
                put(yb[a * isz : b * isz])  # the next step's send (or the allgather's first)
        for s in range(n - 1):  # allgather: receive a finished chunk straight into y, pass it on
            last = s == n - 2
            for a, b in segs((r - s) % n):
                self._recv(yb[a * isz : b * isz])
                if not last:
                    put(yb[a * isz : b * isz])
        put(None)
        err = self.done.get()
        if err is not None:
            raise err

    def close(self) -> None:
        self.todo.put(False)
        self.thread.join(timeout=5)
        self.left.close()
        self.right.close()


def worker_raw(
    rank: int, n: int, ports: list[int], sizes: list[int], iters: int, segments: list[int], sockbuf: int
) -> None:
    import resource

    import numpy as np

    ring = RawRing(rank, n, ports, sockbuf)
    rbuf = np.empty(max(segments) // 4 + 1, dtype=np.float32)

    def gather(v: float) -> float:
        """Sum a float over the ranks through the ring itself (for #wrong and the cost columns)."""
        a = np.array([v] * n, dtype=np.float64)
        out = np.empty_like(a)
        # a float64 ring of n elements: one element per chunk, reduced as float64 with its own scratch
        ring.allreduce(a, out, np.empty(n, dtype=np.float64), 8)
        return float(out[0])

    try:
        ring.barrier()
        for nbytes in sizes:
            x, y = alloc(max(1, nbytes // 4), np), alloc(max(1, nbytes // 4), np)
            x[:] = 1
            k = iters_for(nbytes, iters)
            # alternated call by call, so a change in the machine's load hits each alike
            variants = [(v, seg) for seg in segments for v in ("out", "inplace")]
            for seg in segments:
                ring.allreduce(x, y, rbuf, seg)
            times: dict[tuple[str, int], list[float]] = {v: [] for v in variants}
            cost = {v: np.zeros(4) for v in variants}
            wrong = 0
            for i in range(k * len(variants)):
                v = variants[i % len(variants)]
                dst = y
                if v[0] == "inplace":
                    y[:] = 1.0  # untimed reset of the buffer reduced in place (as the gloo worker's copy_)
                    src = dst = y
                else:
                    src = x
                q0 = runq_s()  # before the barrier (it is slow)
                ring.barrier()
                u0 = resource.getrusage(resource.RUSAGE_SELF)
                t = time.perf_counter()
                ring.allreduce(src, dst, rbuf, v[1])
                times[v].append(time.perf_counter() - t)
                u1, q1 = resource.getrusage(resource.RUSAGE_SELF), runq_s()
                cost[v] += (
                    u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime,
                    u1.ru_minflt - u0.ru_minflt,
                    u1.ru_nvcsw + u1.ru_nivcsw - u0.ru_nvcsw - u0.ru_nivcsw,
                    q1 - q0,
                )
                wrong += check(dst, n, np)
            wrong = int(gather(wrong))
            for v in variants:
                c = [gather(float(c)) for c in cost[v] / k]
                if rank == 0:
                    label = f"ring+{v[0]} {v[1] >> 10}K"
                    rec = {"bytes": x.nbytes, "times": times[v], "wrong": wrong, "algorithm": label}
                    print(
                        "RESULT",
                        json.dumps({**rec, "cpu": c[0], "minflt": c[1], "switches": c[2], "runq": c[3]}),
                        flush=True,
                    )
        ring.barrier()
    finally:
        ring.close()


MPI_WORKER = r"""
import json, os, resource, sys, time
from typing import Any
import numpy as np
def runq_s():
    try:
        tasks = os.listdir("/proc/self/task")
        return sum(int(open(f"/proc/self/task/{t}/schedstat").read().split()[1]) for t in tasks) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, n = comm.Get_rank(), comm.Get_size()
sizes, base = json.loads(sys.argv[1]), int(sys.argv[2])
ALLOC
for nbytes in sizes:
    x, y = alloc(max(1, nbytes // 4), np), alloc(max(1, nbytes // 4), np)
    x[:] = 1
    k = max(3, min(base, int(base * (1 << 20) / max(nbytes, 1))))
    comm.Allreduce(x, y)
    times, wrong, cost = [], 0, np.zeros(4)
    for _ in range(k):
        q0 = runq_s()  # before the barrier (it is slow)
        comm.Barrier()
        u0 = resource.getrusage(resource.RUSAGE_SELF)
        t = time.perf_counter()
        comm.Allreduce(x, y)
        times.append(time.perf_counter() - t)
        u1, q1 = resource.getrusage(resource.RUSAGE_SELF), runq_s()
        cost += (u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime, u1.ru_minflt - u0.ru_minflt,
                 u1.ru_nvcsw + u1.ru_nivcsw - u0.ru_nvcsw - u0.ru_nivcsw, q1 - q0)
        wrong += int(np.count_nonzero(y != n))
    wrong = comm.allreduce(wrong)
    c = comm.allreduce(cost / k)
    if rank == 0:
        rec = {"bytes": x.nbytes, "times": times, "wrong": wrong, "algorithm": "out="}
        print("RESULT", json.dumps({**rec, "cpu": c[0], "minflt": c[1], "switches": c[2], "runq": c[3]}), flush=True)
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
    # aionet's ranks start as `aionet launch` would start them: with what it gives ranks that
    # fill the cores (aionet.launch.local.shared_cores_env; a value set here wins)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # the workers get it as PYTHONPATH
    from aionet.launch.local import shared_cores_env

    env = {**os.environ, **shared_cores_env(n, os.environ), "PYTHONPATH": str(ROOT)}
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


def run_raw(n: int, sizes: list[int], iters: int, timeout: float, segments: str, sockbuf: str) -> list[dict[str, Any]]:
    ports = [free_port() for _ in range(n)]
    base = [sys.executable, str(SCRIPT), "--worker", "raw", "--size", str(n), "--sizes", json.dumps(sizes)]
    base += ["--iters", str(iters), "--ports", json.dumps(ports), "--segment", segments, "--sockbuf", sockbuf]
    procs = [subprocess.Popen([*base, "--rank", str(r)], stdout=subprocess.PIPE, text=True) for r in range(n)]
    return collect(procs, procs[0], timeout)


def cring_binary() -> Path:
    """benchmarks/ring_floor.c, compiled once per source version into the temp directory."""
    src = ROOT / "benchmarks" / "ring_floor.c"
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    exe = Path(tempfile.gettempdir()) / f"aionet-ring-floor-{digest}"
    if not exe.exists():
        cc = shutil.which("cc") or shutil.which("gcc")
        assert cc is not None  # available() checked
        tmp = exe.with_suffix(f".{os.getpid()}")
        subprocess.run([cc, "-O3", "-march=native", "-o", str(tmp), str(src)], check=True)
        tmp.replace(exe)
    return exe


def run_cring(n: int, sizes: list[int], iters: int, timeout: float, segment: int) -> list[dict[str, Any]]:
    """The C ring (sizes of at least 1 MiB): every rank's costs summed, rank 0's times."""
    big = [b for b in sizes if b >= 1 << 20]
    if not big:
        return []
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from aionet.launch.local import free_port_block

    exe = cring_binary()
    port = free_port_block(n)
    args = [",".join(map(str, big)), str(iters), str(segment)]
    procs = [
        subprocess.Popen([str(exe), str(r), str(n), str(port), *args], stdout=subprocess.PIPE, text=True)
        for r in range(n)
    ]
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
            p.wait()
        return []
    for rank, text in enumerate(outs):
        for line in text.splitlines():
            if not line.startswith("RING "):
                continue
            _, nbytes, variant, cpu, minflt, csw, runq, wrong, times = line.split()
            key = (int(nbytes), variant)
            row = rows.setdefault(
                key,
                {"bytes": int(nbytes), "algorithm": f"c ring+{variant} {segment >> 10}K", "times": [], "wrong": 0}
                | {"cpu": 0.0, "minflt": 0.0, "switches": 0.0, "runq": 0.0},
            )
            if rank == 0:
                row["times"] = [float(t) for t in times.split(",")]
            row["wrong"] += int(wrong)
            for k, v in (("cpu", cpu), ("minflt", minflt), ("switches", csw), ("runq", runq)):
                row[k] += float(v)
    return [r for r in rows.values() if r["times"]]


def run_mpi(n: int, sizes: list[int], iters: int, timeout: float, btl: str, python: str) -> list[dict[str, Any]]:
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n), "--mca", "btl", btl]
    if "tcp" in btl:
        cmd += ["--mca", "btl_tcp_if_include", "lo"]
    worker = MPI_WORKER.replace("ALLOC", inspect.getsource(alloc))  # the same allocation as the others
    cmd += [python, "-c", worker, json.dumps(sizes), str(iters)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return collect([p], p, timeout)


def available(args: argparse.Namespace) -> dict[str, str | None]:
    """impl -> None if it can run here, else why not."""
    out: dict[str, str | None] = {"aionet": None, "raw": None}
    out["cring"] = None if (shutil.which("cc") or shutil.which("gcc")) else "no C compiler (apt-get install gcc)"
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
    ap.add_argument(
        "--impls", default="aionet,gloo,mpi-tcp,mpi-shm", help="any of aionet,gloo,mpi-tcp,mpi-shm,raw,cring"
    )
    ap.add_argument("--iters", type=int, default=20, help="timed calls at 1 MiB (more below, fewer above)")
    ap.add_argument("--quick", action="store_true", help="8 B, 1 MiB and 16 MiB, 2 and 4 nodes, fewer calls")
    ap.add_argument("--mpi-python", default="/usr/bin/python3", help="python with mpi4py for the MPI runs")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument(
        "--algorithm",
        default="auto",
        help="aionet's allreduce algorithm (auto, native, ring, doubling, direct, tree); several, comma separated, "
        "alternate call by call",
    )
    ap.add_argument(
        "--out",
        default="out,inplace",
        help="aionet's result: 'new' array per call, 'out' (a preallocated out=, as the MPI worker's "
        "Allreduce(x, y)), 'inplace' (out= the input, as gloo), or several comma separated, alternated; "
        "the table takes the best, as it does for raw's out= and in-place rings",
    )
    ap.add_argument(
        "--segment",
        default=str(RAW_SEGMENT),
        help="raw: bytes per pipelined piece (K/M); several, comma separated, alternate call by call",
    )
    ap.add_argument(
        "--arrays",
        choices=("aligned", "numpy", "torch"),
        default="aligned",
        help="how every implementation's arrays are allocated: 'aligned' on a page (aionet's empty_aligned), "
        "'numpy' (np.empty: 16 bytes into its mapping), or 'torch' (64 bytes past a page, as torch's allocator)",
    )
    ap.add_argument("--sockbuf", default="0", help="raw: SO_SNDBUF/SO_RCVBUF bytes (K/M; 0: the kernel's autotuning)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every implementation this many times per group size, the order rotated each round, and "
        "judge each cell on the median over rounds (a load swing then hits every implementation alike)",
    )
    # worker mode (internal)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--seed", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ports", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "aionet":
        return worker_aionet(
            args.rank, args.size, args.seed, json.loads(args.sizes), args.iters, args.algorithm, args.out
        )
    if args.worker == "gloo":
        return worker_gloo(args.rank, args.size, args.port, json.loads(args.sizes), args.iters)
    if args.worker == "raw":
        sizes_ = json.loads(args.sizes)
        segs, buf = [parse_size(x) for x in args.segment.split(",")], parse_size(args.sockbuf)
        return worker_raw(args.rank, args.size, json.loads(args.ports), sizes_, args.iters, segs, buf)
    os.environ["BENCH_ARRAYS"] = args.arrays  # every worker inherits it (alloc())
    if args.quick:
        args.sizes, args.iters = "8,1M,16M", min(args.iters, 10)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    groups = [int(n) for n in args.nodes.split(",")]
    impls = args.impls.split(",")
    avail = available(args)
    for impl in impls:
        if avail.get(impl):
            print(f"skip {impl}: {avail[impl]}", file=sys.stderr)
    runnable = [i for i in impls if not avail.get(i)]
    rounds: list[dict[str, dict[str, list[dict[str, Any]]]]] = [{} for _ in range(max(1, args.rounds))]
    for n in groups:
        for k, results in enumerate(rounds):
            for impl in runnable[k % len(runnable) :] + runnable[: k % len(runnable)]:
                t = time.monotonic()
                if impl == "aionet":
                    res = run_aionet(n, sizes, args.iters, args.timeout, args.algorithm, args.out)
                elif impl == "gloo":
                    res = run_gloo(n, sizes, args.iters, args.timeout)
                elif impl == "raw":
                    res = run_raw(n, sizes, args.iters, args.timeout, args.segment, args.sockbuf)
                elif impl == "cring":
                    res = run_cring(n, sizes, args.iters, args.timeout, parse_size(args.segment.split(",")[0]))
                else:
                    btl = "tcp,self" if impl == "mpi-tcp" else "vader,self"
                    res = run_mpi(n, sizes, args.iters, args.timeout, btl, args.mpi_python)
                results.setdefault(str(n), {})[impl] = res
                print(f"  n={n} round {k + 1} {impl:8s} {time.monotonic() - t:5.1f}s", file=sys.stderr)
    for k, results in enumerate(rounds):
        if len(rounds) > 1:
            print(f"\n--- round {k + 1} of {len(rounds)}")
        table(results, impls)
    if len(rounds) > 1:
        summary(rounds, impls)
    if args.json:
        data = {"sizes": sizes, "results": rounds[0], "rounds": rounds}
        Path(args.json).write_text(json.dumps(data, indent=1))


def best_busbw(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[tuple[int, int, str], float]:
    """(n, bytes, impl) -> busbw of that implementation's best variant in one round."""
    out: dict[tuple[int, int, str], float] = {}
    for n, by_impl in results.items():
        nn = int(n)
        for impl, rows in by_impl.items():
            for r in rows:
                bus = r["bytes"] / statistics.median(r["times"]) / 1e9 * 2 * (nn - 1) / nn
                key = (nn, r["bytes"], impl)
                out[key] = max(out.get(key, bus), bus)
    return out


def summary(rounds: list[dict[str, dict[str, list[dict[str, Any]]]]], impls: list[str]) -> None:
    """Each cell judged on medians over the rounds: aionet's busbw against the best TCP peer's."""
    per = [best_busbw(r) for r in rounds]
    cells = sorted({(n, b) for p in per for (n, b, _) in p if b >= 1 << 20})
    print(f"\n=== over {len(rounds)} rounds (busbw GB/s, median and min-max over rounds; bar: aionet / best TCP peer)")
    for n, b in cells:
        med: dict[str, float] = {}
        parts = []
        for impl in impls:
            vals = [p[(n, b, impl)] for p in per if (n, b, impl) in p]
            if vals:
                med[impl] = statistics.median(vals)
                parts.append(f"{impl} {med[impl]:.2f} ({min(vals):.2f}-{max(vals):.2f})")
        line = f"n={n} {b >> 20:>4} MiB: " + ", ".join(parts)
        peers = {k: v for k, v in med.items() if k in ("gloo", "mpi-tcp")}
        if "aionet" in med and peers:
            k, v = max(peers.items(), key=lambda kv: kv[1])
            each = []
            for p in per:
                others = [p[(n, b, i)] for i in ("gloo", "mpi-tcp") if (n, b, i) in p]
                if (n, b, "aionet") in p and others:
                    each.append(p[(n, b, "aionet")] / max(others))
            line += f"; aionet / {k} (medians) {med['aionet'] / v:.2f}x"
            if each:
                line += f", per round {' '.join(f'{x:.2f}' for x in each)}"
        print(line)


def table(results: dict[str, dict[str, list[dict[str, Any]]]], impls: list[str]) -> None:
    print("float32 sum-allreduce, median time over the timed calls (spread: min-max); busbw = algbw * 2(n-1)/n")
    cores = os.cpu_count() or 1
    print("cost: CPU per call summed over the ranks, CPU s per GB of the array per rank, minor faults, switches,")
    print("  runq: time runnable but waiting for a CPU (the machine's load, not the peers), summed over the ranks;")
    print(f"  cpu-bound: the busbw if that CPU were the only limit on this machine's {cores} cores (load-insensitive)")
    print(
        f"{'n':>2} {'size':>9} {'impl':>8} {'time us':>10} {'(min-max)':>19} {'algbw GB/s':>10} {'busbw GB/s':>10}"
        f" {'#wrong':>6}"
    )
    for n, by_impl in results.items():
        nn = int(n)
        # per size and impl, the best of its variants (raw: out= and in place; aionet: --algorithm/--out)
        best: dict[int, dict[str, float]] = {}
        for impl in impls:
            for r in by_impl.get(impl, []):
                med = statistics.median(r["times"])
                alg = r["bytes"] / med / 1e9
                bus = alg * 2 * (nn - 1) / nn
                score = bus if r["bytes"] >= 1 << 20 else -med
                by = best.setdefault(r["bytes"], {})
                by[impl] = max(by.get(impl, score), score)
                lo, hi = min(r["times"]) * 1e6, max(r["times"]) * 1e6
                cost = ""
                if "cpu" in r:
                    cost = f"  {r.get('algorithm', '')}: cpu {r['cpu'] * 1e3:.2f} ms/call"
                    if r["bytes"] >= 1 << 20:
                        cost += f", {r['cpu'] / nn / (r['bytes'] / 1e9):.3f} s/GB/rank"
                        cost += f", cpu-bound {bus * med * cores / max(r['cpu'], 1e-9):.2f} GB/s"
                    cost += f", {r['minflt']:.0f} minflt, {r['switches']:.1f} csw"
                    if "runq" in r:  # waiting for a CPU (the machine's load), not for a peer
                        cost += f", runq {r['runq'] * 1e3:.1f} ms/call"
                print(
                    f"{n:>2} {r['bytes']:>9} {impl:>8} {med * 1e6:>10.1f} {f'({lo:.0f}-{hi:.0f})':>19} "
                    f"{alg:>10.3f} {bus:>10.3f} {r['wrong']:>6}{cost}"
                )
        for nbytes, by in sorted(best.items()):
            others = {k: v for k, v in by.items() if k in ("gloo", "mpi-tcp")}  # the bar: TCP peers
            if not others:
                continue
            k, v = max(others.items(), key=lambda kv: kv[1])  # busbw, or least negative time = fastest
            if "aionet" in by:
                what = "busbw" if nbytes >= 1 << 20 else "time"
                print(f"   n={n} {nbytes} B: aionet {what} / best other ({k}) = {by['aionet'] / v:.2f}x")
            if "raw" in by and nbytes >= 1 << 20:
                # the yardstick: how far each is from a framework-free ring, and whether 1.2x of the
                # best TCP peer is below what that ring reaches here
                ratios = ", ".join(f"{i}/raw {by[i] / by['raw']:.2f}" for i in ("aionet", "gloo", "mpi-tcp") if i in by)
                print(f"   n={n} {nbytes} B busbw: {ratios}; 1.2x best other ({k}) = {1.2 * v / by['raw']:.2f}x raw")


if __name__ == "__main__":
    main()
