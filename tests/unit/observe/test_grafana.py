"""deploy/grafana's dashboard queries only metrics aionet exports (a renamed metric breaks this
test, not a user's dashboard)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is not installed (pip install -e .[test])")

from prometheus_client.parser import text_string_to_metric_families

from aionet.observe.metrics import NodeMetrics
from tests.unit.observe.test_metrics import FakeNode

DASHBOARDS = sorted((Path(__file__).resolve().parents[3] / "deploy" / "grafana").glob("*.json"))
PROMQL_WORDS = {"sum", "by", "rate", "increase", "max", "min", "on", "group_left", "histogram_quantile", "le"}


def exported() -> set[str]:
    """Every sample name a node exports, with GPUs, a staging pool and each hook fired once."""
    m = NodeMetrics(FakeNode())
    i = m.instrument
    i.request_finished("p0", "echo", 0.001, None)
    i.request_handled("p0", "echo", 0.001, None)
    i.member_changed("p0", "dead", "alive", "killed")
    i.link_event("p0", "lost", {})
    i.task_changed("a", 1, 0, "f", "queued")
    i.transfer_finished("p0", "send", 10, 0.1, "staged")
    i.collective_finished("g", "allreduce", 4096, 0.002, None)
    return {s.name for fam in text_string_to_metric_families(m.exposition().decode()) for s in fam.samples}


def metric_names(expr: str) -> set[str]:
    """Identifiers outside {label matchers}, (by/on lists) and strings that are metric names."""
    bare = re.sub(r"\{[^}]*\}|\"[^\"]*\"|\[[^\]]*\]", " ", expr)
    bare = re.sub(r"\b(by|on|group_left|without)\s*\([^)]*\)", " ", bare)
    return {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare) if w not in PROMQL_WORDS}


def test_there_is_a_dashboard():
    assert DASHBOARDS, "deploy/grafana/*.json is missing"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_panel_queries_exported_metrics(path: Path):
    names = exported()
    dash = json.loads(path.read_text())
    assert dash["panels"]
    for panel in dash["panels"]:
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        for t in panel["targets"]:
            used = metric_names(t["expr"])
            assert used, f"panel {panel['title']!r}: no metric in {t['expr']!r}"
            missing = used - names
            assert not missing, f"panel {panel['title']!r} queries {sorted(missing)}, which aionet does not export"


def test_the_checker_catches_a_wrong_name():
    assert metric_names('sum by (peer) (rate(aionet_mesages_sent_total{peer="b"}[1m]))') == {
        "aionet_mesages_sent_total"
    }
    assert "aionet_mesages_sent_total" not in exported()


def test_the_dashboard_charts_what_issue_15_lists():
    """Heartbeat RTT and phi, and the collective series, each have a panel (not only exist)."""
    [dash] = [json.loads(p.read_text()) for p in DASHBOARDS if p.name == "aionet-cluster.json"]
    used = {n for panel in dash["panels"] for t in panel["targets"] for n in metric_names(t["expr"])}
    assert {
        "aionet_heartbeat_rtt_seconds",
        "aionet_heartbeat_phi",
        "aionet_collective_duration_seconds_bucket",
        "aionet_collective_duration_seconds_count",
        "aionet_collective_bytes_total",
    } <= used
