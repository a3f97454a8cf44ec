"""Prometheus metrics for one Node: a registry of its own (many nodes may share a process), a
collector that reads ``node.stats()`` when scraped, and an :class:`Instrument` that counts what
only hooks see (request latencies, member and link events).

It does not override ``task_changed``: task states come from ``stats()`` at scrape time, and
that hook, once installed, makes every task finishing on a worker thread wake the event loop
(``call_soon_threadsafe``: a self-pipe write and an extra loop pass per task).

Label sets are bounded by the cluster, never by the work: ``peer``/``member`` (cluster size),
``service`` (registered services), ``channel`` (mailboxes), ``state``/``kind``/``outcome``
(enums). No per-task, per-request or per-key label exists, so a node exports a few hundred series
however much it runs. Names follow Prometheus conventions: base units (seconds, bytes), ``_total``
on counters.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.process_collector import ProcessCollector

from ..instrument import Instrument

if TYPE_CHECKING:
    from ..stats import NodeStats

#: request latencies: 100 us .. 30 s (small messages on a LAN are ~100 us; tasks take seconds)
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
MEMBER_STATES = ("alive", "suspect", "dead", "left")
RECENT_EVENTS = 100  # member events and failures kept for the dashboard
RECENT_LATENCIES = 512  # request latencies kept for the dashboard's p50/p99


def _outcome(error: str | None) -> str:
    if error is None:
        return "ok"
    return "cancelled" if error == "cancelled" else "error"


class MetricsInstrument(Instrument):
    """Hook-fed metrics: histograms and counters registered in the node's registry, plus bounded
    buffers (recent events, recent latencies) that the dashboard reads. Every hook is O(1)."""

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        # plain lists bumped inline (a prometheus_client Histogram takes a lock per observation,
        # ~2.5 us; this is ~0.5 us), exported by _HookCollector as histograms
        self.requests: dict[tuple[str, str], _Hist] = {}
        self.handled: dict[tuple[str, str], _Hist] = {}
        self.member_events: dict[str, int] = {}
        self.link_events: dict[str, int] = {}
        self.transfer_bytes: dict[tuple[str, str], int] = {}
        self.collectives: dict[tuple[str, str], _Hist] = {}  # (op, outcome)
        self.collective_bytes: dict[str, int] = {}
        self.request_failures = 0
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_EVENTS)
        self.latencies: deque[float] = deque(maxlen=RECENT_LATENCIES)
        registry.register(_HookCollector(self))

    # ---------------------------------------------------------------- hooks
    def request_finished(self, peer: str, service: str, seconds: float, error: str | None) -> None:
        key = (service, "ok" if error is None else _outcome(error))
        h = self.requests.get(key)
        if h is None:
            h = self.requests[key] = _Hist()
        h.observe(seconds)
        self.latencies.append(seconds)
        if error is not None and error != "cancelled":
            self.request_failures += 1
            self.recent.append(
                {"t": self.clock(), "kind": "request failed", "who": peer, "detail": f"{service}: {error}"}
            )

    def request_handled(self, peer: str, service: str, seconds: float, error: str | None) -> None:
        key = (service, "ok" if error is None else _outcome(error))
        h = self.handled.get(key)
        if h is None:
            h = self.handled[key] = _Hist()
        h.observe(seconds)

    def member_changed(self, name: str, kind: str, previous: str | None, reason: str) -> None:
        self.member_events[kind] = self.member_events.get(kind, 0) + 1
        self.recent.append({"t": self.clock(), "kind": kind, "who": name, "detail": reason})

    def link_event(self, peer: str, event: str, info: dict[str, Any]) -> None:
        self.link_events[event] = self.link_events.get(event, 0) + 1
        if event in ("lost", "dead", "undeliverable"):
            detail = str(info.get("reason", "")) if isinstance(info, dict) else ""
            self.recent.append({"t": self.clock(), "kind": f"link {event}", "who": peer, "detail": detail})

    def collective_finished(self, group: str, op: str, nbytes: int, seconds: float, error: str | None) -> None:
        key = (op, "ok" if error is None else _outcome("cancelled" if error == "CancelledError" else error))
        h = self.collectives.get(key)
        if h is None:
            h = self.collectives[key] = _Hist()
        h.observe(seconds)
        self.collective_bytes[op] = self.collective_bytes.get(op, 0) + nbytes
        if error is not None and error != "CancelledError":
            event = {"t": self.clock(), "kind": "collective failed", "who": group, "detail": f"{op}: {error}"}
            self.recent.append(event)

    def transfer_finished(self, peer: str, direction: str, nbytes: int, seconds: float, path: str) -> None:
        key = (direction, path)
        self.transfer_bytes[key] = self.transfer_bytes.get(key, 0) + nbytes

    # ---------------------------------------------------------------- for the dashboard
    def latency_quantiles(self) -> dict[str, float | None]:
        """p50/p99 of the last RECENT_LATENCIES request latencies (seconds), None before any."""
        if not self.latencies:
            return {"p50": None, "p99": None, "count": 0}
        xs = sorted(self.latencies)
        return {"p50": xs[len(xs) // 2], "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))], "count": len(xs)}


class _Hist:
    """One histogram series: per-bucket counts (not cumulative) and the sum."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, v)] += 1
        self.total += v

    def cumulative(self) -> list[tuple[str, float]]:
        out, acc = [], 0
        for bound, n in zip((*LATENCY_BUCKETS, float("inf")), self.counts, strict=True):
            acc += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), acc))
        return out


