import asyncio
import os
import signal
import subprocess
import sys

import pytest


def listen_url(scheme: str, tmp_path=None) -> str:
    if scheme == "inproc":
        return "inproc://"
    if scheme == "zmq+ipc":
        import tempfile

        return f"zmq+ipc://{tmp_path or tempfile.gettempdir()}/aionet-{os.urandom(4).hex()}.sock"
    return f"{scheme}://127.0.0.1:0"


@pytest.fixture
def spawn():
    """Start `python -m aionet serve ...` processes; kill exactly those PIDs at the end."""
    procs: list[subprocess.Popen] = []

    def start(*args: str, env: dict | None = None) -> tuple[subprocess.Popen, dict]:
        import json

        p = subprocess.Popen(
            [sys.executable, "-m", "aionet", "serve", "--log-level", "warning", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})},
        )
        procs.append(p)
        line = p.stdout.readline()
        if not line.startswith(b"ready "):
            p.kill()
            raise RuntimeError(f"node did not start: {line!r} {p.stderr.read().decode()[-2000:]}")
        return p, json.loads(line[6:])

    yield start
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)


async def wait_for(predicate, timeout: float = 10.0, interval: float = 0.005):
    """Poll a cheap predicate (for state we cannot await directly), bounded in time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval)
