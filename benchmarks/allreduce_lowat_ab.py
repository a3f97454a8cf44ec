#!/usr/bin/env python
"""Same-process A/B of tcp://'s receive low-water mark (``rcvlowat_bytes``) under an allreduce.

N ``aionet.Node`` processes over tcp://127.0.0.1 call ``group.allreduce(x, out=y)`` (float32); the
mark every connection of every rank applies is switched call by call (the variants in turn), so a
change in the machine's load hits each variant alike. Prints CPU seconds per GB per rank of each
variant (``getrusage`` around each call, averaged over the ranks); 0 is "off". Every result is
checked. Benchmark only: it sets the connections' mark through a private attribute.

    chrt -f 10 python benchmarks/allreduce_lowat_ab.py --nodes 4 --size 64M --calls 20 --variants 0,1M
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OFF = 1 << 62  # a mark no frame reaches twice: never engaged


def parse_size(s: str) -> int:
    s = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def launch(a: argparse.Namespace) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, __file__, "--nodes", str(a.nodes), "--size", a.size, "--calls", str(a.calls)]
    base += ["--variants", a.variants]
    first = subprocess.Popen([*base, "--rank", "0"], env=env, stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None
    seed = first.stdout.readline().split()[1]
    procs = [first] + [
        subprocess.Popen([*base, "--rank", str(r), "--seed", seed], env=env, stdout=subprocess.PIPE, text=True)
        for r in range(1, a.nodes)
    ]
    per_rank: dict[str, list[float]] = {}
    for p in procs:
        out, _ = p.communicate(timeout=600)
        for line in out.splitlines():
            if line.startswith("RESULT "):
                for k, v in json.loads(line[7:]).items():
                    per_rank.setdefault(k, []).append(v)
    gb = parse_size(a.size) / 1e9
    print(json.dumps({k: round(sum(v) / len(v) / gb, 4) for k, v in per_rank.items()}))


def rank_main(a: argparse.Namespace) -> None:
    import numpy as np
    import uvloop

    from aionet import Node
    from aionet.config import Config
    from aionet.transports.tcp_connection import TCPConnection

    variants = [parse_size(v) for v in a.variants.split(",")]
    x = np.ones(parse_size(a.size) // 4, dtype=np.float32)
    y = np.empty_like(x)

    async def main() -> None:
        cfg = Config.from_dict({"transport": {"tcp": {"rcvlowat_bytes": 1 << 20}}})
        node = Node(name=f"r{a.rank}", listen="tcp://127.0.0.1:0", join=[a.seed] if a.seed else None, config=cfg)
        await node.start()
        try:
            if a.rank == 0:
                print("ADDR", node.address, flush=True)
            names = [f"r{i}" for i in range(a.nodes)]
            while not all(node.members().get(m, {}).get("state") == "alive" for m in names):
                await asyncio.sleep(0.01)
            g = node.group(members=names, name="lowat-ab")
            await g.barrier()
            await g.allreduce(x, out=y)
            conns: list[Any] = [o for o in gc.get_objects() if isinstance(o, TCPConnection)]
            cpu = dict.fromkeys(variants, 0.0)
            for i in range(a.calls * len(variants)):
                v = variants[i % len(variants)]
                for c in conns:
                    c._lowat_max = v or OFF
                await g.barrier()
                u0 = resource.getrusage(resource.RUSAGE_SELF)
                await g.allreduce(x, out=y)
                u1 = resource.getrusage(resource.RUSAGE_SELF)
                cpu[v] += u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime
                if not (y == a.nodes).all():
                    raise SystemExit("wrong allreduce result")
            print("RESULT", json.dumps({str(k): c / a.calls for k, c in cpu.items()}), flush=True)
            await g.barrier()
        finally:
            await node.stop()

    uvloop.run(main())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--size", default="64M", help="bytes per rank (K/M)")
    ap.add_argument("--calls", type=int, default=20, help="timed calls per variant")
    ap.add_argument("--variants", default="0,1M", help="marks to alternate (0: off)")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--seed", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank is None:
        launch(a)
    else:
        rank_main(a)


if __name__ == "__main__":
    main()
