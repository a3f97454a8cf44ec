#!/usr/bin/env python
"""CPU time per small message through the Node, both ends in one process.

Two Nodes on one event loop over ``tcp://127.0.0.1``: one ``await send``s 64 B messages in a
loop, the other drains them with ``recv_batch``. The figure is process CPU time divided by
the message count, so it adds the sender's and the receiver's per-message cost and is far
steadier than a rate on a shared machine (a busy neighbour slows the wall clock, not the CPU
time the process itself spends). The best of ``--repeat`` rounds is reported.

Use it to compare two trees on the same machine, interleaved (the numbers in BENCHMARKS.md
were taken that way):

    PYTHONPATH=/path/to/tree python benchmarks/send_cpu.py [--messages 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aionet


async def measure(messages: int, repeat: int) -> dict[str, float]:
    async with (
        aionet.Node(name="rx", listen="tcp://127.0.0.1:0") as rx,
        aionet.Node(name="tx", listen="tcp://127.0.0.1:0", join=[rx.address]) as tx,
    ):
        await tx.send("rx", "warm", 0)
        await rx.recv("warm")
        payload = b"x" * 64
        cpu: list[float] = []
        wall: list[float] = []
        for _ in range(repeat):

            async def produce() -> None:
                for _ in range(messages):
                    await tx.send("rx", "c", payload)

            async def consume() -> None:
                got = 0
                while got < messages:
                    got += len(await rx.recv_batch("c"))

            c0, w0 = time.process_time(), time.perf_counter()
            await asyncio.gather(produce(), consume())
            cpu.append((time.process_time() - c0) / messages * 1e6)
            wall.append((time.perf_counter() - w0) / messages * 1e6)
    return {"cpu_us_per_msg": min(cpu), "wall_us_per_msg": min(wall), "messages": messages, "repeat": repeat}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the result here too")
    args = ap.parse_args()
    res = aionet.run(measure(args.messages, args.repeat))
    print(
        f"64 B send + recv_batch, both ends: {res['cpu_us_per_msg']:.2f} us CPU per message "
        f"(best of {args.repeat}; wall {res['wall_us_per_msg']:.2f} us)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
