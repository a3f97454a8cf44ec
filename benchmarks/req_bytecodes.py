"""Python bytecodes and calls per request round trip, per function: both nodes in one process.

Counts every bytecode the interpreter runs (``sys.settrace`` with opcode events) while one
caller (or ``--concurrency`` callers) makes ``-n`` requests of 64 B with a timeout to an echo service over tcp:// on
127.0.0.1, as ``p2p.py``'s latency row does. Work started by timers (delayed acks, request
deadlines firing, heartbeats, membership) is left out: how often timers fire depends on the
machine's speed, the request path's bytecodes do not. Unlike wall clock, the totals repeat
within about 1 % between runs, so two trees compare in one minute on a loaded machine.

    python3 benchmarks/req_bytecodes.py --handler async -n 1000
    PYTHONPATH=/other/tree python3 /tmp/copy_of_this.py ...   # another tree, same script
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
from pathlib import Path
from types import FrameType
from typing import Any

# timer-driven code (and whatever it calls) is not counted
TIMER_FUNCTIONS = frozenset({"_ack_due", "flush_ack", "_fire", "_trim", "_scheduled_flush", "_watch_loop", "_beat"})
TIMER_MODULES = ("membership", "heartbeat", "detector")


def _from_timer(frame: FrameType | None) -> bool:
    while frame is not None:
        code = frame.f_code
        if code.co_name in TIMER_FUNCTIONS or any(m in code.co_filename for m in TIMER_MODULES):
            return True
        frame = frame.f_back
    return False


def bytecode_tracer() -> tuple[collections.Counter[str], collections.Counter[str], Any]:
    """``(ops, calls, trace)``: a ``sys.settrace`` function that counts, per ``file:function``,
    bytecodes executed and calls (a coroutine's every resumption is one), skipping timer work."""
    ops: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()

    def trace(frame: FrameType, event: str, _arg: Any) -> Any:
        if _from_timer(frame):
            return None
        code = frame.f_code
        key = f"{os.path.basename(code.co_filename)}:{code.co_name}"
        calls[key] += 1
        frame.f_trace_opcodes = True

        def local(_frame: FrameType, ev: str, _a: Any) -> Any:
            if ev == "opcode":
                ops[key] += 1
            return local

        return local

    return ops, calls, trace


async def run(handler: str, n: int, top: int, concurrency: int = 1) -> None:
    import aionet
    from aionet.config import Config

    quiet = {"heartbeat": {"interval": 5.0, "load_interval": 30.0}, "scheduler": {"steal": False}}
    cfg = Config.from_dict(quiet, env={})
    server = aionet.Node(name="server", listen="tcp://127.0.0.1:0", config=cfg)
    await server.start()

    async def aecho(x: Any) -> Any:
        return x

    server.add_service("echo", aecho if handler == "async" else (lambda x: x))
    client = aionet.Node(name="client", listen="tcp://127.0.0.1:0", join=[server.address], config=cfg)
    await client.start()
    msg = b"x" * 64
    try:
        for _ in range(500):  # warm-up: joined, specialised, write-through on
            await client.request("server", "echo", msg, timeout=5.0)
        ops, calls, trace = bytecode_tracer()

        left = iter(range(n))

        async def caller() -> None:
            for _ in left:
                await client.request("server", "echo", msg, timeout=30.0)

        sys.settrace(trace)
        try:
            await asyncio.gather(*(caller() for _ in range(concurrency)))
        finally:
            sys.settrace(None)
    finally:
        await client.stop()
        await server.stop()
    print(
        f"{handler} echo, {concurrency} in flight: {sum(ops.values()) / n:.0f} bytecodes, "
        f"{sum(calls.values()) / n:.1f} calls per request"
    )
    print("(a coroutine's every resumption counts as a call)")
    for key, v in ops.most_common(top):
        print(f"{v / n:8.1f} {calls[key] / n:6.2f}  {key}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--handler", choices=("async", "sync"), default="async", help="the echo service's kind")
    ap.add_argument("-n", type=int, default=1000, help="measured round trips")
    ap.add_argument("--top", type=int, default=30, help="functions listed")
    ap.add_argument("--concurrency", type=int, default=1, help="callers, each looping on request")
    args = ap.parse_args()
    from aionet.runner import loop_factory

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(run(args.handler, args.n, args.top, args.concurrency))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
