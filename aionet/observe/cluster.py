"""The whole cluster as one node sees it, for ``/status`` and the dashboard.

Each member answers ``aionet.observe.summary`` (a few hundred bytes: counters, task states,
latency quantiles, recent events) when it runs an observer, else ``aionet.info``, from which the
same summary is derived. The member table (state, load, devices) comes from membership gossip,
so a dead member shows as dead at once, without asking it anything.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import RemoteError

if TYPE_CHECKING:
    from .metrics import MetricsInstrument

SUMMARY_SERVICE = "aionet.observe.summary"
EVENTS_PER_NODE = 20
EVENTS_SHOWN = 40
DEDUPE_S = 2.0  # the same event reported by several members within this many seconds is one


def summarize(info: dict[str, Any], inst: MetricsInstrument | None = None) -> dict[str, Any]:
    """A small summary of one node from its ``info()`` (``stats().as_dict()``) and, when it has
    one, its metrics instrument. Counters are totals; the dashboard turns them into rates."""
    peers = info.get("peers") or {}
    links = [p["link"] for p in peers.values() if p.get("link")]
    sched = info.get("scheduler") or {}
    owner, worker = sched.get("owner") or {}, sched.get("worker") or {}
    ms = info.get("membership") or {}
    out: dict[str, Any] = {
        "name": info.get("name"),
        "time": time.time(),
        "uptime": info.get("uptime", 0.0),
        "pid": info.get("pid"),
        "version": info.get("version"),
        "listen": info.get("listen"),
        "messages_sent": sum(max(link.get("next_seq", 1) - 1, 0) for link in links),
        "messages_received": sum(link.get("recv_seq", 0) for link in links),
        "bytes_sent": sum(link.get("sent_bytes", 0) for link in links),
        "bytes_received": sum(link.get("recv_bytes", 0) for link in links),
        "inflight_bytes": sum(p.get("inflight_bytes", 0) for p in peers.values()),
        "loop_lag_ms": ms.get("loop_lag_ms", 0.0),
        "max_phi": ms.get("max_phi", 0.0),
        "tasks": {
            "queued": worker.get("queued", 0),
            "running": worker.get("running", 0),
            "owned": owner.get("owned", 0),
            "completed": owner.get("completed", 0),
            "failed": owner.get("failed", 0),
            "ran": worker.get("ran", 0),
            "errors": worker.get("errors", 0),
        },
        "latency": None,
        "requests_failed": None,
        "events": [],
    }
    if inst is not None:
        out["latency"] = inst.latency_quantiles()
        out["requests_failed"] = inst.request_failures
        out["events"] = list(inst.recent)[-EVENTS_PER_NODE:]
    return out


def members_view(members: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The member table trimmed to what the dashboard shows."""
    out = {}
    for name, m in members.items():
        load = m.get("load") or {}
        dev = m.get("devices") or {}
        out[name] = {
            "state": m.get("state"),
            "address": m.get("address"),
            "self": bool(m.get("self")),
            "age": m.get("age"),
            "cpu_percent": load.get("cpu_percent"),
            "rss": load.get("rss"),
            "loop_lag_ms": load.get("loop_lag_ms"),
            "gpu_utilization": load.get("gpu_utilization") or [],
            "cpu_count": dev.get("cpu_count"),
            "memory_total": dev.get("memory_total"),
            "gpus": [
                {"name": g.get("name"), "memory_total": g.get("memory_total"), "memory_used": g.get("memory_used")}
                for g in dev.get("gpus") or []
            ],
        }
    return out


class ClusterView:
    """Gathers members' summaries (concurrently, each bounded by ``timeout``) and keeps the last
    one per member, so a slow or dead member never holds up the page."""

    def __init__(self, node: Any, local_summary: Callable[[], dict[str, Any]], timeout: float) -> None:
        self.node = node
        self.local_summary = local_summary
        self.timeout = timeout
        self.summaries: dict[str, dict[str, Any]] = {}
        self._basic: set[str] = set()  # members without an observer: ask aionet.info instead

    async def _ask(self, name: str) -> None:
        try:
            if name not in self._basic:
                try:
                    self.summaries[name] = await self.node.request(name, SUMMARY_SERVICE, None, timeout=self.timeout)
                    return
                except RemoteError:
                    self._basic.add(name)
            self.summaries[name] = summarize(await self.node.request(name, "aionet.info", None, timeout=self.timeout))
        except Exception:  # dead, slow or gone: keep the last summary; the member table says why
            pass

    async def refresh(self) -> None:
        members = self.node.members()
        for gone in set(self.summaries) - set(members):
            del self.summaries[gone]
            self._basic.discard(gone)
        me = self.node.name
        others = [n for n, m in members.items() if n != me and m.get("state") == "alive"]
        if others:
            await asyncio.gather(*(self._ask(n) for n in others))
        self.summaries[me] = self.local_summary()

    def snapshot(self) -> dict[str, Any]:
        """What ``/status`` returns and the live stream sends."""
        members = members_view(self.node.members())
        nodes = {n: s for n, s in self.summaries.items() if n in members}
        events = sorted(
            ({**ev, "seen_by": name} for name, sm in nodes.items() for ev in sm.get("events") or []),
            key=lambda e: e.get("t", 0),
        )
        return {
            "time": time.time(),
            "node": self.node.name,
            "members": members,
            "nodes": nodes,
            "events": _dedupe(events)[-EVENTS_SHOWN:],
        }


def _dedupe(events: list[dict[str, Any]], window: float = DEDUPE_S) -> list[dict[str, Any]]:
    """Every member reports the same death: one line per (kind, member) per ``window`` seconds."""
    last: dict[tuple[Any, Any], float] = {}
    out = []
    for ev in events:
        key, t = (ev.get("kind"), ev.get("who")), float(ev.get("t", 0))
        if t - last.get(key, -1e18) > window:
            out.append(ev)
        last[key] = t
    return out


__all__ = ["SUMMARY_SERVICE", "ClusterView", "members_view", "summarize"]
