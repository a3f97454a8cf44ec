#!/usr/bin/env python
"""Instructions per large allreduce per rank (valgrind callgrind): a measure the shared
machine's load does not move, for changes far below the wall-clock noise of a busbw run.

    valgrind --tool=callgrind --callgrind-out-file=/tmp/ci.%p --collect-atstart=no \\
        --toggle-collect=functools_reduce \\
        python benchmarks/collectives_instr.py --nodes 4 --mib 16 --calls 3

Every rank is an in-process node over tcp://127.0.0.1 (one loop, one thread), as in
``collectives_calls.py``; only the measured calls run inside ``functools.reduce(...)``, so with
the options above callgrind counts just them (start-up, joining and the warm-up calls are not
counted). Divide the total ``Ir`` (``callgrind_annotate``'s summary) by ``--calls`` times
``--nodes``. User-space instructions only: the kernel's loopback copies are not counted, so this
measures what aionet and numpy do per byte, not the socket's share. Compare trees by running it
from each, with ``PYTHONPATH`` set to the tree. ``--segment`` sets ``collectives.segment_bytes``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import uvloop  # noqa: E402

from aionet.testing import cluster  # noqa: E402


def parse_size(s: str) -> int:
    s = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--segment", default="", help="collectives.segment_bytes (e.g. 1M); default: the config's")
    args = ap.parse_args()
    config: dict[str, Any] = {"heartbeat": {"interval": 3600.0}}  # no timers firing ~50x as often under valgrind
    if args.segment:
        config["collectives"] = {"segment_bytes": parse_size(args.segment)}
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    cm = cluster(args.nodes, "tcp", config=config, timeout=120.0)
    nodes = loop.run_until_complete(cm.__aenter__())
    try:
        groups = [nd.group() for nd in nodes]
        xs = [np.full((args.mib << 20) // 4, g.rank + 1, np.float32) for g in groups]
        ys = [np.empty_like(x) for x in xs]

        async def calls(k: int) -> None:
            async def one(g: Any) -> None:
                for _ in range(k):
                    await g.allreduce(xs[g.rank], out=ys[g.rank])

            await asyncio.gather(*(one(g) for g in groups))

        loop.run_until_complete(calls(2))  # warm-up: pages faulted in, links streaming
        functools.reduce(lambda _acc, _i: loop.run_until_complete(calls(args.calls)), range(1), None)
        want = args.nodes * (args.nodes + 1) / 2
        if not all((y == want).all() for y in ys):
            raise SystemExit("wrong result")
        div = args.calls * args.nodes
        print(f"n={args.nodes} {args.mib} MiB x {args.calls} calls: results checked; divide Ir by {div}")
    finally:
        loop.run_until_complete(cm.__aexit__(None, None, None))
        loop.close()


if __name__ == "__main__":
    main()
