"""GPU staging pipeline vs a direct send, over tcp:// between two processes.

    python benchmarks/staging.py [--size 1GiB] [--chunk 4MiB] [--repeats 5] [--json PATH]

"direct": the sender sends the numpy array as one out-of-band frame; the receiver takes it
as a numpy array on the received buffer. "staged": the same array goes through
:class:`aionet.staging.Stager` with the simulated-device (numpy) backend: every chunk is
copied (a real memcpy, standing in for cudaMemcpyAsync device->host) into a pool buffer
while the previous chunk is on the wire, and the receiver copies every chunk into the
destination array (host->device stand-in) while the next one arrives. Time is measured by the
sender from the first byte to the receiver's ack (sent once the array is complete in its
final memory). Runs alternate direct/staged; the report gives medians, spread and the ratio
staged/direct throughput per pair (the bar: median ratio >= 0.8).

This measures the pipeline's overlap on the CPU; it says nothing about PCIe bandwidth.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common

from aionet.buffers import BufferPool
from aionet.config import LimitsSection, parse_size
from aionet.staging import SimulatedDeviceBackend, Stager
from aionet.transports.tcp import TCPTransport


def make_stager(chunk: int) -> Stager:
    pool = BufferPool(size_classes=(chunk,), max_bytes=5 * chunk)  # 2 copying + 2 sending + 1
    return Stager(backend=SimulatedDeviceBackend(), pool=pool, chunk_bytes=chunk, depth=2)


def limits() -> LimitsSection:
    return LimitsSection(max_message_bytes=1 << 40, max_frame_bytes=1 << 40)


# ----------------------------------------------------------------------------- receiver child
async def receiver_main() -> None:
    transport = TCPTransport({}, limits())
    done = asyncio.Event()

    async def handle(conn: Any) -> None:
        stager = None
        try:
            while True:
                msg = await conn.recv()
                kind = bytes(msg[0])
                if kind == b"direct":
                    arr = np.frombuffer(msg[1], dtype=np.uint8)
                    assert arr.nbytes == int(bytes(msg[2]))
                    del arr, msg
                    await conn.send([b"ack"])
                elif kind == b"staged":
                    meta = json.loads(bytes(msg[1]))
                    stager = stager or make_stager(int(meta["chunk"]))
                    out = await stager.recv_array(meta, conn.recv)
                    assert out.nbytes == meta["nbytes"]
                    del out
                    await conn.send([b"ack"])
                elif kind == b"chunked":
                    for _ in range(int(bytes(msg[1]))):
                        await conn.recv()
                    await conn.send([b"ack"])
                elif kind == b"bye":
                    break
        finally:
            if stager is not None:
                stager.close()
            await conn.close()
            done.set()

    listener = await transport.listen("tcp://127.0.0.1:0", handle)
    print("READY " + json.dumps({"address": listener.address}), flush=True)
    await done.wait()
    await listener.close()
    await transport.aclose()


# ----------------------------------------------------------------------------- sender (parent)
async def sender_main(address: str, size: int, chunk: int, repeats: int) -> list[dict[str, Any]]:
    transport = TCPTransport({}, limits())
    conn = await transport.connect(address, timeout=10)
    stager = make_stager(chunk)
    a = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    results: list[dict[str, Any]] = []

    async def direct() -> float:
        t0 = time.perf_counter()
        await conn.send([b"direct", memoryview(a), str(size).encode()])
        assert bytes((await conn.recv())[0]) == b"ack"
        return time.perf_counter() - t0

    async def staged() -> float:
        t0 = time.perf_counter()
        meta = stager.header(a)
        await conn.send([b"staged", json.dumps(meta).encode()])
        await stager.send_array(a, conn.send)
        assert bytes((await conn.recv())[0]) == b"ack"
        return time.perf_counter() - t0

    async def chunked() -> float:
        t0 = time.perf_counter()
        n = -(-size // chunk)
        await conn.send([b"chunked", str(n).encode()])
        mv = memoryview(a)
        for i in range(n):
            await conn.send([mv[i * chunk : (i + 1) * chunk]])
        assert bytes((await conn.recv())[0]) == b"ack"
        return time.perf_counter() - t0

    await direct()  # warm-up: first-touch page faults, TCP window growth
    await staged()
    for i in range(repeats):
        order = (direct, staged, chunked) if i % 2 == 0 else (chunked, staged, direct)
        times = {}
        for fn in order:
            times[fn.__name__] = await fn()
        results.append(times)
        print(
            f"  run {i + 1}: direct {size / times['direct'] / 2**30:.2f} GiB/s, "
            f"staged {size / times['staged'] / 2**30:.2f} GiB/s, "
            f"chunks without copies {size / times['chunked'] / 2**30:.2f} GiB/s, "
            f"ratio {times['direct'] / times['staged']:.3f}",
            flush=True,
        )
    await conn.send([b"bye"])
    await conn.close()
    await transport.aclose()
    stager.close()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--chunk", default="4MiB")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=str(_common.RESULTS_DIR / "staging.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from aionet.log import configure

    configure(level="warning", stream=sys.stderr)  # stdout carries the READY line
    if args.child:
        _common.run_async(receiver_main())
        return
    size, chunk = parse_size(args.size), parse_size(args.chunk)
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
            f"{args.repeats} runs, tcp loopback"
        )
        runs = _common.run_async(sender_main(address, size, chunk, args.repeats))
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    gib = size / 2**30
    direct = [gib / r["direct"] for r in runs]
    staged = [gib / r["staged"] for r in runs]
    ratios = [r["direct"] / r["staged"] for r in runs]

    def spread(v: list[float]) -> str:
        return f"{min(v):.3f}..{max(v):.3f}"

    print(f"{'path':<8} {'median GiB/s':>13} {'min..max':>14}")
    print(f"{'direct':<8} {statistics.median(direct):>13.3f} {spread(direct):>14}")
    print(f"{'staged':<8} {statistics.median(staged):>13.3f} {spread(staged):>14}")
    print(f"ratio staged/direct: median {statistics.median(ratios):.3f} (min..max {spread(ratios)}); bar >= 0.8")
    out = _common.write_json(
        args.json,
        {
            "benchmark": "staging",
            "size": size,
            "chunk": chunk,
            "runs": runs,
            "direct_gibps": {"median": statistics.median(direct), "min": min(direct), "max": max(direct)},
            "staged_gibps": {"median": statistics.median(staged), "min": min(staged), "max": max(staged)},
            "ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "values": ratios},
            "environment": _common.environment(),
        },
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
