"""Partitions between network namespaces (issue 11's bar), with a cluster token.

Three `aionet serve` processes x, y, z run in network namespaces this test creates, joined by
veth pairs to a bridge in a fourth namespace (addresses 10.250.0.1-3 exist only there). x
streams sequenced messages to y and calls a service on y (tests/partition_app.py) while
iptables in x's and y's namespaces cut x <-> y: 2 s, 10 s both ways, 10 s one way, and 40 s
(marked slow). z reaches both sides throughout, so its indirect probes prove each side alive
to the other: nobody may be declared dead, and every message whose ``send`` returned arrives
exactly once, in order, after the cut heals.

Needs root and the ``ip`` and ``iptables`` commands (skipped otherwise). Everything it creates
(namespaces, and with them interfaces and rules; the three processes, by PID) is removed in
the fixture's teardown. The namespaces share one module-scoped cluster, so the cuts run in
sequence on one stream (the 40 s one last); the whole file takes about two minutes.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOKEN = "partition-test-token"
SUBNET = "10.250.0"
NODES = {"x": 1, "y": 2, "z": 3}  # name -> host part of its address
PORT = 7700
RECOVER = 60.0  # s allowed to catch up after a cut heals (TCP retransmission backs off)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create network namespaces"),
    pytest.mark.skipif(
        shutil.which("ip") is None or shutil.which("iptables") is None,
        reason="needs the `ip` (iproute2) and `iptables` commands",
    ),
]


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


def _addr(name: str) -> str:
    return f"{SUBNET}.{NODES[name]}"


class Netns:
    """The namespaces and processes of one test cluster; :meth:`close` removes all of it."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.prefix = f"aionet-part-{os.getpid()}"
        self.bridge = f"{self.prefix}-br"
        self.created: list[str] = []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def ns(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def build(self) -> None:
        _sh("ip", "netns", "add", self.bridge)
        self.created.append(self.bridge)
        _sh("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.bridge, "link", "set", "br0", "up")
        for name in NODES:
            ns = self.ns(name)
            _sh("ip", "netns", "add", ns)
            self.created.append(ns)
            # created inside the namespaces: nothing appears in the host's namespace
            _sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"v{name}", "netns", self.bridge)
            _sh("ip", "-n", self.bridge, "link", "set", f"v{name}", "master", "br0", "up")
            _sh("ip", "-n", ns, "addr", "add", f"{_addr(name)}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")

    def start(self, name: str, role: str, join: str | None = None) -> None:
        cmd = ["ip", "netns", "exec", self.ns(name), sys.executable, "-m", "aionet", "serve", "--log-level", "warning"]
        cmd += ["--name", name, "--listen", f"tcp://{_addr(name)}:{PORT}", "--app", "tests.partition_app:setup"]
        if join:
            cmd += ["--join", f"tcp://{_addr(join)}:{PORT}"]
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "AIONET_SECURITY_TOKEN": TOKEN,
            "PARTITION_DIR": str(self.tmp),
            "PARTITION_ROLE": role,
            "PARTITION_PEER": "y",
        }
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=env)
        log.close()
        self.procs[name] = p  # `ip netns exec` execs python: this PID is the node's
        assert p.stdout is not None
        ready, _, _ = select.select([p.stdout], [], [], 30)
        line = p.stdout.readline() if ready else b""
        if not line.startswith(b"ready "):
            raise RuntimeError(f"node {name} did not start: {line!r} {(self.tmp / f'{name}.log').read_text()[-2000:]}")

    def status(self, name: str) -> dict:
        try:
            return json.loads((self.tmp / f"{name}.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def cut(self, both_ways: bool) -> None:
        """Drop x -> y (and y -> x when ``both_ways``) on arrival, inside the receiving
        namespace. Not in OUTPUT: a packet dropped there fails locally and TCP retries it
        every 0.5 s instead of backing off as it does for a packet lost on the way."""
        _sh("ip", "netns", "exec", self.ns("y"), "iptables", "-A", "INPUT", "-s", _addr("x"), "-j", "DROP")
        if both_ways:
            _sh("ip", "netns", "exec", self.ns("x"), "iptables", "-A", "INPUT", "-s", _addr("y"), "-j", "DROP")

    def heal(self) -> None:
        for name in ("x", "y"):
            _sh("ip", "netns", "exec", self.ns(name), "iptables", "-F")

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
            if p.stdout:
                p.stdout.close()
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _wait(predicate, timeout: float, what: str, check=None) -> None:
    """Poll ``predicate``; ``check`` (asserting) runs on every poll, so a broken invariant
    fails at once with its own message rather than as a timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Netns(tmp_path_factory.mktemp("partitions"))
    try:
        c.build()
        c.start("x", "producer")
        c.start("y", "consumer", join="x")
        c.start("z", "observer", join="x")
        _wait(lambda: all(c.status(n).get("members") == dict.fromkeys(NODES, "alive") for n in NODES), 30, "3 members")
        _wait(lambda: c.status("y").get("received", 0) > 100, 30, "the stream to start")
        yield c
    finally:
        c.close()


def _deaths(c: Netns) -> list:
    return [(n, e) for n in NODES for e in c.status(n).get("events", []) if e[2] == "dead"]


def _check_healthy(c: Netns) -> None:
    x, y = c.status("x"), c.status("y")
    assert not _deaths(c), f"deaths declared: {_deaths(c)}"
    assert all(c.status(n)["deaths_declared"] == 0 for n in NODES)
    assert not x["send_errors"] and not x["request_errors"], (x["send_errors"], x["request_errors"])
    assert y["duplicates"] == 0 and y["gaps"] == 0, f"consumer saw duplicates or lost/reordered messages: {y}"


def _partition(c: Netns, seconds: float, both_ways: bool = True) -> None:
    """Cut x <-> y for ``seconds`` while the stream runs, heal, then check nothing whose send
    returned was lost, duplicated or reordered, nobody was declared dead, and the stream and
    the requests flow again."""
    c.cut(both_ways)
    try:
        cut_end = time.monotonic() + seconds
        _wait(lambda: time.monotonic() >= cut_end, seconds + 1, "the cut", check=lambda: _check_healthy(c))
    finally:
        c.heal()
    sent = c.status("x")["sent"]
    reqs = c.status("x")["requests_ok"]
    healed = time.monotonic()
    # every message sent before the heal arrives; new ones and requests flow again
    healthy = lambda: _check_healthy(c)  # noqa: E731
    _wait(lambda: c.status("y")["received"] >= sent + 50, RECOVER, f"y to receive past {sent}", healthy)
    _wait(lambda: c.status("x")["requests_ok"] > reqs + 5, RECOVER, "requests to complete again", healthy)
    _wait(
        lambda: all(c.status(n)["members"] == dict.fromkeys(NODES, "alive") for n in NODES),
        RECOVER,
        "everyone to see everyone alive",
        healthy,
    )
    _check_healthy(c)
    x = c.status("x")
    print(
        f"cut {seconds} s {'both ways' if both_ways else 'one way'}: recovered in {time.monotonic() - healed:.1f} s;"
        f" sent {x['sent']}, requests {x['requests_ok']}, x suspected y {x['suspicions']} times,"
        f" asked others to probe {x['probes_sent']} times"
    )


@pytest.mark.timeout(180)
def test_partitions_of_2s_and_10s_both_ways_and_one_way_lose_nothing_and_kill_nobody(cluster):
    _partition(cluster, 2.0)
    _partition(cluster, 10.0)
    _partition(cluster, 10.0, both_ways=False)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_40s_partition_loses_nothing_and_kills_nobody_when_a_third_node_sees_both(cluster):
    _partition(cluster, 40.0)
    # the end: stop the stream; everything whose send returned was delivered exactly once
    (cluster.tmp / "stop").touch()
    _wait(lambda: cluster.status("x")["stopped"], 10, "the producer to stop")
    sent = cluster.status("x")["sent"]
    _wait(lambda: cluster.status("y")["received"] >= sent, RECOVER, "the last messages")
    assert cluster.status("y")["received"] == sent
    _check_healthy(cluster)
