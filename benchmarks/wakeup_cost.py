#!/usr/bin/env python
"""What a process's wake-up costs a round trip: a 64 B ping-pong over raw TCP sockets on
127.0.0.1 (no event loop, no aionet), with each side either blocking in ``recv`` (the kernel
wakes it when the bytes arrive) or spinning on non-blocking ``recv`` calls (it never sleeps).

The gap between "neither spins" and "both spin" is the wake-ups' share of a round trip on this
machine, which no user-space change can remove without polling: what ``node.busy_poll_us``
trades a busy core for (README, "Busy polling").

    python3 benchmarks/wakeup_cost.py --rounds 2
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

MSG = b"x" * 64


def _recv_exact(s: socket.socket, n: int, spin: bool) -> bytes:
    buf = b""
    while len(buf) < n:
        if spin:
            try:
                d = s.recv(n - len(buf), socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
        else:
            d = s.recv(n - len(buf))
        if not d:
            raise EOFError
        buf += d
    return buf


def one(client_spins: bool, server_spins: bool, n: int, warmup: int) -> tuple[float, float]:
    """p50 and p90 round trip in microseconds, a fresh process pair."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    port = ls.getsockname()[1]
    pid = os.fork()
    if pid == 0:  # the echo server
        try:
            c = socket.create_connection(("127.0.0.1", port))
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                c.sendall(_recv_exact(c, len(MSG), server_spins))
        except (EOFError, OSError):
            pass
        os._exit(0)
    try:
        s, _ = ls.accept()
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        lat = []
        for _ in range(n + warmup):
            t = time.perf_counter_ns()
            s.sendall(MSG)
            _recv_exact(s, len(MSG), client_spins)
            lat.append(time.perf_counter_ns() - t)
        s.close()
    finally:
        ls.close()
        os.waitpid(pid, 0)
    lat = sorted(lat[warmup:])
    return statistics.median(lat) / 1e3, lat[int(len(lat) * 0.9)] / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=5000, help="round trips measured per run")
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=2, help="runs of each mode, interleaved")
    args = ap.parse_args()
    modes = {"neither spins": (False, False), "client spins": (True, False), "both spin": (True, True)}
    print(f"{'mode':<15} {'p50 us':>8} {'p90 us':>8}")
    for _ in range(args.rounds):
        for name, (c, s) in modes.items():
            p50, p90 = one(c, s, args.n, args.warmup)
            print(f"{name:<15} {p50:8.1f} {p90:8.1f}", flush=True)


if __name__ == "__main__":
    main()
