import asyncio
import contextlib
import gc
import logging
import os
import signal
import subprocess
import sys
import traceback

import pytest
from hypothesis import HealthCheck, settings

# Property tests are bounded by pytest-timeout, not by hypothesis' 200 ms per-example deadline:
# on a loaded 2-core CI box one example of a pure state machine can take longer than that, and
# a DeadlineExceeded there says nothing about the code (tests that want a deadline set their own).
settings.register_profile("aionet", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("aionet")


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
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})},
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


async def wait_for(predicate, timeout: float = 10.0, interval: float = 0.005, describe=None):
    """Poll a cheap predicate (for state we cannot await directly), bounded in time.
    ``describe``: called on a timeout, its text (the state that did not change) goes into
    the failure, for the rare failure that cannot be reproduced at will."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time" + (f": {describe()}" if describe else ""))
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def proxied_pair(config_a=None):
    """Nodes a and b on 127.0.0.1, each advertising a FaultProxy in front of it, b connected to
    a through a's proxy: yields ``(a, b, pa, pb)``; cut or stall the proxies to break the link."""
    from aionet import Node
    from aionet.testing import FaultProxy

    a = Node(name="a", listen="tcp://127.0.0.1:0", config=config_a)
    b = Node(name="b", listen="tcp://127.0.0.1:0")
    await a.start()
    await b.start()
    pa, pb = FaultProxy.to(a.addresses[0]), FaultProxy.to(b.addresses[0])
    try:
        await pa.start()
        await pb.start()
        a.config.node.advertise = pa.address
        b.config.node.advertise = pb.address
        await b.connect(pa.address)
        yield a, b, pa, pb
    finally:
        pa.stop_cutting()
        pb.stop_cutting()
        await b.stop()
        await a.stop()
        await pa.stop()
        await pb.stop()


async def wait_for_async(probe, timeout: float = 10.0, interval: float = 0.05):
    """Like :func:`wait_for` for a condition only a coroutine can check (another process's
    state, asked over the network): ``await probe()`` until it is true, bounded in time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await probe():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval)


# ------------------------------------------------------------------ loop-error guard
# Issue 11 item 16: no "Task exception was never retrieved", "Exception in callback" or other
# error that asyncio's default exception handler reports may pass silently in the suite. That
# handler logs at ERROR on the "asyncio" logger, whatever loop it runs on (pytest-asyncio's
# per-test loops, asyncio.run in sync tests, loops in threads), so one logging handler sees
# them all. A never-retrieved task is reported only when it is garbage collected: the teardown
# hook collects garbage after every fixture of the test is gone, so it is blamed on the test
# that made it. A test that provokes such errors on purpose opts out with
# @pytest.mark.allow_loop_errors.


class _LoopErrorRecords(logging.Handler):
    """Keeps the ERROR records of the ``asyncio`` logger since the current test began."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def describe(self) -> str:
        out = []
        for r in self.records:
            text = r.getMessage()
            if r.exc_info and r.exc_info[1] is not None:
                tb = "".join(traceback.format_exception(*r.exc_info))
                text += "\n" + "\n".join(tb.splitlines()[-25:])
            out.append(text)
        return "\n---\n".join(out)


_LOOP_ERRORS_KEY = pytest.StashKey[_LoopErrorRecords]()


_LAYER_MARKS = {"unit": "unit", "integration": "integration", "conformance": "integration", "system": "system"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by its folder, so ``-m "not system"`` or ``tests/unit`` pick a loop."""
    root = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        rel = os.path.relpath(str(item.path), root).split(os.sep)
        mark = _LAYER_MARKS.get(rel[0]) if len(rel) > 1 else None
        if mark is not None:
            item.add_marker(mark)
        if rel[0] == "system":
            # under pytest-xdist (`-n 2`), the system tests run one at a time on one worker:
            # their network namespaces, signals and latency bounds are not shared with each other
            item.add_marker(pytest.mark.xdist_group("system"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "allow_loop_errors: the test provokes asyncio loop errors on purpose (the guard ignores them)"
    )
    handler = _LoopErrorRecords()
    logging.getLogger("asyncio").addHandler(handler)
    config.stash[_LOOP_ERRORS_KEY] = handler


def pytest_unconfigure(config: pytest.Config) -> None:
    handler = config.stash.get(_LOOP_ERRORS_KEY, None)
    if handler is not None:
        logging.getLogger("asyncio").removeHandler(handler)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    asyncio_logger = logging.getLogger("asyncio")
    if not asyncio_logger.isEnabledFor(logging.ERROR):
        asyncio_logger.setLevel(logging.ERROR)
    return (yield)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what exists once collection is done (imports and test modules, ~800k objects and
    ~0.3-0.7 s per full collection on 2 cores): the full collections below then skip it. No
    test has run yet, so no garbage a test makes is among it, and refcounting frees as before."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    result = yield  # every fixture of the test (its event loop included) is torn down here
    # A full collection costs ~50 ms once the heap is big (more before collection-time objects
    # were frozen, above); coroutine tests get one, the rest
    # a young-generation one (garbage made by the test itself is young), which keeps the
    # unit loop fast without letting an unretrieved task escape its test.
    gc.collect() if item.get_closest_marker("asyncio") is not None else gc.collect(1)
    handler = item.config.stash[_LOOP_ERRORS_KEY]
    records, handler.records = handler.records, []
    if records and item.get_closest_marker("allow_loop_errors") is None:
        handler.records = records
        text = handler.describe()
        handler.records = []
        pytest.fail(
            f"asyncio reported {len(records)} loop error(s) during this test (a task or callback failed "
            f"and nobody retrieved it; mark the test allow_loop_errors only if that is the point):\n{text}",
            pytrace=False,
        )
    return result
