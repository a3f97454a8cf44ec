#!/usr/bin/env python
"""Copy ceilings of this GPU, for judging the staging path's numbers on the same machine.

    python benchmarks/gpu_ceiling.py [--size 256MiB] [--repeats 5] [--json PATH]

Times, with CUDA events, one ``cudaMemcpyAsync`` of ``--size`` bytes device->host and
host->device into pinned (``cupyx.empty_pinned``) and pageable (numpy) host memory, and
device->device; medians of ``--repeats``. aionet's staged sends pay one device->host and one
host->device copy per chunk (overlapped with the wire), so the pinned numbers bound what
``aionet bench p2p --device gpu`` can reach; the wire (loopback TCP) is usually the lower bound.
Needs CuPy and a CUDA device; says why not otherwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

from aionet.config import parse_size
from aionet.devices import Devices


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    devices = Devices(use_nvml=False)
    if not devices.cuda_available():
        sys.exit(f"gpu_ceiling: needs CuPy and a CUDA device: {devices.cuda_reason()}")
    import cupy as cp
    import cupyx

    n = parse_size(args.size)
    dev = cp.empty(n, dtype=cp.uint8)
    dev2 = cp.empty(n, dtype=cp.uint8)
    dev.fill(1)
    pinned = cupyx.empty_pinned((n,), dtype=np.uint8)
    pageable = np.ones(n, dtype=np.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    rt = cp.cuda.runtime

    def timed(dst: int, src: int, kind: int) -> float:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        rt.memcpyAsync(dst, src, n, kind, stream.ptr)
        end.record(stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 1e3

    paths = {
        "d2h_pinned": (int(pinned.ctypes.data), int(dev.data.ptr), 2),
        "h2d_pinned": (int(dev.data.ptr), int(pinned.ctypes.data), 1),
        "d2h_pageable": (int(pageable.ctypes.data), int(dev.data.ptr), 2),
        "h2d_pageable": (int(dev.data.ptr), int(pageable.ctypes.data), 1),
        "d2d": (int(dev2.data.ptr), int(dev.data.ptr), 3),
    }
    out: dict[str, object] = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "bytes": n}
    for name, (dst, src, kind) in paths.items():
        timed(dst, src, kind)  # warm-up
        secs = [timed(dst, src, kind) for _ in range(args.repeats)]
        gbs = sorted(n / s / 1e9 for s in secs)
        out[name] = {"gbytes_per_s": statistics.median(gbs), "min": gbs[0], "max": gbs[-1]}
        print(f"{name:13s} {statistics.median(gbs):8.2f} GB/s  ({gbs[0]:.2f}-{gbs[-1]:.2f})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