def _histogram(
    name: str, doc: str, series: dict[tuple[str, str], _Hist], first: str = "service"
) -> HistogramMetricFamily:
    f = HistogramMetricFamily(name, doc, labels=[first, "outcome"])
    for (key, outcome), h in list(series.items()):
        f.add_metric([key, outcome], h.cumulative(), h.total)
    return f


class _HookCollector:
    """Exports the instrument's plain counters (cheaper to bump in a hook than a labelled Counter)."""

    def __init__(self, inst: MetricsInstrument) -> None:
        self.inst = inst

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        i = self.inst
        yield _histogram(
            "aionet_request_duration_seconds",
            "Requests this node made, from sending to the reply (or failure), by service and outcome.",
            i.requests,
        )
        yield _histogram(
            "aionet_handler_duration_seconds",
            "Requests this node's handlers answered, by service and outcome.",
            i.handled,
        )
        yield _counter(
            "aionet_member_events", "Membership events this node saw, by kind.", "kind", i.member_events.items()
        )
        yield _counter(
            "aionet_link_events", "Link events (connected, lost, dead...), by event.", "event", i.link_events.items()
        )
        f = CounterMetricFamily(
            "aionet_device_transfer_bytes",
            "Device-array bytes moved, by direction and path.",
            labels=["direction", "path"],
        )
        for (d, p), v in i.transfer_bytes.items():
            f.add_metric([d, p], v)
        yield f
        yield _histogram(
            "aionet_collective_duration_seconds",
            "Collective calls on this rank (allreduce, broadcast...), by op and outcome (any group).",
            i.collectives,
            first="op",
        )
        yield _counter(
            "aionet_collective_bytes",
            "Bytes of this rank's collective inputs, by op.",
            "op",
            i.collective_bytes.items(),
        )


def _counter(name: str, doc: str, label: str, items: Any) -> CounterMetricFamily:
    f = CounterMetricFamily(name, doc, labels=[label])
    for k, v in items:
        f.add_metric([k], v)
    return f


def _gauge(name: str, doc: str, value: float | None = None, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value, labels=labels)


