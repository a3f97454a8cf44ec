#!/usr/bin/env python
"""Device arrays through the Node API: ``node.send`` of a (simulated) device array, staged in
chunks over the reliable link, versus ``node.send`` of the same bytes as a numpy array.

    python benchmarks/node_staging.py [--size 1GiB] [--chunk 4MiB] [--repeats 5] [--json PATH]

Two processes on 127.0.0.1 over tcp://, uvloop. The receiver node runs the simulated-device
backend (host memory standing in for device memory; every device<->host copy is a real
memcpy), so the staged path pays both copies, as a GPU node would pay two DMA copies:

* ``numpy``: ``await a.send("b", "arr", array)``: one message with one out-of-band frame.
* ``device``: the same memory presented through ``__cuda_array_interface__``; the node stages it
  as XFER chunk messages (chunk k+1 copied device->host while chunk k is on the wire) and the
  receiver copies every chunk host->device as it arrives.

Time: from the send until the receiver node reports the array complete in its mailbox (it
answers on another channel). Paths alternate; the report gives medians, spread and the ratio
device/numpy throughput per repeat. This measures the Node-level pipeline on the CPU; it says
nothing about PCIe.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common

from aionet import Node
from aionet.config import Config, parse_size
from aionet.devices import SimulatedDeviceBackend


class DeviceView:
    """Host memory presented as a CUDA array (what the simulated backend expects)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.a.shape, "typestr": self.a.dtype.str, "data": (self.a.ctypes.data, False), "version": 3}


def config(chunk: int) -> Config:
    return Config.from_dict(
        {
            "buffers": {"staging_chunk_bytes": chunk, "max_bytes": max(64 << 20, 8 * chunk)},
            "log": {"level": "warning"},
        },
        env={},
    )


async def receiver(chunk: int) -> None:
    async with Node(name="b", config=config(chunk), device_backend=SimulatedDeviceBackend()) as b:
        print("READY " + b.address, flush=True)
        while True:
            arr = await b.recv("arr")
            if isinstance(arr, str):  # "bye"
                return
            n = int(arr.nbytes)
            del arr
            await b.send("a", "ack", n)


async def sender(url: str, size: int, chunk: int, repeats: int) -> list[dict[str, float]]:
    async with Node(name="a", join=[url], config=config(chunk), device_backend=SimulatedDeviceBackend()) as a:
        host = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
        dev = DeviceView(host)

        async def one(obj: Any) -> float:
            t0 = time.perf_counter()
            await a.send("b", "arr", obj)
            assert await a.recv("ack") == size
            return time.perf_counter() - t0

        await one(host)  # warm-up: TCP window, pools, first-touch of the receiver's memory
        await one(dev)
        runs = []
        for i in range(repeats):
            order = [("numpy", host), ("device", dev)]
            if i % 2:
                order.reverse()
            run = {name: await one(obj) for name, obj in order}
            runs.append(run)
            print(
                f"  run {i + 1}: numpy {size / run['numpy'] / 2**30:.2f} GiB/s, "
                f"device (staged) {size / run['device'] / 2**30:.2f} GiB/s, "
                f"ratio {run['numpy'] / run['device']:.3f}",
                flush=True,
            )
        await a.send("b", "arr", "bye")
        return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--chunk", default="4MiB")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "node_staging.json"))
    ap.add_argument("--_receiver", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    size, chunk = parse_size(args.size), parse_size(args.chunk)
    if args._receiver:
        _common.run_async(receiver(chunk))
        return
    child = subprocess.Popen(
        [sys.executable, __file__, "--_receiver", "--chunk", str(chunk)], stdout=subprocess.PIPE, text=True
    )
    try:
        line = ""
        while child.stdout is not None and not line.startswith("READY "):
            line = child.stdout.readline()  # skip the receiver's log lines
            if not line:
                raise SystemExit("receiver failed to start")
        print(f"node staging benchmark: {size / 2**30:.2f} GiB, {chunk / 2**20:.0f} MiB chunks, {args.repeats} runs")
        runs = _common.run_async(sender(line.split()[1], size, chunk, args.repeats))
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
    rates = {p: [size / r[p] / 2**30 for r in runs] for p in ("numpy", "device")}
    ratios = [r["numpy"] / r["device"] for r in runs]
    print("path      median GiB/s   min..max")
    for p, v in rates.items():
        print(f"{p:<9} {np.median(v):>12.2f}   {min(v):.2f}..{max(v):.2f}")
    print(f"ratio device/numpy: median {np.median(ratios):.3f} (min..max {min(ratios):.3f}..{max(ratios):.3f})")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"size": size, "chunk": chunk, "runs": runs, "ratios": ratios}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
