"""docs/observability.md's metric table lists exactly the metrics a node exports: a metric added
without a line, or a line left after a rename, fails here rather than in a user's PromQL."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is not installed (pip install -e .[test])")

from prometheus_client.parser import text_string_to_metric_families

from aionet.observe.metrics import NodeMetrics
from tests.unit.observe.test_grafana import exported
from tests.unit.observe.test_metrics import FakeNode

DOC = Path(__file__).resolve().parents[3] / "docs" / "observability.md"


def exported_metrics() -> set[str]:
    """Metric names as written in the doc: counters with ``_total``, histograms without suffixes."""
    node = FakeNode()
    node.config = SimpleNamespace(scheduler=SimpleNamespace(policy="least-loaded"))  # the policy info series
    text = NodeMetrics(node).exposition().decode()
    names = exported() | {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    return {re.sub(r"_(bucket|sum|count|created)$", "", n) for n in names if n.startswith("aionet_")}


def documented(text: str, known: set[str]) -> tuple[set[str], list[str]]:
    """Names in the first column of the metric table, ``..._suffix`` expanded against the first
    name of its row (the longest prefix that makes a known name), and the cells that expand to none."""
    names, unknown = set(), []
    for row in text.splitlines():
        if not row.startswith("| `aionet_"):
            continue
        cell = row.split("|")[1]
        first, *rest = re.findall(r"`([^`]+)`", cell)
        names.add(first)
        for short in rest:
            if not short.startswith("..."):
                names.add(short)
                continue
            cuts = [first[:i] + short.removeprefix("...") for i in range(len(first), 0, -1)]
            match = next((c for c in cuts if c in known), None)
            if match is None:
                unknown.append(short)
            else:
                names.add(match)
    return names, unknown


def test_the_metric_table_lists_every_exported_metric_and_no_other() -> None:
    known = exported_metrics()
    names, unknown = documented(DOC.read_text(encoding="utf-8"), known)
    assert not unknown, f"these table entries name no exported metric: {unknown}"
    assert not sorted(names - known), f"documented but not exported: {sorted(names - known)}"
    assert not sorted(known - names), f"exported but missing from docs/observability.md: {sorted(known - names)}"
