"""Helpers for benchmarks/observe_*.py.

``setup`` is an ``aionet serve --app`` hook: a ``sink`` mailbox drained and counted, a
``bench.wait`` service (returns once n messages arrived), ``bench.observe`` (turns the node's
metrics and HTTP server on at a port, or off with 0) and ``bench.page`` (whether a dashboard
page is connected), so one run can alternate metrics on/off.

``python benchmarks/_observe_app.py read URL`` is a dashboard client: it holds the page's live
stream (/events) open and reads every update, printing ``READY {}`` after the first.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any


class _Sink:
    def __init__(self) -> None:
        self.count = 0
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def drain(self, node: Any) -> None:
        while True:
            got = await node.recv_batch("sink")
            self.count += len(got)
            self.changed.set()


async def setup(node: Any) -> None:
    sink = _Sink()
    node.bench_sink = sink  # held by the node: lives and dies with the process
    sink.task = asyncio.get_running_loop().create_task(sink.drain(node))

    async def wait(n: int) -> int:
        while sink.count < n:
            sink.changed.clear()
            await sink.changed.wait()
        return sink.count

    async def observe(port: int) -> str | None:
        from aionet.observe import attach

        if port and node.observer is None:
            node.config.http.port = port
            node.observer = await attach(node)
            return node.observer.url
        if not port and node.observer is not None:
            await node.observer.close()
            node.observer = None
        return None

    def page(_: object) -> bool:
        """Whether a dashboard page holds the live stream open and has had an update."""
        obs = node.observer
        return obs is not None and bool(obs._subscribers) and obs.updates > 0

    node.add_service("bench.wait", wait)
    node.add_service("bench.observe", observe)
    node.add_service("bench.page", page)


def _read(url: str) -> None:
    """Like a browser's EventSource: read updates; when the server goes away, retry (every 0.1 s,
    so that benchmarks switching metrics on wait little for the page to come back)."""
    import json
    import time
    import urllib.request

    n = 0
    print("READY " + json.dumps({"url": url}), flush=True)
    while True:
        try:
            with urllib.request.urlopen(url + "/events", timeout=60) as r:
                for line in r:
                    if line.startswith(b"data: "):
                        n += 1
                        if n == 1:
                            print("FIRST {}", flush=True)
        except OSError:
            pass
        time.sleep(0.1)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "read":
    _read(sys.argv[2])
