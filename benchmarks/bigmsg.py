#!/usr/bin/env python
"""One-way throughput of large messages, aionet against raw uvloop, with CPU and page faults per side.

Two processes over ``tcp://127.0.0.1``: this script sends ``--count`` arrays of ``--size`` bytes
back to back (``await node.send`` / raw ``writelines``), a child receives them (``recv_batch``
dropping each array at once / a raw ``BufferedProtocol`` reading into one reused buffer). Each
side's ``getrusage`` is taken over the measured messages only (after a warm-up), so the
figures are CPU seconds per GB and minor page faults per message, steadier than the rate on a
shared machine, plus how often each side slept (voluntary context switches: it waited for the
other) and how many standalone ACKs the receiver wrote, per message. Rounds alternate raw and
aionet (interleaved), each a fresh process pair.

    PYTHONPATH=$PWD python benchmarks/bigmsg.py --size 1MiB --count 256 --rounds 3

``BIGMSG_CHILD_PREFIX="perf record -o rx.data --"`` runs the receiver under a profiler;
``BIGMSG_HOLD_PREVIOUS=1`` makes the receiver keep each batch until the next one arrives
(as ``p2p.py``'s consumer does). ``--readonly`` sends a read-only array (its ``send`` returns
before the ack, so back-to-back sends overlap).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import statistics
import struct
import subprocess
import sys
import time
from typing import Any

import numpy as np
from _common import run_async as run_loop

_ACK = b"A"


def _usage() -> dict[str, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    out = {"user": r.ru_utime, "sys": r.ru_stime, "minflt": float(r.ru_minflt), "vcsw": float(r.ru_nvcsw)}
    try:  # Linux: read/write-family syscalls and their bytes, this process (all threads)
        with open("/proc/self/io") as f:
            io = dict(line.split(": ") for line in f.read().splitlines())
        out.update({k: float(io[k]) for k in ("syscr", "syscw", "rchar", "wchar")})
    except (OSError, KeyError, ValueError):
        out.update(dict.fromkeys(("syscr", "syscw", "rchar", "wchar"), math.nan))
    return out


def _delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a[k] for k in a}


# ----------------------------------------------------------------------------- raw
class _Sink(asyncio.BufferedProtocol):
    """``<u64 len><body>`` messages into one reused buffer; one ack byte after the warm-up and at the end."""

    def __init__(self, size: int, warm: int, count: int, done: asyncio.Future[dict[str, float]]) -> None:
        self.buf = bytearray(size + 8)
        self.mv = memoryview(self.buf)
        self.size = size
        self.left = size + 8  # bytes of the current message still to come
        self.msgs = 0
        self.warm, self.count = warm, count
        self.done = done
        self.u0: dict[str, float] = {}

    def connection_made(self, transport: Any) -> None:
        self.tr = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.mv[len(self.buf) - self.left :]

    def buffer_updated(self, nbytes: int) -> None:
        self.left -= nbytes
        if self.left:
            return
        self.left = self.size + 8
        self.msgs += 1
        if self.msgs == self.warm:
            self.u0 = _usage()
            self.tr.write(_ACK)
        elif self.msgs == self.warm + self.count:
            self.tr.write(_ACK)
            self.done.set_result(_delta(self.u0, _usage()))


async def raw_child(size: int, warm: int, count: int) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[dict[str, float]] = loop.create_future()
    srv = await loop.create_server(lambda: _Sink(size, warm, count, done), "127.0.0.1", 0)
    print(json.dumps({"port": srv.sockets[0].getsockname()[1]}), flush=True)
    print(json.dumps(await done), flush=True)
    await asyncio.sleep(0.2)


class _Source(asyncio.Protocol):
    def __init__(self) -> None:
        self.acks: asyncio.Queue[None] = asyncio.Queue()
        self.resume: asyncio.Future[None] | None = None

    def data_received(self, data: bytes) -> None:
        for _ in data:
            self.acks.put_nowait(None)

    def pause_writing(self) -> None:
        self.resume = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.resume is not None:
            self.resume.set_result(None)
            self.resume = None


async def raw_parent(info: dict[str, Any], arr: Any, warm: int, count: int) -> tuple[float, dict[str, float]]:
    loop = asyncio.get_running_loop()
    tr, proto = await loop.create_connection(_Source, "127.0.0.1", info["port"])
    body = memoryview(arr).cast("B")
    hdr = struct.pack("<Q", body.nbytes)

    async def burst(n: int) -> None:
        for _ in range(n):
            tr.writelines((hdr, body))
            if proto.resume is not None:
                await proto.resume
        await proto.acks.get()

    await burst(warm)
    u0 = _usage()
    t0 = time.perf_counter()
    await burst(count)
    dt = time.perf_counter() - t0
    u = _delta(u0, _usage())
    tr.close()
    return dt, u


# ----------------------------------------------------------------------------- aionet
async def aionet_child(size: int, warm: int, count: int) -> None:
    import aionet
    from aionet.codecs import framing

    fresh = [0.0]  # large-frame buffers the receiver allocated (not recycled)
    alloc = framing.default_alloc

    def counting_alloc(n: int) -> Any:
        fresh[0] += 1
        return alloc(n)

    framing.default_alloc = counting_alloc

    async with aionet.Node(name="rx", listen="tcp://127.0.0.1:0") as rx:
        got = [0]
        u0: dict[str, float] = {}
        marks: dict[int, asyncio.Future[None]] = {}

        @rx.service("bench.wait")
        async def wait(n: int) -> dict[str, float]:
            if got[0] < n:
                marks[n] = asyncio.get_running_loop().create_future()
                await marks[n]
            # (nan on a tree without LinkStats.acks_sent)
            acks = float(sum(getattr(p.link, "acks_sent", math.nan) for p in rx.stats().peers.values() if p.link))
            if n == warm:
                u0.update(_usage(), fresh=fresh[0], acks=acks)
                return {}
            return _delta(u0, {**_usage(), "fresh": fresh[0], "acks": acks})

        hold = os.environ.get("BIGMSG_HOLD_PREVIOUS") == "1"

        async def consume() -> None:
            msgs: list[Any] = []
            while True:
                if hold:  # as p2p.py's consumer: the previous batch lives until the next arrives
                    msgs = await rx.recv_batch("tp")
                    got[0] += len(msgs)
                else:
                    got[0] += len(await rx.recv_batch("tp"))  # each array dropped at once
                for n, f in list(marks.items()):
                    if got[0] >= n and not f.done():
                        f.set_result(None)

        task = asyncio.get_running_loop().create_task(consume())
        print(json.dumps({"url": rx.address}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        task.cancel()


async def aionet_parent(info: dict[str, Any], arr: Any, warm: int, count: int) -> tuple[float, dict[str, float], Any]:
    import aionet

    async with aionet.Node(name="tx", listen="tcp://127.0.0.1:0", join=[info["url"]]) as tx:
        await tx.request("rx", "bench.wait", 0, timeout=30)
        for _ in range(warm):
            await tx.send("rx", "tp", arr)
        await tx.request("rx", "bench.wait", warm, timeout=60)
        u0 = _usage()
        t0 = time.perf_counter()
        for _ in range(count):
            await tx.send("rx", "tp", arr)
        rx_usage = await tx.request("rx", "bench.wait", warm + count, timeout=120)
        dt = time.perf_counter() - t0
        return dt, _delta(u0, _usage()), rx_usage


# ----------------------------------------------------------------------------- driver
def _size(s: str) -> int:
    units = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)


def one_round(impl: str, size: int, warm: int, count: int, readonly: bool = False) -> dict[str, float]:
    prefix = os.environ.get("BIGMSG_CHILD_PREFIX", "").split()  # e.g. "perf record -o rx.data --"
    child = subprocess.Popen(
        [
            *prefix,
            sys.executable,
            __file__,
            "--_child",
            impl,
            "--size",
            str(size),
            "--warm",
            str(warm),
            "--count",
            str(count),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        info = json.loads(child.stdout.readline())
        arr = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
        arr.flags.writeable = not readonly
        if impl == "raw":
            dt, tx = run_loop(raw_parent(info, arr, warm, count))
            rx = json.loads(child.stdout.readline())
        else:
            dt, tx, rx = run_loop(aionet_parent(info, arr, warm, count))
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    gb = size * count / 1e9
    return {
        "gbps": gb / dt,
        "tx_user_s_per_gb": tx["user"] / gb,
        "tx_sys_s_per_gb": tx["sys"] / gb,
        "rx_user_s_per_gb": rx["user"] / gb,
        "rx_sys_s_per_gb": rx["sys"] / gb,
        "tx_minflt_per_msg": tx["minflt"] / count,
        "rx_minflt_per_msg": rx["minflt"] / count,
        "rx_fresh_frames_per_msg": rx.get("fresh", 0.0) / count,
        "rx_acks_per_msg": rx.get("acks", 0.0) / count,  # standalone ACKs the receiver wrote
        # voluntary context switches: how often a side slept waiting for the other
        "tx_sleeps_per_msg": tx["vcsw"] / count,
        "rx_sleeps_per_msg": rx["vcsw"] / count,
        # read- and write-family syscalls per message (/proc/self/io; nan elsewhere), and the
        # mean bytes the receiver's reads returned
        "tx_writes_per_msg": tx["syscw"] / count,
        "tx_reads_per_msg": tx["syscr"] / count,
        "rx_reads_per_msg": rx["syscr"] / count,
        "rx_writes_per_msg": rx["syscw"] / count,
        "rx_bytes_per_read": rx["rchar"] / rx["syscr"] if rx["syscr"] else math.nan,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1MiB")
    ap.add_argument("--count", type=int, default=256)
    ap.add_argument("--warm", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--impls", default="raw,aionet")
    ap.add_argument("--readonly", action="store_true", help="send a read-only array (returns before its ack)")
    ap.add_argument("--_child")
    a = ap.parse_args()
    size = _size(str(a.size))
    if a._child:
        run_loop((raw_child if a._child == "raw" else aionet_child)(size, a.warm, a.count))
        return
    impls = a.impls.split(",")
    res: dict[str, list[dict[str, float]]] = {i: [] for i in impls}
    ratios = []
    for _ in range(a.rounds):
        row = {i: one_round(i, size, a.warm, a.count, a.readonly) for i in impls}
        for i in impls:
            res[i].append(row[i])
        if "raw" in row and "aionet" in row:
            ratios.append(row["aionet"]["gbps"] / row["raw"]["gbps"])
    for i in impls:
        keys = res[i][0].keys()
        med = {k: statistics.median(r[k] for r in res[i]) for k in keys}
        print(i, " ".join(f"{k}={v:.3g}" for k, v in med.items()), "| gbps:", [round(r["gbps"], 2) for r in res[i]])
    if ratios:
        print("aionet/raw per round:", [round(r, 2) for r in ratios], "median", round(statistics.median(ratios), 2))


if __name__ == "__main__":
    main()
