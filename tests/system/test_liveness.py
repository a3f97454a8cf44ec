"""Liveness that a busy event loop cannot fake (issue 13), with real processes and signals.

A node whose loop is blocked by user code (a sync handler sleeping, or one C call holding
the GIL) stays a member: its liveness responder (aionet/membership/liveness.py) answers for
the process, peers mark it ``stalled`` and nobody declares it dead. A process that is gone
or stopped is still seen dead fast: SIGKILL in <= 50 ms (net of the time a loaded machine kept
the observer and the killed process waiting for a CPU, which the kernel counts), SIGSTOP in
<= 1.5 s."""

import asyncio
import contextlib
import os
import signal
import threading
import time

import pytest

from aionet import Node
from aionet.config import Config
from aionet.membership.liveness import Responder
from tests.conftest import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIL_1S = 10**8  # sum(range(GIL_1S)): one C call, ~1.3 s on the development machine


def _serve(spawn, name, join=None, *extra):
    args = ["--name", name, "--listen", "tcp://127.0.0.1:0", "--app", "tests.apps:setup", *extra]
    if join:
        args += ["--join", join]
    return spawn(*args, env={"PYTHONPATH": REPO})


def _cfg(**sections):
    return Config.from_dict(sections, env={})


async def _cluster(spawn):
    """victim and p1 as processes; the caller joins its in-process node t to them."""
    victim, rv = _serve(spawn, "victim")
    p1, _ = _serve(spawn, "p1", rv["addresses"][0])
    return victim, p1, rv["addresses"]


async def _ready(t: Node) -> None:
    def ok():
        m = t.members()
        return all(
            m.get(n, {}).get("state") == "alive" and m[n]["load"].get("extra", {}).get("live") for n in ("victim", "p1")
        )

    await wait_for(ok, 20)


def _cpu_wait(path: str) -> float:
    """Seconds the thread or process at ``path`` (a /proc .../schedstat) has spent runnable
    but waiting for a CPU, as the kernel counts it (0.0 where schedstat is missing)."""
    try:
        with open(path) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class CpuWaits:
    """What a loaded machine, not the detector, spent of a SIGKILL's detection time.

    Two kernel-counted waits for a CPU from the kill on: the killed node's main thread's (its
    teardown: memory unmapped, then the sockets closed, the moment peers can notice) and our
    loop thread's (its reaction, to the dropped connection or to p1's gossip). They may
    overlap in time, so only the larger is taken: never more than one party's wait. The
    killed node's counter is read while it is a zombie (the spawn fixture reaps it only at
    teardown). Both are 0 on an idle machine, and where /proc has no schedstat."""

    def __init__(self, victim_pid: int) -> None:
        self._paths = (f"/proc/{victim_pid}/schedstat", f"/proc/self/task/{threading.get_native_id()}/schedstat")
        self._at = [_cpu_wait(p) for p in self._paths]
        self.lost_at: float | None = None  # when our loop saw the killed node's connection drop

    def lost(self) -> None:
        if self.lost_at is None:
            self.lost_at = time.monotonic()

    def spent(self) -> tuple[float, float]:
        """(the killed node's wait, ours) since the start."""
        victim, ours = (max(_cpu_wait(p) - a, 0.0) for p, a in zip(self._paths, self._at, strict=True))
        return victim, ours


