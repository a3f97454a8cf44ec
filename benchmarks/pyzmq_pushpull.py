"""pyzmq's synchronous PUSH/PULL with ``copy=True``: the issue-18 reference for 64 B one-way rate.

``benchmarks/p2p.py``'s pyzmq column sends with ``copy=False``, which is slow for tiny
messages; this tight loop is the fairer baseline. Timed at the receiver, first to last message.

    python3 benchmarks/pyzmq_pushpull.py [-n 500000] [--size 64]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import zmq


def _receive(n: int, out: mp.Queue) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.PULL)
    out.put(s.bind_to_random_port("tcp://127.0.0.1"))
    s.recv()
    t0 = time.perf_counter()
    for _ in range(n - 1):
        s.recv()
    out.put((n - 1) / (time.perf_counter() - t0))
    s.close(linger=0)
    ctx.term()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=500_000)
    ap.add_argument("--size", type=int, default=64)
    args = ap.parse_args()
    q: mp.Queue = mp.Queue()
    proc = mp.Process(target=_receive, args=(args.n, q))
    proc.start()
    try:
        port = q.get(timeout=30)
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUSH)
        s.connect(f"tcp://127.0.0.1:{port}")
        msg = b"x" * args.size
        for _ in range(args.n):
            s.send(msg)
        rate = q.get(timeout=120)
        print(f"pyzmq sync PUSH/PULL copy=True, {args.size} B, timed at the receiver: {rate / 1e3:.0f}k msg/s")
        s.close(linger=0)
        ctx.term()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


if __name__ == "__main__":
    main()
