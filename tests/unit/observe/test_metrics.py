"""Metric names, values and bounded label sets, from hand-built stats (no node, no sockets)."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is not installed (pip install -e .[test])")

from prometheus_client.parser import text_string_to_metric_families

from aionet.observe.cluster import _dedupe, members_view, summarize
from aionet.observe.metrics import NodeMetrics
from aionet.stats import (
    BufferPoolStats,
    BusyPollStats,
    DeviceTransferStats,
    LinkStats,
    MembershipStats,
    NodeStats,
    OwnerStats,
    PeerStats,
    RouterStats,
    SchedulerStats,
    WorkerStats,
)


def _stats(peers: int = 2) -> NodeStats:
    link = LinkStats(True, None, 100, 2, 11, 9, 7, 0, sent_bytes=640, recv_bytes=448, replayed=3)
    return NodeStats(
        name="a",
        node_id="x",
        pid=1,
        version="0.1.0",
        protocol=2,
        listen=("tcp://127.0.0.1:1",),
        advertise=None,
        transports=("tcp",),
        uptime=12.5,
        peers={f"p{i}": PeerStats("alive", (f"tcp://h{i}:1",), 100, 5, 6, 1, link, ()) for i in range(peers)},
        router=RouterStats(("echo",), {"jobs": 4}, {"jobs": 256}, 1, 2),
        device=DeviceTransferStats(sent_staged=3, pool=BufferPoolStats(9, 2, 7, 0, 1, 4096, 1 << 20, 1, 1, 0, True, 0)),
        membership=MembershipStats(
            10, 0, 9, 1, 0, 0, 2, 0.7, ("p0",), 3.0, 0.01, phi={"p0": 0.4}, rtt_s={"p0": 0.0012}
        ),
        scheduler=SchedulerStats(
            owner=OwnerStats(5, 3, 1, 0, 0, 0, 0, 0, 0, 1, 0, {}),
            worker=WorkerStats(4, 3, 1, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, {"cpu": 2.0}, {"cpu": 1.0}),
            alive=("p0",),
            down=(),
        ),
        devices={"gpus": [{"index": 0, "name": "H100", "memory_total": 80, "memory_used": 8, "utilization": 50.0}]},
        busy_poll=BusyPollStats(50.0, 7, 900, 0.25, False),
    )


class FakeNode:
    def __init__(self, peers: int = 2) -> None:
        self._stats = _stats(peers)
        self.cache = SimpleNamespace(stats=lambda: {"entries": 3, "bytes": 30, "locks": 1, "evictions": 2})

    def stats(self) -> NodeStats:
        return self._stats

    def members(self) -> dict[str, dict[str, Any]]:
        return {
            "a": {"state": "alive", "load": {"loop_lag_ms": 2.0}, "self": True},
            "b": {"state": "dead", "load": {}},
        }


def _scrape(metrics: NodeMetrics) -> dict[str, float]:
    """sample name + sorted labels -> value"""
    out = {}
    for fam in text_string_to_metric_families(metrics.exposition().decode()):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            out[key] = s.value
    return out


def test_values_come_from_stats_in_base_units():
    m = NodeMetrics(FakeNode())
    v = _scrape(m)
    assert v["aionet_messages_sent_total{peer=p0,transport=tcp}"] == 10  # next_seq 11: ten sent
    assert v["aionet_messages_received_total{peer=p1,transport=tcp}"] == 7
    assert v["aionet_sent_bytes_total{peer=p0,transport=tcp}"] == 640
    assert v["aionet_received_bytes_total{peer=p0,transport=tcp}"] == 448
    assert v["aionet_link_replayed_messages_total{peer=p0,transport=tcp}"] == 3
    assert v["aionet_link_inflight_bytes{peer=p0,transport=tcp}"] == 100
    assert v["aionet_members{state=alive}"] == 1 and v["aionet_members{state=dead}"] == 1
    assert v["aionet_member_up{member=b}"] == 0
    assert v["aionet_loop_lag_seconds"] == pytest.approx(0.003)  # stats say ms; Prometheus wants seconds
    assert v["aionet_member_loop_lag_seconds{member=a}"] == pytest.approx(0.002)
    assert v["aionet_mailbox_messages{channel=jobs}"] == 4
    assert v["aionet_tasks{state=queued}"] == 2 and v["aionet_tasks{state=running}"] == 1
    assert v["aionet_tasks_owned_outcomes_total{outcome=failed}"] == 1
    assert v["aionet_gpu_utilization_ratio{gpu=0}"] == 0.5
    assert v["aionet_cache_entries"] == 3
    assert v["aionet_uptime_seconds"] == 12.5
    assert v["aionet_heartbeat_rtt_seconds{member=p0}"] == pytest.approx(0.0012)
    assert v["aionet_heartbeat_phi{member=p0}"] == pytest.approx(0.4)
    assert v["process_resident_memory_bytes"] > 0
    assert v["aionet_busy_poll_seconds_total"] == 0.25


def test_busy_polling_time_is_not_exported_when_it_is_off():
    node = FakeNode()
    node._stats = dataclasses.replace(node._stats, busy_poll=None)
    assert not any(k.startswith("aionet_busy_poll") for k in _scrape(NodeMetrics(node)))


def test_names_follow_prometheus_conventions():
    m = NodeMetrics(FakeNode())
    inst = m.instrument
    inst.request_finished("p0", "echo", 0.001, None)
    inst.member_changed("b", "dead", "alive", "killed")
    for fam in text_string_to_metric_families(m.exposition().decode()):
        assert re.fullmatch(r"(aionet|process|python)_[a-z0-9_]+", fam.name), fam.name
        assert not re.search(r"_(ms|milliseconds|kb|mb|percent)\b", fam.name), f"{fam.name}: use base units"
        if fam.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in fam.samples), fam.name


def test_series_stay_bounded_however_much_work():
    """ray 65029: per-task labels made ~488k series. Here 5000 tasks, requests and events add
    no series beyond the first of each kind."""

    def count(n: int) -> int:
        m = NodeMetrics(FakeNode())
        inst = m.instrument
        for i in range(n):
            inst.task_changed("a", i, 0, f"fn{i}", "queued")
            inst.request_finished(f"p{i % 2}", "echo", i * 1e-4, None if i % 3 else "RemoteError")
            inst.request_handled("p0", "echo", 1e-4, None)
            inst.member_changed(f"p{i % 2}", "suspect", "alive", f"reason {i}")
        return sum(1 for fam in text_string_to_metric_families(m.exposition().decode()) for _ in fam.samples)

    assert count(5000) == count(3)


def test_no_task_hook_so_worker_threads_never_wake_the_loop_for_metrics():
    """A task_changed hook makes each task finishing on a thread cost a call_soon_threadsafe
    (a loop wake-up per task): task states come from stats() instead."""
    from aionet.instrument import Instruments

    m = NodeMetrics(FakeNode())
    assert Instruments([m.instrument]).task_changed is None


def test_instrument_counts_and_keeps_bounded_recent_events():
    m = NodeMetrics(FakeNode())
    inst = m.instrument
    for i in range(1000):
        inst.request_finished("p0", "echo", 0.001 * (i % 10 + 1), "PeerUnavailable" if i % 2 else None)
    inst.request_finished("p0", "echo", 5.0, "cancelled")
    assert len(inst.recent) == 100 and len(inst.latencies) == 512
    q = inst.latency_quantiles()
    assert 0.001 <= q["p50"] <= q["p99"] <= 5.0
    assert inst.request_failures == 500  # a cancellation (timeout) is not counted as a failure
    v = _scrape(m)
    assert v["aionet_request_duration_seconds_count{outcome=ok,service=echo}"] == 500
    assert v["aionet_request_duration_seconds_count{outcome=error,service=echo}"] == 500
    assert v["aionet_request_duration_seconds_count{outcome=cancelled,service=echo}"] == 1
    # buckets are cumulative and "le" includes the bound: the ok ones took 1, 3, 5, 7, 9 ms, 100 each
    assert v["aionet_request_duration_seconds_bucket{le=0.001,outcome=ok,service=echo}"] == 100
    assert v["aionet_request_duration_seconds_bucket{le=0.005,outcome=ok,service=echo}"] == 300
    assert v["aionet_request_duration_seconds_bucket{le=0.01,outcome=ok,service=echo}"] == 500
    assert v["aionet_request_duration_seconds_bucket{le=+Inf,outcome=cancelled,service=echo}"] == 1
    assert v["aionet_request_duration_seconds_sum{outcome=cancelled,service=echo}"] == 5.0


def test_summary_and_member_view_for_the_dashboard():
    node = FakeNode()
    m = NodeMetrics(node)
    m.instrument.member_changed("b", "dead", "alive", "connection reset")
    s = summarize(node.stats().as_dict(), m.instrument)
    assert s["messages_sent"] == 20 and s["bytes_received"] == 896  # summed over both peers
    assert s["tasks"]["queued"] == 2 and s["tasks"]["failed"] == 1
    assert s["events"][-1]["kind"] == "dead" and s["events"][-1]["who"] == "b"
    assert summarize(node.stats().as_dict())["latency"] is None  # a member without an observer
    mv = members_view(node.members())
    assert mv["b"]["state"] == "dead" and mv["a"]["self"] is True


def test_a_death_every_member_reports_is_shown_once():
    seen = [
        {"t": 10.0, "kind": "dead", "who": "c", "detail": "its process is gone", "seen_by": "a"},
        {"t": 10.4, "kind": "dead", "who": "c", "detail": "via a", "seen_by": "b"},
        {"t": 10.5, "kind": "link lost", "who": "c", "detail": "reset", "seen_by": "b"},
        {"t": 30.0, "kind": "dead", "who": "c", "detail": "again, after a restart", "seen_by": "a"},
    ]
    assert [(e["kind"], e["t"]) for e in _dedupe(seen)] == [("dead", 10.0), ("link lost", 10.5), ("dead", 30.0)]


def test_collectives_are_counted_by_op_and_outcome_with_bounded_labels():
    m = NodeMetrics(FakeNode())
    inst = m.instrument
    for g in range(50):  # many groups: no per-group series
        inst.collective_finished(f"group-{g}", "allreduce", 4096, 0.002, None)
    inst.collective_finished("g", "broadcast", 100, 0.5, "CollectiveError")
    inst.collective_finished("g", "broadcast", 100, 0.1, "CancelledError")
    v = _scrape(m)
    assert v["aionet_collective_duration_seconds_count{op=allreduce,outcome=ok}"] == 50
    assert v["aionet_collective_duration_seconds_bucket{le=0.0025,op=allreduce,outcome=ok}"] == 50
    assert v["aionet_collective_duration_seconds_count{op=broadcast,outcome=error}"] == 1
    assert v["aionet_collective_duration_seconds_count{op=broadcast,outcome=cancelled}"] == 1
    assert v["aionet_collective_bytes_total{op=allreduce}"] == 50 * 4096
    assert not any("group-" in k for k in v)
    assert [e["kind"] for e in inst.recent] == ["collective failed"]  # a cancellation is not a failure


def test_the_placement_policy_is_exported():
    node = FakeNode()
    node.config = SimpleNamespace(scheduler=SimpleNamespace(policy="least-loaded"))
    assert _scrape(NodeMetrics(node))["aionet_scheduler_policy_info{policy=least-loaded}"] == 1