@contextlib.contextmanager
def _ahead_of_background_load(nice: int = -10):
    """Run this thread, and the processes it starts meanwhile (they inherit it), ahead of
    other work on the machine where we may (root or CAP_SYS_NICE; elsewhere nothing changes
    and :class:`CpuWaits` alone accounts for the load). Linux nice is per thread: the loop's."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(PermissionError, OSError):
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)  # lowering one's priority needs no privilege


async def _deaths_seen_by_p1(t: Node) -> int:
    snap = await t.request("p1", "aionet.members", timeout=10)
    assert snap["members"]["victim"]["state"] == "alive"
    return snap["stats"]["deaths_declared"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("how", "amount"),
    # 30 s (six times heartbeat.suspect_timeout) also stands for the 5 s sleep this list once had
    # (both outlast a suspicion, so both go through the same verification: the responder reports
    # a stalled loop) and for the separate 30 s test, whose checks are all made here
    [("sleep", 1.0), pytest.param("sleep", 30.0, marks=pytest.mark.slow), ("gil", 3 * GIL_1S)],
)
async def test_a_loop_blocked_by_user_code_is_stalled_not_dead(spawn, how, amount):
    _victim, _p1, seeds = await _cluster(spawn)
    async with Node(name="t", listen="tcp://127.0.0.1:0", join=seeds) as t:
        await _ready(t)
        inc = t.members()["victim"]["incarnation"]
        events = t.member_events()
        block = asyncio.ensure_future(t.request("victim", "test.block", [how, amount], timeout=90))
        await asyncio.sleep(0.2)  # its loop is blocked now: tasks sent to it wait, then run
        tasks = [t.submit("tests.tasks_fns:inc", i, affinity="victim") for i in range(5)]
        took = await block
        assert how == "gil" or took >= amount
        assert await asyncio.wait_for(t.gather(tasks), 60) == [1, 2, 3, 4, 5]
        await asyncio.sleep(1.0)  # let late verdicts, if any, arrive
        kinds = []
        while True:
            try:
                ev = await events.get(timeout=0.2)
            except TimeoutError:
                break
            if ev.name == "victim":
                kinds.append(ev.kind)
        assert "dead" not in kinds, kinds
        assert t.members()["victim"]["state"] == "alive"
        assert t.members()["victim"]["incarnation"] == inc  # never refuted: never declared dead
        assert await _deaths_seen_by_p1(t) == 0
        if took >= 3:
            assert "stalled" in kinds and kinds[-1] != "stalled", kinds  # flagged, then resumed
        assert await t.request("victim", "test.pid", timeout=10)


@pytest.mark.timeout(120)
async def test_a_loop_blocked_longer_than_max_loop_stall_is_dead(spawn):
    _victim, _p1, seeds = await _cluster(spawn)
    cfg = _cfg(heartbeat={"max_loop_stall": 1.0})
    async with Node(name="t", listen="tcp://127.0.0.1:0", join=seeds, config=cfg) as t:
        await _ready(t)
        call = asyncio.ensure_future(t.request("victim", "test.block", ["sleep", 6.0], timeout=30))
        try:
            await t.membership.wait_for("victim", "dead", timeout=20)
        finally:
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
        assert "max_loop_stall" in t._peers["victim"].link.dead.args[0]
        await t.membership.wait_for("victim", "alive", timeout=30)  # it refutes once it runs again


@pytest.mark.timeout(120)
async def test_sigkill_is_seen_within_50_ms_and_sigstop_within_1_5_s(spawn):
    with _ahead_of_background_load():
        await _sigkill_and_sigstop(spawn)


async def _sigkill_and_sigstop(spawn) -> None:
    victim, _p1, seeds = await _cluster(spawn)
    async with Node(name="t", listen="tcp://127.0.0.1:0", join=seeds) as t:
        await _ready(t)
        os.kill(victim.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            await t.membership.wait_for("victim", "dead", timeout=20)
            stopped_after = time.monotonic() - t0
        finally:
            os.kill(victim.pid, signal.SIGCONT)
        await t.membership.wait_for("victim", "alive", timeout=30)
        await wait_for(lambda: t.members()["victim"]["load"].get("extra", {}).get("live"), 20)
        waits = CpuWaits(victim.pid)
        t.on_connection_event(lambda peer, ev, _d: peer == "victim" and ev == "lost" and waits.lost())
        os.kill(victim.pid, signal.SIGKILL)
        t0 = time.monotonic()
        await t.membership.wait_for("victim", "dead", timeout=20)
        killed_after = time.monotonic() - t0
        victim_wait, our_wait = waits.spent()
        assert stopped_after <= 1.5, f"SIGSTOP seen dead after {stopped_after:.3f} s"
        # the promise is 50 ms of the machine's time: a CPU held by other work (a loaded CI
        # runner) delays the kernel's teardown of the killed node and our reaction alike
        net = killed_after - max(victim_wait, our_wait)
        lost = (waits.lost_at - t0) * 1000 if waits.lost_at is not None else float("nan")
        assert net <= 0.05, (
            f"SIGKILL seen dead after {killed_after * 1000:.1f} ms, {net * 1000:.1f} ms net of CPU waits "
            f"(the killed node's {victim_wait * 1000:.1f} ms, ours {our_wait * 1000:.1f} ms); "
            f"its connection dropped at {lost:.1f} ms"
        )

        async def p1_agrees():
            snap = await t.request("p1", "aionet.members", timeout=10)
            return snap["members"]["victim"]["state"] == "dead"

        deadline = time.monotonic() + 10
        while not await p1_agrees():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)


def test_the_responder_leaves_no_tick_file_behind():
    """The sidecar unlinks the shared tick file once both sides map it, so a SIGKILLed node
    leaves nothing in /dev/shm."""

    async def run():
        r = Responder("127.0.0.1", "127.0.0.1", None)
        path = r.tick.path
        try:
            await r.start()
            assert r.port > 0
            for _ in range(200):
                if not os.path.exists(path):
                    break
                await asyncio.sleep(0.01)
            assert not os.path.exists(path)
            r.tick.stamp()  # the node's mapping still works
        finally:
            await r.stop()

    asyncio.run(run())


def test_the_responder_answers_only_full_size_pings():
    """A short datagram (what a reflection attack would send) gets no answer; a padded one does."""
    import socket

    from aionet.membership import responder_main

    async def run():
        r = Responder("127.0.0.1", "127.0.0.1", None)
        await r.start()
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.settimeout(0.5)
                s.sendto(responder_main.PING + b"n" * 8, ("127.0.0.1", r.port))
                with pytest.raises(TimeoutError):
                    s.recvfrom(64)
                s.settimeout(5)
                s.sendto((responder_main.PING + b"n" * 8).ljust(responder_main.PING_SIZE, b"\0"), ("127.0.0.1", r.port))
                data, _ = s.recvfrom(64)
                assert len(data) == responder_main.PING_SIZE and data[4:12] == b"n" * 8
        finally:
            await r.stop()

    asyncio.run(run())
