"""A real etcd server for the cache's tests (Debian package ``etcd-server``; ``.ci/run``
installs it). Started on free ports with its data on /dev/shm when there is one; the tests
that need it skip, saying so, where the binary is missing."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator

import pytest

SKIP_REASON = "etcd is not installed (Debian: apt-get install etcd-server; .ci/run does this as root)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def etcd_server() -> Iterator[str]:
    """Yield ``etcd://127.0.0.1:<port>`` of a fresh single-member etcd; killed (by PID) after."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip(SKIP_REASON)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    data = tempfile.mkdtemp(prefix="aionet-etcd-", dir=base)
    for _attempt in range(3):  # a free port can be taken between choosing and binding it
        cport, pport = _free_port(), _free_port()
        client, peer = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
        proc = subprocess.Popen(
            [binary, "--data-dir", data, "--name", "t", "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", peer,
             "--initial-advertise-peer-urls", peer, "--initial-cluster", f"t={peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 15
        up = False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
                    up = b"true" in r.read()
            except OSError:
                pass
            if up:
                break
            time.sleep(0.05)
        if up:
            break
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        shutil.rmtree(data, ignore_errors=True)
        os.makedirs(data, exist_ok=True)
    else:
        shutil.rmtree(data, ignore_errors=True)
        pytest.skip("etcd is installed but did not start on 127.0.0.1 (see its log by running it by hand)")
    try:
        yield f"etcd://127.0.0.1:{cport}"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        shutil.rmtree(data, ignore_errors=True)
