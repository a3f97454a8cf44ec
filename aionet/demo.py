"""``aionet demo``: three node processes on free loopback ports exchanging messages and a
large numpy array, with a short readable summary. Also the ``--app aionet.demo:setup``
services those processes run."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import statistics
import sys
import time
from typing import Any

import numpy as np

from .config import Config
from .node import Node


# ---------------------------------------------------------------- services run by the nodes
def setup(node: Node) -> None:
    """Register the demo services on a node (``aionet serve --app aionet.demo:setup``)."""

    @node.service("demo.sink")
    def sink(arr: Any) -> dict[str, Any]:
        flat = np.asarray(arr).reshape(-1)
        return {"nbytes": int(flat.nbytes), "checksum": _checksum(flat)}

    @node.service("demo.ship")
    async def ship(spec: dict[str, Any]) -> dict[str, Any]:
        n = int(spec["size_mb"]) * 2**20 // 8
        arr = np.arange(n, dtype=np.float64)
        t0 = time.perf_counter()
        got = await node.request(spec["to"], "demo.sink", arr, timeout=60)
        dt = time.perf_counter() - t0
        return {"seconds": dt, "nbytes": arr.nbytes, "ok": got["checksum"] == _checksum(arr)}

    @node.service("demo.count")
    async def count(n: int) -> dict[str, Any]:
        got = 0
        t0 = None
        while got < n:
            batch = await node.recv_batch("demo.msgs")
            if t0 is None:
                t0 = time.perf_counter()
            got += len(batch)
        return {"count": got, "seconds": time.perf_counter() - (t0 or time.perf_counter())}


def _checksum(flat: np.ndarray) -> float:
    if flat.size == 0:
        return 0.0
    idx = np.linspace(0, flat.size - 1, num=min(flat.size, 1024)).astype(np.int64)
    return float(flat[idx].astype(np.float64).sum()) + float(flat.size)


# ---------------------------------------------------------------- the demo driver
async def _start(name: str, listen: str, join: str | None, token: str) -> tuple[asyncio.subprocess.Process, str]:
    args = [
        sys.executable,
        "-m",
        "aionet",
        "serve",
        "--name",
        name,
        "--listen",
        listen,
        "--app",
        "aionet.demo:setup",
        "--log-level",
        "warning",
    ]
    if join:
        args += ["--join", join]
    env = {**os.environ, "AIONET_SECURITY_TOKEN": token}  # a fresh cluster secret for this demo
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE, env=env)
    assert proc.stdout is not None
    try:
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            if not line:
                raise RuntimeError(f"node {name} exited before it was ready (code {await proc.wait()})")
            if line.startswith(b"ready "):
                return proc, json.loads(line[6:])["addresses"][0]
    except BaseException:
        _kill(proc)
        raise


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


async def _demo(size_mb: int, scheme: str) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    listen = f"{scheme}://127.0.0.1:0"
    procs: list[asyncio.subprocess.Process] = []
    try:
        t0 = time.perf_counter()
        token = secrets.token_hex(16)
        pa, addr_a = await _start("demo-a", listen, None, token)
        procs.append(pa)
        (pb, _), (pc, _) = await asyncio.gather(
            _start("demo-b", listen, addr_a, token), _start("demo-c", listen, addr_a, token)
        )
        procs += [pb, pc]
        startup = time.perf_counter() - t0
        cfg = Config.from_dict({"security": {"token": token}})
        async with Node(name=f"demo-client-{os.getpid()}", listen=listen, join=[addr_a], config=cfg) as me:
            names = ["demo-a", "demo-b", "demo-c"]
            infos = [await me.request(n, "aionet.info", timeout=10) for n in names]

            # request/reply latency, 64-byte payload
            payload = b"x" * 64
            for _ in range(200):
                await me.request("demo-a", "aionet.echo", payload, timeout=5)
            lat = []
            for _ in range(2000):
                s = time.perf_counter()
                await me.request("demo-a", "aionet.echo", payload, timeout=5)
                lat.append(time.perf_counter() - s)
            lat.sort()

            # one-way small messages into a mailbox on demo-b
            n_msgs = 50_000
            counter = asyncio.ensure_future(me.request("demo-b", "demo.count", n_msgs, timeout=60))
            t_send = time.perf_counter()
            for i in range(n_msgs):
                await me.send("demo-b", "demo.msgs", i)
            counted = await counter
            counted["seconds"] = time.perf_counter() - t_send  # first send to last one counted

            # a large numpy array from demo-b to demo-c (the client only asks)
            shipped = await me.request("demo-b", "demo.ship", {"to": "demo-c", "size_mb": size_mb}, timeout=120)
            # and one from this client to demo-a, checked end to end
            arr = np.random.default_rng(1).standard_normal(2**20)
            sunk = await me.request("demo-a", "demo.sink", arr, timeout=30)
            direct_ok = sunk["checksum"] == _checksum(arr)
            members = me.members()

        table = Table(title=f"aionet demo over {scheme}://")
        table.add_column("what")
        table.add_column("result", justify="right")
        table.add_row("nodes started", f"3 processes in {startup:.2f} s")
        for inf in infos:
            table.add_row(f"  {inf['name']}", f"pid {inf['pid']}  {inf['listen'][0]}")
        table.add_row("request/reply 64 B p50", f"{statistics.median(lat) * 1e6:.0f} us")
        table.add_row("request/reply 64 B p99", f"{lat[int(len(lat) * 0.99)] * 1e6:.0f} us")
        rate = counted["count"] / max(counted["seconds"], 1e-9)
        table.add_row("one-way small messages", f"{counted['count']} at {rate:,.0f} msg/s")
        gbps = shipped["nbytes"] / shipped["seconds"] / 1e9
        table.add_row(
            f"{size_mb} MiB array demo-b -> demo-c",
            f"{shipped['seconds'] * 1e3:.1f} ms, {gbps:.2f} GB/s, intact={shipped['ok']}",
        )
        table.add_row("8 MiB array client -> demo-a", f"intact={direct_ok}")
        table.add_row("members seen by the client", ", ".join(sorted(members)))
        console.print(table)
        ok = shipped["ok"] and direct_ok and counted["count"] == n_msgs
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        codes = []
        for p in procs:
            try:
                codes.append(await asyncio.wait_for(p.wait(), 15))
            except TimeoutError:
                _kill(p)
                codes.append(await p.wait())
    clean = all(c == 0 for c in codes)
    console.print(f"nodes shut down cleanly: {clean} (exit codes {codes})")
    return 0 if ok and clean else 1


def run_demo(size_mb: int = 64, scheme: str = "tcp") -> int:
    from .runner import run

    return run(_demo(size_mb, scheme))
