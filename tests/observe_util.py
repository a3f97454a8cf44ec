"""Helpers for the observability tests: free ports, plain HTTP GETs, the Prometheus/promtool check."""

from __future__ import annotations

import json
import shutil
import socket
import urllib.error
import urllib.request
from typing import Any


def free_port() -> int:
    """A port free on 127.0.0.1 now ([http] port 0 means off, so tests pick one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes, str]:
    """(status, body, content type) of a GET; errors with a status are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type", "")


def get_json(url: str, timeout: float = 5.0) -> Any:
    status, body, _ = get(url, timeout)
    assert status == 200, (url, status, body[:500])
    return json.loads(body)


def need(program: str, package: str) -> str:
    """The program's path, or skip naming the Debian package that has it."""
    import pytest

    path = shutil.which(program)
    if path is None:
        pytest.skip(f"{program} not found: apt-get install {package} (.ci/run does)")
    return path


def serve_cluster(spawn: Any, n: int, interval: float = 0.5, busy: bool = False) -> list[tuple[Any, int]]:
    """``n`` `aionet serve` processes (the conftest ``spawn`` fixture) with [http] on free ports,
    joined to the first: [(process, http port)]. ``busy``: the first keeps the cluster busy
    (tests/observe_traffic.py)."""
    out = []
    seed = None
    for i in range(n):
        port = free_port()
        args = ["--name", f"node-{i}", "--listen", "tcp://127.0.0.1:0"]
        if seed:
            args += ["--join", seed]
        if busy and i == 0:
            args += ["--app", "tests.observe_traffic:setup"]
        env = {"AIONET_HTTP_PORT": str(port), "AIONET_HTTP_INTERVAL": str(interval)}
        if busy:
            env["AIONET_SCHEDULER_ALLOW_MODULES"] = "tests.tasks_fns"
        proc, ready = spawn(*args, env=env)
        seed = seed or ready["addresses"][0]
        out.append((proc, port))
    return out
