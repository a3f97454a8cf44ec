"""Python bytecodes and calls per 1 MiB one-way message, per function: both nodes in one process.

Counts every bytecode the interpreter runs (``sys.settrace`` with opcode events) while a sender
``await node.send``-s ``-n`` numpy arrays of ``--size`` bytes over tcp:// on 127.0.0.1 and the
receiver drains them with ``recv_batch`` (as ``p2p.py``'s throughput rows do). Timer-driven work
(delayed acks, heartbeats, membership) is left out, as in ``req_bytecodes.py``. The payload is
never touched by Python, so the counts are the per-message overhead; they repeat within about
1 % between runs, so two trees compare on a loaded machine.

    python3 benchmarks/big_bytecodes.py --readonly -n 300
    PYTHONPATH=/other/tree python3 /tmp/copy_of_this.py ...   # another tree, same script

``--instructions`` counts nothing itself: it runs the measured messages inside one
``functools.reduce`` call, for callgrind to count the machine instructions of just those
(user space only: the kernel's copies are not counted; the interpreter must be the real one,
not a pyenv shim; timer work is included there, slowed by valgrind, so it is an upper bound)::

    valgrind --tool=callgrind --callgrind-out-file=/dev/null --collect-atstart=no \
        --toggle-collect=functools_reduce "$(python3 -c 'import sys; print(sys.executable)')" \
        benchmarks/big_bytecodes.py --readonly -n 100 --instructions
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import sys
from pathlib import Path

from req_bytecodes import bytecode_tracer


class Pair:
    """Two nodes on tcp:// in this process, a draining receiver, and a burst of big sends."""

    async def start(self, size: int, readonly: bool) -> None:
        import numpy as np

        import aionet
        from aionet.config import Config

        quiet = {"heartbeat": {"interval": 5.0, "load_interval": 30.0}, "scheduler": {"steal": False}}
        cfg = Config.from_dict(quiet, env={})
        self.rx = aionet.Node(name="rx", listen="tcp://127.0.0.1:0", config=cfg)
        await self.rx.start()
        self.tx = aionet.Node(name="tx", listen="tcp://127.0.0.1:0", join=[self.rx.address], config=cfg)
        await self.tx.start()
        self.arr = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
        self.arr.flags.writeable = not readonly
        self.got = self.goal = 0
        self.reached = asyncio.Event()
        self.drain = asyncio.get_running_loop().create_task(self._consume())
        await self.burst(50)  # warm-up: joined, specialised, frames recycled

    async def _consume(self) -> None:
        while True:
            msgs = await self.rx.recv_batch("tp")
            self.got += len(msgs)
            if self.got >= self.goal:
                self.reached.set()

    async def burst(self, k: int) -> None:
        self.reached.clear()
        self.goal = self.got + k
        send, arr = self.tx.send, self.arr
        for _ in range(k):
            await send("rx", "tp", arr)
        await self.reached.wait()

    async def stop(self) -> None:
        self.drain.cancel()
        await asyncio.gather(self.drain, return_exceptions=True)
        await self.tx.stop()
        await self.rx.stop()


async def count_bytecodes(pair: Pair, n: int) -> tuple[collections.Counter[str], collections.Counter[str]]:
    ops, calls, trace = bytecode_tracer()
    sys.settrace(trace)
    try:
        await pair.burst(n)
    finally:
        sys.settrace(None)
    return ops, calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=300, help="measured messages")
    ap.add_argument("--size", type=int, default=1 << 20, help="bytes per array")
    ap.add_argument("--readonly", action="store_true", help="send a read-only array (send returns before its ack)")
    ap.add_argument("--top", type=int, default=40, help="functions listed")
    ap.add_argument("--instructions", action="store_true", help="run the burst inside functools.reduce (callgrind)")
    args = ap.parse_args()
    from aionet.runner import loop_factory

    pair = Pair()
    n = args.n
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(pair.start(args.size, args.readonly))
        try:
            if args.instructions:
                functools.reduce(lambda _acc, _i: runner.run(pair.burst(n)), range(1), None)
            else:
                ops, calls = runner.run(count_bytecodes(pair, n))
        finally:
            runner.run(pair.stop())
    kind = "read-only" if args.readonly else "writable"
    if args.instructions:
        print(f"{args.size} B {kind}: {n} messages inside functools.reduce")
        return
    print(
        f"{args.size} B {kind}: {sum(ops.values()) / n:.0f} bytecodes, {sum(calls.values()) / n:.1f} calls per message"
    )
    print("(a coroutine's every resumption counts as a call)")
    for key, v in ops.most_common(args.top):
        print(f"{v / n:8.1f} {calls[key] / n:6.2f}  {key}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
