"""GPU staging pipeline vs a direct send, over tcp:// between two processes.

    python benchmarks/staging.py [--size 1GiB] [--chunk 1MiB] [--depth 2] [--repeats 5]
                                 [--paths direct,staged,...] [--json PATH]

Paths (all in the same run, their order alternating between repeats):

* ``direct``: the sender sends the numpy array as one out-of-band frame; the receiver takes it
  as a numpy array on the received buffer (freshly allocated by the transport).
* ``staged`` (**the bar row**): the array goes through :class:`aionet.devices.Stager` with the
  simulated-device backend on *both* ends: every chunk is copied (a real memcpy standing in for
  ``cudaMemcpyAsync`` device->host) into a pool buffer before it is sent, and the receiver
  copies every chunk from the buffer it arrived in into the destination "device" array
  (host->device stand-in). Nothing is skipped; the copies overlap the sends in flight.
* ``direct-warm`` (reference): ``direct`` with the receiver's buffer reused between runs, i.e.
  without the first-touch page faults of a fresh 1 GiB buffer.
* ``chunked`` (reference): the same chunking with no staging copy at all.
* ``staged-pool``: ``staged`` with the chunks received straight into pool buffers.
* ``staged-host``: the same sender; the receiver has no GPU (:class:`~aionet.devices.HostTarget`,
  delivers numpy) and receives the chunks straight into the final array: no copy there.

The last two (and ``direct-warm``) need a transport hook for choosing where a large frame
lands (``TCPConnection.set_frame_allocator``).

Time is measured by the sender from the first byte to the receiver's ack (sent once the array
is complete in its final memory). CPU time (user+sys, all threads) and minor page faults are
measured per process over the same window: on a shared 2-core machine the CPU per GiB is the
steadier number. The report gives medians, spread and the ratio path/direct throughput per
repeat (the bar: median ratio of ``staged`` >= 0.8), and the ratio against ``direct-warm``.

This measures the pipeline's overlap on the CPU; it says nothing about PCIe bandwidth.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common

from aionet.config import LimitsSection, parse_size
from aionet.devices import DEFAULT_DEPTH, BufferPool, HostTarget, SimulatedDeviceBackend, Stager
from aionet.transports.tcp import TCPTransport

PATHS = ("direct", "staged", "direct-warm", "chunked", "staged-pool", "staged-host")


def make_stager(chunk: int, depth: int, backend: Any = None) -> Stager:
    """The pool a node would configure: room for every chunk in flight plus one."""
    pool = BufferPool(size_classes=(chunk,), max_bytes=(2 * depth + 1) * chunk)
    return Stager(backend=backend or SimulatedDeviceBackend(), pool=pool, chunk_bytes=chunk, depth=depth)


def limits() -> LimitsSection:
    return LimitsSection(max_message_bytes=1 << 40, max_frame_bytes=1 << 40)


def usage() -> tuple[float, int]:
    """(CPU seconds user+sys of all threads, minor page faults) of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def frame_allocator(conn: Any) -> Callable[[Callable[[int], Any] | None], None] | None:
    """The connection's hook for choosing where large frames land (tcp:// has one)."""
    return getattr(conn, "set_frame_allocator", None)


