"""Ping-pong a GPU array between two aionet nodes with ``node.send`` / ``node.recv``.

    python examples/gpu_pingpong.py                              # both nodes in this process
    python examples/gpu_pingpong.py --listen tcp://0.0.0.0:7700  # on host B (echo node)
    python examples/gpu_pingpong.py --join tcp://host-b:7700     # on host A (ping node)
    python examples/gpu_pingpong.py --url ucx://127.0.0.1:0      # any transport URL
    python examples/gpu_pingpong.py --simulate                   # the staging path on a CPU

With a GPU the array is a CuPy array and ``await node.send(peer, "ping", arr)`` stages it:
chunk by chunk through pinned buffers, the device->host copy of chunk k+1 overlapping the
send of chunk k (or as a device buffer when the transport moves device memory, UCX with
CUDA); it arrives as a CuPy array on the receiver's current device. Without a GPU it says so
and ping-pongs a numpy array (``--simulate`` instead sends a host array dressed up as a device
array through the very same staging path, with host memory playing the GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import numpy as np

import aionet
from aionet.config import Config
from aionet.devices import Devices, SimulatedDeviceBackend


class HostAsDevice:
    """A numpy array presented through ``__cuda_array_interface__`` (for ``--simulate``)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.a.shape, "typestr": self.a.dtype.str, "data": (self.a.ctypes.data, False), "version": 3}


def make_array(n: int, simulate: bool) -> tuple[Any, Any, Any]:
    """(array to send, node device_backend factory, comparable host view of the array)."""
    devices = Devices()
    if devices.cuda_available() and not simulate:
        import cupy as cp

        print(f"GPU found: {devices.discover()['gpus'][0]['name']}; sending a CuPy array")
        arr = cp.arange(n, dtype=cp.float32)
        return arr, lambda: None, arr
    host = np.arange(n, dtype=np.float32)
    if simulate:
        print("--simulate: a host array dressed as a device array, staged exactly like a GPU array")
        return HostAsDevice(host), SimulatedDeviceBackend, host
    print(f"no GPU here ({devices.cuda_reason()}); falling back to a numpy array")
    return host, lambda: None, host


def config(chunk_mib: int) -> Config:
    return Config.from_dict({"buffers": {"staging_chunk_bytes": f"{chunk_mib}MiB"}})


async def echo(node: aionet.Node, rounds: int, simulate: bool) -> None:
    for _ in range(rounds):
        sender, arr = await node.recv_from("ping")  # CuPy on a GPU node (numpy when simulated)
        await node.send(sender, "pong", HostAsDevice(arr) if simulate else arr)


async def ping(node: aionet.Node, peer: str, arr: Any, host: Any, rounds: int) -> None:
    nbytes = host.nbytes
    for i in range(rounds):
        t0 = time.perf_counter()
        await node.send(peer, "ping", arr)
        back = await node.recv("pong")
        dt = time.perf_counter() - t0
        ok = bool((back == host).all())
        print(
            f"round {i + 1}: {nbytes / 2**20:.0f} MiB there and back in {dt * 1e3:.1f} ms "
            f"({2 * nbytes / dt / 2**30:.2f} GiB/s), arrived as {type(back).__module__}.{type(back).__name__}, "
            f"equal={ok}"
        )
    print("staging on the ping node:", node.stats().device)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="tcp://127.0.0.1:0", help="listen URL when running both nodes here")
    ap.add_argument("--listen", help="run only the echo node, listening here")
    ap.add_argument("--join", help="run only the ping node, joining the echo node here")
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--chunk-mib", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--simulate", action="store_true", help="stage a host array as if it were on a GPU")
    args = ap.parse_args()
    arr, backend, host = make_array(args.mib * 2**20 // 4, args.simulate)
    if args.listen:
        cfg = config(args.chunk_mib)
        async with aionet.Node(name="echo", listen=args.listen, config=cfg, device_backend=backend()) as b:
            print(f"echo node listening on {b.address}")
            await echo(b, args.rounds, args.simulate)
        return
    if args.join:
        cfg = config(args.chunk_mib)
        async with aionet.Node(name="ping", listen=args.url, join=args.join, config=cfg, device_backend=backend()) as a:
            await ping(a, "echo", arr, host, args.rounds)
        return
    async with aionet.Node(name="echo", listen=args.url, config=config(args.chunk_mib), device_backend=backend()) as b:
        cfg = config(args.chunk_mib)
        async with aionet.Node(name="ping", listen=args.url, join=b.address, config=cfg, device_backend=backend()) as a:
            task = asyncio.ensure_future(echo(b, args.rounds, args.simulate))
            await ping(a, "echo", arr, host, args.rounds)
            await task


if __name__ == "__main__":
    from aionet.log import configure

    configure(level="warning", stream=sys.stderr)
    aionet.run(main())
