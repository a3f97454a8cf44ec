#!/usr/bin/env python
"""Cache benchmark: aionet's ``node.cache`` vs redis-py's asyncio client on a local
redis-server, in the same run, same host.

The server side is a child process in both cases: ``redis-server`` (no persistence) on a free
port, and an aionet node (``cache.replicas = 1``) started by this script with ``--serve``. The
client is this process: a redis.asyncio client, and an aionet node joined to the server node.
Keys are chosen so that the server node is their only replica (every get and put is remote);
"local get" reads keys this node holds. Measured, ``--repeat`` times (median and spread),
each aionet measurement followed at once by the same one against redis (interleaved):

1. put/SET and get/GET of small values (16 bytes), one at a time (unpipelined);
2. the same with 16 concurrent callers;
3. local-replica get (aionet only; the ratio is against redis GET, one at a time);
4. a 64 MiB float64 array: get on the node holding it (same memory, no copy: checked),
   and from the other node vs the raw transfer of the same bytes: a uvloop socket in the
   server process answers a 1-byte request with the 64 MiB (length-prefixed, written
   zero-copy) and this process reads it into a preallocated, reused buffer (the raw side's
   best case); an aionet request whose reply is the same array is shown too.

    python benchmarks/cache.py            # full run (about a minute)
    python benchmarks/cache.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

HOST = "127.0.0.1"
BIG = 64 * C.MiB


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ server child
async def serve() -> None:
    import numpy as np

    import aionet
    from aionet.config import Config

    cfg = Config.from_dict({"cache": {"replicas": 1, "max_bytes": "1GiB"}}, env={})
    node = aionet.Node(name="server", listen=f"tcp://{HOST}:0", config=cfg)
    await node.start()
    big = np.ones(BIG // 8)
    big.flags.writeable = False  # as the cache's own values: a writable reply would be copied (README)
    node.add_service("bench.big", lambda _x: big)
    raw = await asyncio.get_running_loop().create_server(lambda: _RawBigServer(big), HOST, 0)
    C.emit("READY", {"address": node.address, "raw_port": raw.sockets[0].getsockname()[1]})
    C.parent_watchdog(__import__("os").getppid())
    await asyncio.Event().wait()


class _RawBigServer(asyncio.Protocol):
    """Raw baseline: every byte received asks for the array once more (8-byte length, then the
    array's memory handed to the transport without a copy)."""

    def __init__(self, big: Any) -> None:
        self.view = memoryview(big).cast("B")

    def connection_made(self, transport: Any) -> None:
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.tr = transport

    def data_received(self, data: bytes) -> None:
        for _ in range(len(data)):
            self.tr.writelines([len(self.view).to_bytes(8, "little"), self.view])


class _RawBigClient(asyncio.BufferedProtocol):
    """Reads one length-prefixed reply into a preallocated buffer, reused for every request."""

    def __init__(self, size: int) -> None:
        self.buf = memoryview(bytearray(8 + size))
        self.got = 0
        self.done: asyncio.Future[None] | None = None

    def connection_made(self, transport: Any) -> None:
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.tr = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buf[self.got :]

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes
        if self.got == len(self.buf):
            self.tr.pause_reading()  # full: nothing more is due until the next request
            if self.done is not None and not self.done.done():
                self.done.set_result(None)

    async def fetch(self) -> None:
        self.got = 0
        self.done = asyncio.get_running_loop().create_future()
        self.tr.resume_reading()
        self.tr.write(b"?")
        await self.done


# ------------------------------------------------------------------ measuring
async def rate(op: Any, n: int, concurrency: int) -> float:
    """ops/s of ``op(i)`` for i in range(n), ``concurrency`` callers."""
    it = iter(range(n))

    async def worker() -> None:
        for i in it:
            await op(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return n / (time.perf_counter() - t0)


@contextlib.asynccontextmanager
async def redis_client(enabled: bool) -> AsyncIterator[Any]:
    """A redis.asyncio client on a fresh local redis-server (no persistence); None when not
    ``enabled`` (redis-server or redis-py missing)."""
    if not enabled:
        yield None
        return
    import redis.asyncio as redis

    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        r = redis.Redis(host=HOST, port=port)
        for _ in range(200):
            with contextlib.suppress(Exception):
                await r.ping()
                break
            await asyncio.sleep(0.025)
        try:
            yield r
        finally:
            await r.aclose()
    finally:
        proc.terminate()
        proc.wait(timeout=5)


async def bench(
    n: int, repeat: int, with_redis: bool, big_repeat: int
) -> tuple[dict[str, Any], dict[str, list[float]] | None]:
    """Both systems, interleaved: each measurement of aionet is followed by the same one of
    redis, so a change in the machine's load moves both sides of a ratio alike."""
    import numpy as np

    with C.Child(C.python_argv(__file__, "--serve"), label="server") as child:
        async with redis_client(with_redis) as r:
            return await _bench(n, repeat, child, r, np, big_repeat)


async def _bench(
    n: int, repeat: int, child: Any, r: Any, np: Any, big_repeat: int
) -> tuple[dict[str, Any], dict[str, list[float]] | None]:
    import aionet
    from aionet.config import Config

    ready = child.expect("READY", timeout=30)
    addr = ready["address"]
    cfg = Config.from_dict({"cache": {"replicas": 1, "max_bytes": "1GiB"}}, env={})
    node = aionet.Node(name="client", listen=f"tcp://{HOST}:0", join=[addr], config=cfg)
    await node.start()
    try:
        cache = node.cache
        t0 = time.monotonic()
        while len(cache.service.placement.members) < 2 and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.01)
        keys = [k for k in (f"k{i}" for i in range(4000)) if cache.owners(k) == ("server",)][:1000]
        mine = [k for k in (f"m{i}" for i in range(4000)) if cache.owners(k) == ("client",)][:1000]
        await asyncio.sleep(cache.cfg.settle)  # past the settle window after joining (no replica asks)
        value = b"x" * 16
        for k in mine:
            await cache.put(k, value)
        out: dict[str, Any] = {"put": [], "get": [], "put16": [], "get16": [], "local_get": []}
        rout: dict[str, list[float]] | None = None if r is None else {k: [] for k in ("put", "get", "put16", "get16")}
        plan = [
            ("put", 1, lambda i: cache.put(keys[i % len(keys)], value), lambda i: r.set(f"k{i % 1000}", value)),
            ("get", 1, lambda i: cache.get(keys[i % len(keys)]), lambda i: r.get(f"k{i % 1000}")),
            ("put16", 16, lambda i: cache.put(keys[i % len(keys)], value), lambda i: r.set(f"k{i % 1000}", value)),
            ("get16", 16, lambda i: cache.get(keys[i % len(keys)]), lambda i: r.get(f"k{i % 1000}")),
        ]
        for _ in range(repeat):
            for key, conc, aop, rop in plan:
                out[key].append(await rate(aop, n, conc))
                if rout is not None:
                    rout[key].append(await rate(rop, n, conc))
            out["local_get"].append(await rate(lambda i: cache.get(mine[i % len(mine)]), n * 5, 1))
        # 64 MiB array: local (same memory) and remote vs the raw request of the same bytes
        arr = np.ones(BIG // 8)
        big_local = next(k for k in (f"b{i}" for i in range(100)) if cache.owners(k) == ("client",))
        big_remote = next(k for k in (f"b{i}" for i in range(100)) if cache.owners(k) == ("server",))
        await cache.put(big_local, arr)
        await cache.put(big_remote, arr)
        x, y = await cache.get(big_local), await cache.get(big_local)
        out["big_same_memory"] = bool(np.shares_memory(x, y) and not x.flags.writeable)
        t = time.perf_counter()
        await cache.get(big_local)
        out["big_local_s"] = time.perf_counter() - t
        out["big_remote"], out["big_request"], out["big_raw"] = [], [], []
        _tr, raw = await asyncio.get_running_loop().create_connection(
            lambda: _RawBigClient(BIG), HOST, ready["raw_port"]
        )
        try:
            # warm-up: the first large replies size buffers (both receive paths reuse theirs)
            for _ in range(2):
                await node.request("server", "bench.big", None)
                await cache.get(big_remote)
                await raw.fetch()
            for _ in range(big_repeat):  # interleaved, so load swings move all three alike
                t = time.perf_counter()
                await raw.fetch()
                out["big_raw"].append(BIG / (time.perf_counter() - t))
                t = time.perf_counter()
                got = await cache.get(big_remote)
                out["big_remote"].append(BIG / (time.perf_counter() - t))
                assert got.nbytes == BIG
                t = time.perf_counter()
                await node.request("server", "bench.big", None)
                out["big_request"].append(BIG / (time.perf_counter() - t))
        finally:
            _tr.close()
        return out, rout
    finally:
        await node.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("-n", type=int, default=5000, help="operations per measurement")
    ap.add_argument("--big-repeat", type=int, default=9, help="64 MiB transfers of each kind (interleaved)")
    ap.add_argument("--json", default=str(C.RESULTS_DIR / "cache.json"))
    args = ap.parse_args()
    if args.serve:
        C.run_async(serve())
        return
    C.install_cleanup()
    n, repeat = (1000, 2) if args.quick else (args.n, args.repeat)
    results: dict[str, Any] = {"environment": C.environment(), "n": n, "repeat": repeat}
    have_redis = shutil.which("redis-server") is not None
    try:
        import redis  # noqa: F401
    except ImportError:
        have_redis = False
    a, r = C.run_async(bench(n, repeat, have_redis, 3 if args.quick else args.big_repeat))
    results["aionet"] = a
    results["redis"] = r
    rows = []
    for key, label in [
        ("put", "put / SET, 1 caller"),
        ("get", "get / GET, 1 caller"),
        ("put16", "put / SET, 16 callers"),
        ("get16", "get / GET, 16 callers"),
    ]:
        am = C.median(a[key])
        rm = C.median(r[key]) if r else None
        # each aionet measurement over the redis one right after it: what load swings move least
        pairs = sorted(x / y for x, y in zip(a[key], r[key], strict=True)) if r else []
        spread = f"{pairs[0]:.2f}-{pairs[-1]:.2f}x" if pairs else "-"
        ratio = f"{am / rm:.2f}x" if rm else "-"
        rows.append([label, C.fmt_num(am, 0), C.fmt_num(rm, 0) if rm else "-", ratio, spread])
    lg = C.median(a["local_get"])
    rg = C.median(r["get"]) if r else None
    rows.append(
        [
            "local-replica get vs GET",
            C.fmt_num(lg, 0),
            C.fmt_num(rg, 0) if rg else "-",
            f"{lg / rg:.1f}x" if rg else "-",
            "-",
        ]
    )
    C.print_table(
        f"cache ops/s, small values (median of {repeat}, {n} ops each; remote = server process)",
        ["operation", "aionet", "redis-py", "ratio of medians", "pairwise ratios (min-max)"],
        rows,
    )
    br, bq, bw = C.median(a["big_remote"]), C.median(a["big_request"]), C.median(a["big_raw"])
    pairs = sorted(x / y for x, y in zip(a["big_remote"], a["big_raw"], strict=True))
    C.print_table(
        f"64 MiB array (median of {len(a['big_raw'])}, interleaved)",
        ["measure", "value"],
        [
            ["get on the holding node: same memory, read-only", str(a["big_same_memory"])],
            ["get on the holding node (s)", f"{a['big_local_s'] * 1e6:.1f} us"],
            ["remote get throughput", C.fmt_bytes(br) + "/s"],
            ["raw socket: 1-byte request, 64 MiB reply", C.fmt_bytes(bw) + "/s"],
            ["aionet request, the same array as reply", C.fmt_bytes(bq) + "/s"],
            ["remote get / raw (bar >= 0.85x)", f"{br / bw:.2f}x (pairwise {pairs[0]:.2f}-{pairs[-1]:.2f}x)"],
            ["remote get / aionet request", f"{br / bq:.2f}x"],
        ],
    )
    print("wrote", C.write_json(args.json, results))


if __name__ == "__main__":
    main()
