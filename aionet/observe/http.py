"""The node's HTTP server (aiohttp): ``/`` the dashboard, ``/status`` the cluster as JSON,
``/metrics`` for Prometheus, ``/health`` for probes, ``/events`` the live stream (server-sent
events).

One refresher task per node gathers the cluster view every ``[http] interval`` seconds, and at
once on a membership change, and only while a page is open (``/status`` gathers on demand).
Every open page gets the same encoded bytes through a one-slot queue: a slow browser skips
updates instead of growing a backlog, so memory stays flat however long pages stay open.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from aiohttp import web

from ..core.tasks import OwnedTasks
from ..log import get_logger
from .cluster import SUMMARY_SERVICE, ClusterView, summarize
from .metrics import NodeMetrics

DASHBOARD = Path(__file__).parent / "dashboard"
MAX_LOOP_LAG_MS = 2000.0  # /health answers 503 above this: the node is alive but not keeping up


class Observer:
    """Metrics plus the HTTP server of one node. ``await Observer(node).start()`` (the Node does
    it when ``[http] port`` is set); ``url`` is where it listens."""

    def __init__(self, node: Any) -> None:
        self.node = node
        cfg = node.config.http
        self.host, self.port, self.interval = cfg.host, cfg.port, cfg.interval
        self.log = get_logger("aionet.observe", node=node.name)
        self.metrics = NodeMetrics(node)
        self.view = ClusterView(node, self.summary, timeout=max(0.2, 0.8 * self.interval))
        self._tasks = OwnedTasks(self.log, "observer")
        self._subscribers: set[asyncio.Queue[bytes | None]] = set()
        self._wake = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._unsubscribe: Any = None
        self.last: bytes | None = None
        self.updates = 0  # refreshes sent to open pages (benchmarks/observe_soak.py counts them)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def summary(self) -> dict[str, Any]:
        return summarize(self.node.info(), self.metrics.instrument)

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        node = self.node
        node.instruments.add(self.metrics.instrument)
        node.add_service(SUMMARY_SERVICE, self._summary_service)
        self._unsubscribe = node.on_member_change(lambda _ev: self._wake.set())
        app = web.Application()
        app.router.add_get("/", self._index)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/status", self._status)
        app.router.add_get("/health", self._health)
        app.router.add_get("/events", self._events)
        app.router.add_static("/static/", DASHBOARD)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        self._tasks.spawn(self._refresh_loop(), "aionet-observe-refresh")
        self.log.info("http serving", url=self.url)

    async def close(self) -> None:
        for q in list(self._subscribers):
            _offer(q, None)  # ends each open stream, so the runner need not wait for them
        await self._tasks.cancel_all()
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.node.router.services.pop(SUMMARY_SERVICE, None)  # members fall back to aionet.info
        if self.metrics.instrument in list(self.node.instruments):
            self.node.instruments.remove(self.metrics.instrument)

    # ---------------------------------------------------------------- the live view
    async def _refresh_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except TimeoutError:
                pass
            self._wake.clear()
            if not self._subscribers:
                continue
            try:
                await self.update()
            except Exception as exc:  # a bug here must not take the dashboard down for good
                self.log.warning("dashboard update failed", error=repr(exc))

    async def update(self) -> None:
        """One refresh of the open pages: what the refresher does each ``interval`` (and what
        benchmarks/observe_instructions.py counts, so it measures this very code)."""
        self._publish()  # the member table first (a death shows without waiting on anyone)...
        await self.view.refresh()  # ... then everyone's counters
        self._publish()
        self.updates += 1

    def _publish(self) -> None:
        data = b"data: " + json.dumps(self.view.snapshot(), default=str).encode() + b"\n\n"
        self.last = data
        for q in list(self._subscribers):
            _offer(q, data)

    async def _events(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        q: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=1)
        self._subscribers.add(q)
        self._wake.set()
        try:
            if self.last is not None:
                await resp.write(self.last)
            while (data := await q.get()) is not None:
                await resp.write(data)
        except (ConnectionResetError, ConnectionError):
            pass  # the page went away
        finally:
            self._subscribers.discard(q)
        return resp

    # ---------------------------------------------------------------- plain endpoints
    async def _summary_service(self, _arg: Any) -> dict[str, Any]:
        return self.summary()

    async def _index(self, _request: web.Request) -> web.FileResponse:
        return web.FileResponse(DASHBOARD / "index.html")

    async def _metrics(self, _request: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _status(self, _request: web.Request) -> web.Response:
        await self.view.refresh()
        return web.json_response(self.view.snapshot(), dumps=lambda o: json.dumps(o, default=str))

    async def _health(self, _request: web.Request) -> web.Response:
        lag = self.node.membership.stats().loop_lag_ms
        ok = lag < MAX_LOOP_LAG_MS
        body = {"status": "ok" if ok else "lagging", "node": self.node.name, "loop_lag_ms": lag}
        return web.json_response(body, status=200 if ok else 503)


def _offer(q: asyncio.Queue[bytes | None], item: bytes | None) -> None:
    """Put ``item``, replacing whatever the reader has not taken yet (latest wins)."""
    if q.full():
        q.get_nowait()
    q.put_nowait(item)


__all__ = ["Observer"]
