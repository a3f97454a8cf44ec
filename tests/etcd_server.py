"""A real etcd server for the cache's tests (Debian package ``etcd-server``; ``.ci/run``
installs it). Started on free ports with its data on /dev/shm when there is one; the tests
that need it skip, saying so, where the binary is missing."""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from typing import IO

import pytest

SKIP_REASON = "etcd is not installed (Debian: apt-get install etcd-server; .ci/run does this as root)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Log:
    """Drains etcd's log (stderr) on a thread for the life of the process, so the pipe never
    fills, and sets ``done`` once etcd says it serves clients or the log ends (it exited)."""

    READY = b"ready to serve client requests"  # etcd 3.4's text log and 3.5's JSON log alike

    def __init__(self, stream: IO[bytes]) -> None:
        self.done = threading.Event()
        self.ready = False
        self.tail: collections.deque[bytes] = collections.deque(maxlen=20)
        threading.Thread(target=self._drain, args=(stream,), name="etcd-log", daemon=True).start()

    def _drain(self, stream: IO[bytes]) -> None:
        with stream:
            for line in stream:
                self.tail.append(line)
                if not self.ready and self.READY in line:
                    self.ready = True
                    self.done.set()
        self.done.set()


def _healthy(client: str) -> bool:
    try:
        with urllib.request.urlopen(f"{client}/health", timeout=5) as r:
            return b"true" in r.read()
    except OSError:
        return False


@contextlib.contextmanager
def etcd_server() -> Iterator[str]:
    """Yield ``etcd://127.0.0.1:<port>`` of a fresh single-member etcd; killed (by PID) after."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip(SKIP_REASON)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    data = tempfile.mkdtemp(prefix="aionet-etcd-", dir=base)
    log: _Log | None = None
    for _attempt in range(3):  # a free port can be taken between choosing and binding it
        cport, pport = _free_port(), _free_port()
        client, peer = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
        proc = subprocess.Popen(
            [binary, "--data-dir", data, "--name", "t", "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", peer,
             "--initial-advertise-peer-urls", peer, "--initial-cluster", f"t={peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert proc.stderr is not None
        log = _Log(proc.stderr)
        # etcd's own word that it serves clients (or its exit), then its health endpoint
        if log.done.wait(timeout=15) and log.ready and _healthy(client):
            break
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        shutil.rmtree(data, ignore_errors=True)
        os.makedirs(data, exist_ok=True)
    else:
        shutil.rmtree(data, ignore_errors=True)
        said = b"".join(log.tail).decode(errors="replace")[-2000:] if log else ""
        pytest.skip(f"etcd is installed but did not start on 127.0.0.1; its last log lines: {said}")
    try:
        yield f"etcd://127.0.0.1:{cport}"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        shutil.rmtree(data, ignore_errors=True)