# ----------------------------------------------------------------------------- receiver child
async def receiver_main() -> None:
    transport = TCPTransport({}, limits())
    done = asyncio.Event()

    async def handle(conn: Any) -> None:
        stagers: dict[str, Stager] = {}
        warm: dict[int, np.ndarray] = {}

        def stager(kind: str, meta: dict[str, Any]) -> Stager:
            if kind not in stagers:
                backend = HostTarget() if kind == "staged-host" else SimulatedDeviceBackend()
                stagers[kind] = make_stager(int(meta["chunk"]), int(meta["depth"]), backend)
            return stagers[kind]

        try:
            while True:
                msg = await conn.recv()
                kind = bytes(msg[0]).decode()
                if kind == "arm":  # direct-warm: the next large frame lands in a reused buffer
                    set_alloc = frame_allocator(conn)
                    assert set_alloc is not None
                    size = int(bytes(msg[1]))
                    if warm.get(size) is None:
                        warm[size] = np.empty(size, dtype=np.uint8)

                    def once(n: int, size: int = size, set_alloc: Any = set_alloc) -> Any:
                        if n != size:
                            return None
                        set_alloc(None)
                        return warm[size]

                    set_alloc(once)
                elif kind in ("direct", "direct-warm"):
                    arr = np.frombuffer(msg[1], dtype=np.uint8)
                    assert arr.nbytes == int(bytes(msg[2]))
                    del arr, msg
                elif kind in ("staged", "staged-pool", "staged-host"):
                    meta = json.loads(bytes(msg[1]))
                    hook = frame_allocator(conn) if kind in ("staged-pool", "staged-host") else None
                    out = await stager(kind, meta).recv_array(meta, conn.recv, set_frame_allocator=hook)
                    assert out.nbytes == meta["nbytes"]
                    del out
                elif kind == "usage":
                    pass
                elif kind == "chunked":
                    for _ in range(int(bytes(msg[1]))):
                        await conn.recv()
                elif kind == "bye":
                    break
                # cumulative: the sender subtracts the previous ack's numbers, so the window
                # covers everything since then, including receiving the first bytes
                cpu, flt = usage()
                await conn.send([b"ack", json.dumps({"cpu": cpu, "minflt": flt}).encode()])
        finally:
            for st in stagers.values():
                st.close()
            await conn.close()
            done.set()

    listener = await transport.listen("tcp://127.0.0.1:0", handle)
    print("READY " + json.dumps({"address": listener.address}), flush=True)
    await done.wait()
    await listener.close()
    await transport.aclose()


