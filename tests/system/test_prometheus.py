"""A real Prometheus server (Debian's `prometheus`) scrapes a 3-process aionet cluster: every
node is an `up` target and a query for aionet's series returns what the cluster is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest

from tests.observe_util import free_port, get, need, serve_cluster

pytestmark = pytest.mark.timeout(90)


def _query(base: str, promql: str) -> list[dict]:
    try:
        status, body, _ = get(f"{base}/api/v1/query?query={urllib.parse.quote(promql)}")
    except OSError:  # not listening yet
        return []
    if status != 200:
        return []
    return json.loads(body)["data"]["result"]


def test_prometheus_scrapes_the_cluster(spawn, tmp_path: Path):
    prometheus = need("prometheus", "prometheus")
    nodes = serve_cluster(spawn, 3)
    targets = [f"127.0.0.1:{port}" for _, port in nodes]
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: aionet\n    static_configs:\n"
        f"      - targets: {json.dumps(targets)}\n"
    )
    web = f"127.0.0.1:{free_port()}"
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            prometheus,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address={web}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://{web}"
    try:
        deadline = time.monotonic() + 45
        alive: list[dict] = []
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            alive = _query(base, 'aionet_members{state="alive",job="aionet"}')
            if len(alive) == 3 and all(float(r["value"][1]) == 3 for r in alive):
                break
            time.sleep(0.5)
        assert len(alive) == 3, f"{alive!r}\n{(tmp_path / 'prometheus.log').read_text()[-2000:]}"
        assert {r["metric"]["instance"] for r in alive} == set(targets)
        up = _query(base, 'up{job="aionet"}')
        assert sorted(float(r["value"][1]) for r in up) == [1.0, 1.0, 1.0]
        sent = _query(base, 'sum by (instance) (aionet_gossip_messages_sent_total{job="aionet"})')
        assert len(sent) == 3 and all(float(r["value"][1]) > 0 for r in sent)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        log.close()
