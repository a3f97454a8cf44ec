#!/usr/bin/env python
"""What the receiver's kernel copy costs when messages land in K rotating buffers instead of one.

A forked sender writes ``--count`` messages of ``--size`` bytes over TCP loopback; the receiver
reads message ``i`` into buffer ``i % K`` with blocking ``recv_into`` (no event loop, no framing:
only the destination's footprint changes). Each K runs once per round, rounds interleaved; the
receiver's ``getrusage`` gives its CPU seconds per GB (the kernel copy is its sys time).

This is why aionet's decoder reuses the buffer it filled last (``FrameDecoder._reuse_or_alloc``):
taking the oldest dropped one made a 1 MiB stream rotate through all 16 remembered buffers.

    python benchmarks/recv_rotation.py --ks 1,2,16 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import time


def _sender(port: int, size: int, count: int) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = os.urandom(size)
    for _ in range(count):
        s.sendall(data)
    s.close()


def one(k: int, size: int, count: int) -> dict[str, float]:
    """Receive ``count`` messages into ``k`` rotating buffers; rate and receiver CPU per GB."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen()
    pid = os.fork()
    if pid == 0:  # the sender
        try:
            _sender(ls.getsockname()[1], size, count)
        finally:
            os._exit(0)
    conn, _ = ls.accept()
    views = [memoryview(bytearray(size)) for _ in range(k)]
    for v in views:  # fault every page in before measuring
        v[::4096] = b"\1" * len(v[::4096])
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    total = i = 0
    while True:
        mv = views[i % k]
        got = 0
        while got < size:
            n = conn.recv_into(mv[got:])
            if not n:
                break
            got += n
        if got < size:
            break
        total += got
        i += 1
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    os.waitpid(pid, 0)
    conn.close()
    ls.close()
    gb = total / 1e9
    return {
        "gbps": gb / dt,
        "user_s_per_gb": (r1.ru_utime - r0.ru_utime) / gb,
        "sys_s_per_gb": (r1.ru_stime - r0.ru_stime) / gb,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", default="1,2,16", help="buffer counts to compare")
    ap.add_argument("--size", type=int, default=2**20)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    ks = [int(x) for x in a.ks.split(",")]
    res: dict[int, list[dict[str, float]]] = {k: [] for k in ks}
    for _ in range(a.rounds):
        for k in ks:
            r = one(k, a.size, a.count)
            res[k].append(r)
            u, s = r["user_s_per_gb"], r["sys_s_per_gb"]
            print(f"K={k:3d} {r['gbps']:.2f} GB/s, receiver user {u:.3f} sys {s:.3f} s/GB")
    for k in ks:
        med = {key: statistics.median(r[key] for r in res[k]) for key in res[k][0]}
        print(f"median K={k:3d} " + " ".join(f"{key}={v:.3g}" for key, v in med.items()))


if __name__ == "__main__":
    main()
