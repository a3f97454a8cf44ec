"""Network-namespace clusters for system tests: `aionet serve` processes, each in its own
network namespace with its own address, joined by veth pairs to a bridge in one more namespace,
and iptables partitions between them (tests/system/test_partitions.py, test_multihost.py).

Names carry the test's PID and a random suffix, so concurrent runs never clash; every interface
is created inside the namespaces (nothing appears in the host's), and :meth:`NetnsCluster.close`
removes the processes it started (by PID) and the namespaces, and with them their interfaces
and rules. Nodes report through files (the mount namespace is shared): the test runs in the
host's network namespace and cannot reach them.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


def skip_reason() -> str | None:
    """Why namespace clusters cannot be built here, or None when they can: needs root, `ip`
    (iproute2) and `iptables`, and a kernel that lets us create a namespace."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None or shutil.which("iptables") is None:
        return "needs the `ip` (iproute2) and `iptables` commands"
    probe = f"aionet-probe-{os.getpid()}-{os.urandom(3).hex()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip() or made.returncode}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def wait(predicate: Callable[[], bool], timeout: float, what: str, check: Callable[[], None] | None = None) -> None:
    """Poll ``predicate`` (node state lives in files); ``check`` (asserting) runs on every poll,
    so a broken invariant fails at once with its own message rather than as a timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


class NetnsCluster:
    """Namespaces ``<prefix>-<name>`` holding ``eth0`` with ``<subnet>.<host>``, bridged in
    ``<prefix>-br``; :meth:`close` removes all of it."""

    def __init__(self, tmp: Path, hosts: dict[str, int], *, subnet: str, tag: str, port: int = 7700):
        self.tmp = tmp
        self.hosts = hosts
        self.subnet = subnet
        self.port = port
        self.prefix = f"aionet-{tag}-{os.getpid()}-{os.urandom(2).hex()}"
        self.bridge = f"{self.prefix}-br"
        self.created: list[str] = []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def ns(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def addr(self, name: str) -> str:
        return f"{self.subnet}.{self.hosts[name]}"

    def url(self, name: str) -> str:
        return f"tcp://{self.addr(name)}:{self.port}"

    def build(self) -> None:
        sh("ip", "netns", "add", self.bridge)
        self.created.append(self.bridge)
        sh("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.bridge, "link", "set", "br0", "up")
        for name in self.hosts:
            ns = self.ns(name)
            sh("ip", "netns", "add", ns)
            self.created.append(ns)
            # created inside the namespaces: nothing appears in the host's namespace
            sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"v{name}", "netns", self.bridge)
            sh("ip", "-n", self.bridge, "link", "set", f"v{name}", "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.addr(name)}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def start(self, name: str, args: list[str], env: dict[str, str], ready_timeout: float = 30) -> None:
        """`aionet serve --name NAME --listen URL ARGS` in NAME's namespace; returns once it
        printed its ready line (its stderr goes to ``<tmp>/<name>.log``)."""
        self.spawn(name, args, env)
        self.wait_ready(name, ready_timeout)

    def spawn(self, name: str, args: list[str], env: dict[str, str], log_level: str = "warning") -> None:
        """Start the node without waiting (nodes whose seeds include each other start together)."""
        cmd = ["ip", "netns", "exec", self.ns(name), sys.executable, "-m", "aionet", "serve", "--log-level", log_level]
        cmd += ["--name", name, "--listen", self.url(name), *args]
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        env = {**os.environ, "PYTHONPATH": str(REPO), **env}
        self.procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=env)
        log.close()  # `ip netns exec` execs python: the PID is the node's

    def wait_ready(self, name: str, timeout: float = 30) -> None:
        p = self.procs[name]
        assert p.stdout is not None
        ready, _, _ = select.select([p.stdout], [], [], timeout)
        line = p.stdout.readline() if ready else b""
        if not line.startswith(b"ready "):
            raise RuntimeError(f"node {name} did not start: {line!r} {self.log(name)}")

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-2000:]

    def status(self, name: str) -> dict[str, Any]:
        """What the node's app last wrote to ``<tmp>/<name>.json`` ({} before the first write)."""
        try:
            return json.loads((self.tmp / f"{name}.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def drop(self, at: str, source: str) -> None:
        """Drop packets from ``source`` on arrival in ``at``'s namespace. Not in OUTPUT: a packet
        dropped there fails locally and TCP retries it every 0.5 s instead of backing off as it
        does for a packet lost on the way."""
        sh("ip", "netns", "exec", self.ns(at), "iptables", "-A", "INPUT", "-s", self.addr(source), "-j", "DROP")

    def isolate(self, name: str) -> None:
        """Cut ``name`` off from every other node, both ways."""
        for other in self.hosts:
            if other != name:
                self.drop(name, other)
                self.drop(other, name)

    def heal(self, *names: str) -> None:
        for name in names or tuple(self.hosts):
            sh("ip", "netns", "exec", self.ns(name), "iptables", "-F")

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