class NodeCollector:
    """Reads ``node.stats()`` (and the member table) at scrape time: nothing runs between scrapes."""

    def __init__(self, node: Any) -> None:
        self.node = node

    def describe(self) -> list[Metric]:
        return []  # no collect() at registration: the node may not be started yet

    def collect(self) -> Iterator[Metric]:
        node = self.node
        s = node.stats()
        yield from self._node(s)
        yield from self._peers(s)
        yield from self._members(node.members())
        yield from self._router(s)
        yield from self._membership(s)
        yield from self._scheduler(s)
        yield from self._policy(node)
        yield from self._devices(s)
        yield from self._cache(node.cache.stats())

    # ------------------------------------------------------------------
    @staticmethod
    def _node(s: NodeStats) -> Iterator[Metric]:
        f = GaugeMetricFamily(
            "aionet_node_info", "This node: name, version, protocol (value 1).", labels=["name", "version", "protocol"]
        )
        f.add_metric([s.name, s.version, str(s.protocol)], 1)
        yield f
        yield _gauge("aionet_uptime_seconds", "Seconds since the node started.", s.uptime)
        if (bp := s.busy_poll) is not None:  # node.busy_poll_us not 0: what the polling cost
            yield CounterMetricFamily(
                "aionet_busy_poll_seconds",
                "Seconds the event loop polled after messages instead of sleeping (node.busy_poll_us).",
                value=bp.busy_s,
            )

    @staticmethod
    def _peers(s: NodeStats) -> Iterator[Metric]:
        labels = ["peer", "transport"]
        sent = CounterMetricFamily(
            "aionet_messages_sent", "Sequenced messages sent to a peer (this link's life).", labels=labels
        )
        recv = CounterMetricFamily(
            "aionet_messages_received", "Sequenced messages received from a peer.", labels=labels
        )
        sbytes = CounterMetricFamily("aionet_sent_bytes", "Payload bytes sent to a peer.", labels=labels)
        rbytes = CounterMetricFamily(
            "aionet_received_bytes", "Bytes of the sequenced messages received from a peer.", labels=labels
        )
        replay = CounterMetricFamily(
            "aionet_link_replayed_messages", "Messages replayed after a reconnect.", labels=labels
        )
        undeliv = CounterMetricFamily(
            "aionet_undeliverable_messages", "Messages given up on (peer gone).", labels=labels
        )
        inflight = GaugeMetricFamily(
            "aionet_link_inflight_bytes", "Unacknowledged bytes (the back-pressure window).", labels=labels
        )
        unacked = GaugeMetricFamily(
            "aionet_link_unacked_messages", "Messages sent and not yet acknowledged.", labels=labels
        )
        qsend = GaugeMetricFamily(
            "aionet_link_queued_send_bytes", "Bytes buffered to be written to a peer.", labels=labels
        )
        qrecv = GaugeMetricFamily(
            "aionet_link_queued_recv_bytes", "Bytes read from a peer, not yet taken.", labels=labels
        )
        up = GaugeMetricFamily("aionet_link_connected", "1 while the link to a peer has a connection.", labels=labels)
        for peer, p in s.peers.items():
            transport = p.addresses[0].split("://", 1)[0] if p.addresses else ""
            lv = [peer, transport]
            undeliv.add_metric(lv, p.undeliverable)
            inflight.add_metric(lv, p.inflight_bytes)
            qsend.add_metric(lv, p.queued_send_bytes)
            qrecv.add_metric(lv, p.queued_recv_bytes)
            link = p.link
            up.add_metric(lv, 1 if link is not None and link.connected else 0)
            if link is None:
                continue
            sent.add_metric(lv, max(link.next_seq - 1, 0))
            recv.add_metric(lv, link.recv_seq)
            sbytes.add_metric(lv, link.sent_bytes)
            rbytes.add_metric(lv, link.recv_bytes)
            replay.add_metric(lv, link.replayed)
            unacked.add_metric(lv, link.unacked_messages)
        yield from (sent, recv, sbytes, rbytes, replay, undeliv, inflight, unacked, qsend, qrecv, up)

    @staticmethod
    def _members(members: dict[str, dict[str, Any]]) -> Iterator[Metric]:
        counts = dict.fromkeys(MEMBER_STATES, 0)
        up = GaugeMetricFamily("aionet_member_up", "1 while a member is alive (this node's view).", labels=["member"])
        lag = GaugeMetricFamily(
            "aionet_member_loop_lag_seconds", "A member's event-loop lag, as it reported it.", labels=["member"]
        )
        for name, m in members.items():
            st = str(m.get("state", ""))
            counts[st] = counts.get(st, 0) + 1
            up.add_metric([name], 1 if st == "alive" else 0)
            load = m.get("load") or {}
            if load.get("loop_lag_ms") is not None:
                lag.add_metric([name], float(load["loop_lag_ms"]) / 1000.0)
        f = GaugeMetricFamily("aionet_members", "Members in each state (this node's view).", labels=["state"])
        for st, n in counts.items():
            f.add_metric([st], n)
        yield from (f, up, lag)

    @staticmethod
    def _router(s: NodeStats) -> Iterator[Metric]:
        r = s.router
        mb = GaugeMetricFamily("aionet_mailbox_messages", "Messages waiting in a mailbox.", labels=["channel"])
        mbb = GaugeMetricFamily("aionet_mailbox_bytes", "Bytes waiting in a mailbox.", labels=["channel"])
        for ch, n in r.mailboxes.items():
            mb.add_metric([ch], n)
            mbb.add_metric([ch], r.mailbox_bytes.get(ch, 0))
        yield from (mb, mbb)
        yield _gauge("aionet_pending_requests", "Requests this node sent that await a reply.", r.pending_requests)
        yield _gauge("aionet_running_handlers", "Request handlers running on this node.", r.running_handlers)

    @staticmethod
    def _membership(s: NodeStats) -> Iterator[Metric]:
        m = s.membership
        for name, doc, v in (
            ("aionet_gossip_messages_sent", "Membership messages sent (heartbeats, gossip, probes).", m.sent_msgs),
            ("aionet_gossip_messages_received", "Membership messages received.", m.recv_msgs),
            ("aionet_suspicions", "Members this node suspected.", m.suspicions),
            ("aionet_refutations", "Suspicions of this node it refuted.", m.refutations),
            ("aionet_deaths_declared", "Members this node declared dead.", m.deaths_declared),
            ("aionet_probes_sent", "Indirect probes sent.", m.probes_sent),
        ):
            yield CounterMetricFamily(name, doc, value=v)
        yield _gauge("aionet_heartbeat_max_phi", "Highest phi (suspicion level) over the watched members.", m.max_phi)
        phi = GaugeMetricFamily(
            "aionet_heartbeat_phi", "Phi (suspicion level) of each member this node watches, now.", labels=["member"]
        )
        for name, v in m.phi.items():
            phi.add_metric([name], v)
        rtt = GaugeMetricFamily(
            "aionet_heartbeat_rtt_seconds",
            "Smoothed round trip from a heartbeat to its echo, per watched member (RFC 6298 SRTT).",
            labels=["member"],
        )
        for name, v in m.rtt_s.items():
            rtt.add_metric([name], v)
        yield from (phi, rtt)
        yield _gauge("aionet_loop_lag_seconds", "This node's event-loop lag.", m.loop_lag_ms / 1000.0)
        yield _gauge("aionet_loop_stalled_seconds", "Longest recent event-loop stall.", m.stalled_s)

    @staticmethod
    def _scheduler(s: NodeStats) -> Iterator[Metric]:
        o, w = s.scheduler.owner, s.scheduler.worker
        f = CounterMetricFamily(
            "aionet_tasks_owned_outcomes", "Tasks submitted from this node, by outcome.", labels=["outcome"]
        )
        for k in (
            "submitted",
            "completed",
            "failed",
            "cancelled",
            "resubmitted",
            "moved",
            "rejected",
            "reconciled_lost",
        ):
            f.add_metric([k], getattr(o, k))
        yield f
        f = CounterMetricFamily("aionet_task_attempts", "Task attempts on this node, by outcome.", labels=["outcome"])
        for k in (
            "accepted",
            "ran",
            "errors",
            "rejected",
            "refused",
            "stolen_in",
            "stolen_out",
            "preempted",
            "cancelled",
        ):
            f.add_metric([k], getattr(w, k))
        yield f
        f = GaugeMetricFamily("aionet_tasks", "Tasks on this node now, by state.", labels=["state"])
        f.add_metric(["owned"], o.owned)
        f.add_metric(["ready"], o.ready)
        f.add_metric(["queued"], w.queued)
        f.add_metric(["running"], w.running)
        f.add_metric(["results_held"], w.held_results)
        yield f
        tot = GaugeMetricFamily("aionet_resources", "Resources this node offers to tasks.", labels=["resource"])
        free = GaugeMetricFamily("aionet_resources_free", "Resources not taken by running tasks.", labels=["resource"])
        for k, v in w.total.items():
            tot.add_metric([k], v)
            free.add_metric([k], w.free.get(k, 0.0))
        yield from (tot, free)

    @staticmethod
    def _policy(node: Any) -> Iterator[Metric]:
        """The placement policy this node's tasks are placed by (join on it to see task counts by policy)."""
        policy = getattr(getattr(getattr(node, "config", None), "scheduler", None), "policy", None)
        if policy is not None:
            f = GaugeMetricFamily(
                "aionet_scheduler_policy_info", "The placement policy of this node (value 1).", labels=["policy"]
            )
            f.add_metric([str(policy)], 1)
            yield f

    @staticmethod
    def _devices(s: NodeStats) -> Iterator[Metric]:
        d = s.device
        f = CounterMetricFamily(
            "aionet_device_arrays",
            "Device arrays sent and received, by direction and path.",
            labels=["direction", "path"],
        )
        for lv, v in (
            (["send", "inline"], d.sent_inline),
            (["send", "staged"], d.sent_staged),
            (["send", "device"], d.sent_device_frames),
            (["recv", "inline"], d.received_inline),
            (["recv", "staged"], d.received_staged),
        ):
            f.add_metric(lv, v)
        yield f
        if d.pool is not None:
            p = d.pool
            yield _gauge("aionet_buffer_pool_bytes", "Staging buffer memory allocated.", p.allocated_bytes)
            yield _gauge("aionet_buffer_pool_max_bytes", "Staging buffer pool limit.", p.max_bytes)
            yield _gauge("aionet_buffer_pool_in_use", "Staging buffers on loan.", p.in_use)
            yield CounterMetricFamily("aionet_buffer_pool_acquires", "Staging buffer loans.", value=p.acquires)
            yield CounterMetricFamily("aionet_buffer_pool_waits", "Loans that had to wait for a buffer.", value=p.waits)
        gpus = list((s.devices or {}).get("gpus") or [])
        if gpus:
            total = GaugeMetricFamily("aionet_gpu_memory_total_bytes", "GPU memory.", labels=["gpu"])
            used = GaugeMetricFamily("aionet_gpu_memory_used_bytes", "GPU memory in use.", labels=["gpu"])
            util = GaugeMetricFamily("aionet_gpu_utilization_ratio", "GPU utilisation (0..1).", labels=["gpu"])
            for g in gpus:
                lv = [str(g.get("index", ""))]
                total.add_metric(lv, g.get("memory_total") or 0)
                used.add_metric(lv, g.get("memory_used") or 0)
                if g.get("utilization") is not None:
                    util.add_metric(lv, float(g["utilization"]) / 100.0)
            yield from (total, used, util)

    @staticmethod
    def _cache(c: dict[str, Any]) -> Iterator[Metric]:
        yield _gauge("aionet_cache_entries", "Entries this node's cache shard holds.", c.get("entries", 0))
        yield _gauge("aionet_cache_bytes", "Bytes this node's cache shard holds.", c.get("bytes", 0))
        yield _gauge("aionet_cache_locks_held", "Locks held in this node's shard.", c.get("locks", 0))
        yield CounterMetricFamily(
            "aionet_cache_evictions", "Cache entries evicted for space.", value=c.get("evictions", 0)
        )
        yield CounterMetricFamily("aionet_cache_expirations", "Cache entries expired.", value=c.get("expirations", 0))


class NodeMetrics:
    """The node's registry: scrape-time collector, process metrics and the hook instrument."""

    def __init__(self, node: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(node))
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, cpu seconds...
        self.instrument = MetricsInstrument(self.registry)

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)


__all__ = ["LATENCY_BUCKETS", "MetricsInstrument", "NodeCollector", "NodeMetrics"]