# ----------------------------------------------------------------------------- sender (parent)
async def sender_main(address: str, size: int, chunk: int, depth: int, repeats: int, paths: list[str]) -> list[Any]:
    transport = TCPTransport({}, limits())
    conn = await transport.connect(address, timeout=10)
    stager = make_stager(chunk, depth)
    a = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    results: list[dict[str, Any]] = []

    async def staged(kind: str) -> None:
        meta = stager.header(a)
        await conn.send([kind.encode(), json.dumps({**meta, "depth": depth}).encode()])
        await stager.send_array(a, conn.send)

    async def chunked() -> None:
        n = -(-size // chunk)
        await conn.send([b"chunked", str(n).encode()])
        mv = memoryview(a)
        for i in range(n):
            await conn.send([mv[i * chunk : (i + 1) * chunk]])

    async def direct() -> None:
        await conn.send([b"direct", memoryview(a), str(size).encode()])

    async def direct_warm() -> None:
        await conn.send([b"direct-warm", memoryview(a), str(size).encode()])

    send: dict[str, Callable[[], Awaitable[None]]] = {
        "direct": direct,
        "direct-warm": direct_warm,
        "staged": lambda: staged("staged"),
        "chunked": chunked,
        "staged-pool": lambda: staged("staged-pool"),
        "staged-host": lambda: staged("staged-host"),
    }

    async def ack() -> dict[str, Any]:
        msg = await conn.recv()
        assert bytes(msg[0]) == b"ack"
        return json.loads(bytes(msg[1]))

    await conn.send([b"usage"])
    rx0 = await ack()

    async def measure(path: str) -> dict[str, float]:
        nonlocal rx0
        if path == "direct-warm":  # untimed round trip: the receiver arms its buffer
            await conn.send([b"arm", str(size).encode()])
            rx0 = await ack()
        cpu0, flt0 = usage()
        t0 = time.perf_counter()
        await send[path]()
        rx = await ack()
        t = time.perf_counter() - t0
        cpu1, flt1 = usage()
        out = {
            "seconds": t,
            "sender_cpu": cpu1 - cpu0,
            "receiver_cpu": rx["cpu"] - rx0["cpu"],
            "sender_minflt": flt1 - flt0,
            "receiver_minflt": rx["minflt"] - rx0["minflt"],
        }
        rx0 = rx
        return out

    for p in paths:  # warm-up: pools, caches, TCP window growth
        await measure(p)
    for i in range(repeats):
        order = paths if i % 2 == 0 else paths[::-1]
        run = {p: await measure(p) for p in order}
        results.append(run)
        print(
            f"  run {i + 1}: "
            + ", ".join(
                f"{p} {size / run[p]['seconds'] / 2**30:.2f} GiB/s "
                f"({(run[p]['sender_cpu'] + run[p]['receiver_cpu']) / (size / 2**30):.2f} CPU-s/GiB)"
                for p in paths
            )
            + (f", ratio {run['direct']['seconds'] / run['staged']['seconds']:.3f}" if "staged" in run else ""),
            flush=True,
        )
    await conn.send([b"bye"])
    await conn.close()
    await transport.aclose()
    stager.close()
    return results


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--chunk", default=None, help="default: the Stager's DEFAULT_CHUNK_BYTES")
    ap.add_argument("--depth", type=int, default=DEFAULT_DEPTH, help="copies (and sends) in flight")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--json", default=str(_common.RESULTS_DIR / "staging.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from aionet.log import configure

    configure(level="warning", stream=sys.stderr)  # stdout carries the READY line
    if args.child:
        _common.run_async(receiver_main())
        return
    from aionet.devices import DEFAULT_CHUNK_BYTES

    size = parse_size(args.size)
    chunk = parse_size(args.chunk) if args.chunk else DEFAULT_CHUNK_BYTES
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if "direct" not in paths or any(p not in PATHS for p in paths):
        raise SystemExit(f"--paths must include direct and only name {', '.join(PATHS)}")
    child = subprocess.Popen(
        [sys.executable, __file__, "--child"], stdout=subprocess.PIPE, text=True, cwd=_common.REPO_DIR
    )
    try:
        line = child.stdout.readline() if child.stdout else ""
        if not line.startswith("READY "):
            raise SystemExit(f"receiver did not start: {line!r}")
        address = json.loads(line[6:])["address"]
        print(
            f"staging benchmark: {_common.fmt_bytes(size)} array, {_common.fmt_bytes(chunk)} chunks, "
            f"depth {args.depth}, {args.repeats} runs, tcp loopback, {_common.loop_name()}"
        )
        runs = _common.run_async(sender_main(address, size, chunk, args.depth, args.repeats, paths))
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    gib = size / 2**30
    report: dict[str, Any] = {}
    rows = []
    for p in paths:
        rates = [gib / r[p]["seconds"] for r in runs]
        ratios = [r["direct"]["seconds"] / r[p]["seconds"] for r in runs]
        s_cpu = [r[p]["sender_cpu"] / gib for r in runs]
        r_cpu = [r[p]["receiver_cpu"] / gib for r in runs]
        tot = [a + b for a, b in zip(s_cpu, r_cpu, strict=True)]
        faults = [r[p]["receiver_minflt"] / gib for r in runs]
        report[p] = {
            "gibps": summary(rates),
            "ratio_vs_direct": {**summary(ratios), "values": ratios},
            "sender_cpu_s_per_gib": summary(s_cpu),
            "receiver_cpu_s_per_gib": summary(r_cpu),
            "total_cpu_s_per_gib": summary(tot),
            "receiver_minor_faults_per_gib": summary(faults),
        }

        def fmt(v: list[float]) -> str:
            return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"

        if "direct-warm" in paths:
            warm = [r["direct-warm"]["seconds"] / r[p]["seconds"] for r in runs]
            report[p]["ratio_vs_direct_warm"] = {**summary(warm), "values": warm}
        rows.append(
            [p, fmt(rates), "-" if p == "direct" else fmt(ratios)]
            + (["-" if p == "direct-warm" else fmt(warm)] if "direct-warm" in paths else [])
            + [fmt(s_cpu), fmt(r_cpu), fmt(tot), f"{statistics.median(faults):.0f}"]
        )
    _common.print_table(
        "median (min-max) over the repeats",
        ["path", "GiB/s", "ratio vs direct"]
        + (["ratio vs direct-warm"] if "direct-warm" in paths else [])
        + ["sender CPU-s/GiB", "receiver CPU-s/GiB", "total CPU-s/GiB", "receiver faults/GiB"],
        rows,
        footer="bar: staged ratio median >= 0.8",
        plain=True,
    )
    out = _common.write_json(
        args.json,
        {
            "benchmark": "staging",
            "size": size,
            "chunk": chunk,
            "depth": args.depth,
            "paths": paths,
            "runs": runs,
            "results": report,
            "environment": _common.environment(),
        },
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
