"""What the caller-side request bound costs (``link.max_concurrent_requests``, README
"Requests"): 64 callers of one node each make 200 requests to another, for a ``def`` and an
``async def`` echo, at the bound 8 and the default 1024; requests/s, medians of 3 rounds.

A caller keeps to the window its peer advertises (the bound, and as many again that may wait
there for a slot). It counts every request except those to the ``def`` services the peer
lists in its handshake (``rpc_inline``) or announces later (``INLINE_SERVICES``), which the peer
answers inline and never counts; ``def, registered before start`` rows use the first, the
plain ``def`` rows the second.
Compare trees with ``PYTHONPATH=OTHER_TREE python3 benchmarks/request_bound.py``.

    python3 benchmarks/request_bound.py [--rounds 3] [--per 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import uvloop

from aionet import Node
from aionet.config import Config

KINDS = {
    "def": "def       handler",
    "def-early": "def, registered before start",
    "async": "async def handler",
}


async def _rate(bound: int, kind: str, per: int) -> float:
    cfg = Config.from_dict({"link": {"max_concurrent_requests": bound}}, env={})
    a = Node(name="a", listen="tcp://127.0.0.1:0", config=cfg)
    if kind == "def-early":  # advertised in the handshake (rpc_inline): callers do not count it
        a.add_service("s", lambda x: x)
    async with a, Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b:
        if kind == "async":

            async def echo(x: Any) -> Any:
                return x

            a.add_service("s", echo)
        elif kind == "def":  # registered once both run: announced (INLINE_SERVICES), then not counted
            a.add_service("s", lambda x: x)
        await b.request("a", "s", 0, timeout=5)

        async def caller() -> None:
            for i in range(per):
                await b.request("a", "s", i, timeout=30)

        t0 = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(64)))
        return 64 * per / (time.perf_counter() - t0)


async def _main(rounds: int, per: int) -> None:
    for kind, label in KINDS.items():
        for bound in (8, 1024):
            rates = [await _rate(bound, kind, per) for _ in range(rounds)]
            print(
                f"{label:30s} bound {bound:5d}: {statistics.median(rates) / 1e3:6.1f}k req/s "
                f"({min(rates) / 1e3:.1f}-{max(rates) / 1e3:.1f}k)"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per", type=int, default=200, help="requests per caller")
    args = ap.parse_args()
    uvloop.run(_main(args.rounds, args.per))


if __name__ == "__main__":
    main()
