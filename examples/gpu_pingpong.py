"""Ping-pong a GPU array between two endpoints through aionet's staging pipeline.

    python examples/gpu_pingpong.py                         # both ends in this process
    python examples/gpu_pingpong.py --listen tcp://0.0.0.0:7700          # on node B
    python examples/gpu_pingpong.py --connect tcp://node-b:7700          # on node A
    python examples/gpu_pingpong.py --url ucx://127.0.0.1:0              # any transport URL

With a GPU the array is a CuPy array: it is staged through pinned buffers chunk by chunk
(device->host copy of chunk k+1 overlapping the send of chunk k) unless the transport moves
device memory itself (UCX with CUDA). Without a GPU it says so and ping-pongs a numpy array
through the same pipeline, with host memory standing in for device memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import numpy as np

from aionet.buffers import BufferPool
from aionet.devices import Devices
from aionet.staging import SimulatedDeviceBackend, Stager
from aionet.transports.registry import TransportRegistry


def make_array(n: int) -> tuple[Any, Stager]:
    devices = Devices()
    if devices.cuda_available():
        import cupy as cp

        print(f"GPU found: {devices.discover()['gpus'][0]['name']}; sending a CuPy array")
        return cp.arange(n, dtype=cp.float32), Stager(devices=devices)
    print(f"no GPU here ({devices.cuda_reason()}); falling back to a numpy array through the same pipeline")
    pool = BufferPool(size_classes=(4 << 20,), max_bytes=32 << 20)
    return np.arange(n, dtype=np.float32), Stager(backend=SimulatedDeviceBackend(), pool=pool)


async def send_array(conn: Any, stager: Stager, arr: Any) -> None:
    if not stager.needs_staging(conn):  # UCX with CUDA: the device buffer is the frame
        meta, frames = stager.encode(arr, device_frames=True)
        await conn.send([json.dumps(meta).encode(), *frames])
        return
    meta = stager.header(arr)
    await conn.send([json.dumps(meta).encode()])
    await stager.send_array(arr, conn.send)


async def recv_array(conn: Any, stager: Stager) -> Any:
    first = await conn.recv()
    meta = json.loads(bytes(first[0]))
    if meta.get("device"):
        return stager.decode(meta, first[1:])
    return await stager.recv_array(meta, conn.recv)


async def echo_side(conn: Any, stager: Stager, rounds: int) -> None:
    for _ in range(rounds):
        arr = await recv_array(conn, stager)
        await send_array(conn, stager, arr)


async def ping_side(conn: Any, stager: Stager, arr: Any, rounds: int) -> None:
    nbytes = arr.nbytes
    for i in range(rounds):
        t0 = time.perf_counter()
        await send_array(conn, stager, arr)
        back = await recv_array(conn, stager)
        dt = time.perf_counter() - t0
        ok = bool((back == arr).all())
        print(
            f"round {i + 1}: {nbytes / 2**20:.0f} MiB there and back in {dt * 1e3:.1f} ms "
            f"({2 * nbytes / dt / 2**30:.2f} GiB/s), {type(back).__module__}.{type(back).__name__}, equal={ok}"
        )


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="tcp://127.0.0.1:0", help="listen URL when running both ends here")
    ap.add_argument("--listen", help="run only the echo side, listening here")
    ap.add_argument("--connect", help="run only the ping side, connecting here")
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    arr, stager = make_array(args.mib * 2**20 // 4)
    registry = TransportRegistry()
    try:
        if args.connect:
            conn = await registry.get(args.connect).connect(args.connect, timeout=10)
            await ping_side(conn, stager, arr, args.rounds)
            await conn.close()
            return
        done = asyncio.Event()

        async def handler(conn: Any) -> None:
            await echo_side(conn, stager, args.rounds)
            done.set()

        url = args.listen or args.url
        listener = await registry.get(url).listen(url, handler)
        print(f"echo side listening on {listener.address}")
        if args.listen:
            await done.wait()
        else:
            conn = await registry.get(listener.address).connect(listener.address, timeout=10)
            await ping_side(conn, stager, arr, args.rounds)
            await asyncio.wait_for(done.wait(), 30)
            await conn.close()
        await listener.close()
    finally:
        stager.close()
        await registry.aclose()


if __name__ == "__main__":
    from aionet.log import configure

    configure(level="warning", stream=sys.stderr)
    asyncio.run(main())
