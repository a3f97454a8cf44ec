"""A wrong death verdict loses nothing silently (issue 13).

A node that declares a live peer dead keeps what the peer had not acknowledged for
``link.death_grace`` seconds; when the peer comes back as the same process, the stream
continues and those messages are replayed in order, exactly once. Whatever is given up
(grace expired, the peer restarted) is reported with its exact count: an "undeliverable"
connection event, a counter in ``node.info()`` and one warning line."""

import asyncio
import os
import signal

import pytest

from aionet import Node, PeerUnavailable
from aionet.config import Config
from tests.conftest import wait_for


def _cfg(**sections):
    return Config.from_dict(sections, env={})


def _unacked(node: Node, peer: str) -> int:
    return node.info()["peers"][peer]["link"]["unacked_messages"]


async def _send_burst(a: Node, start: int, n: int, sent: list[int]) -> None:
    for i in range(start, start + n):
        try:
            await a.send("b", "ch", i)
            sent.append(i)
        except PeerUnavailable:
            pass


async def _collect(b: Node, want: int, got: list, timeout: float = 20) -> None:
    async def run():
        while want not in got:
            got.extend(await b.recv_batch("ch"))

    await asyncio.wait_for(run(), timeout)


@pytest.mark.timeout(60)
async def test_refuted_death_replays_what_was_unacknowledged_in_order_once():
    """a declares b dead while messages to b are unacknowledged; b is alive, reconnects,
    and gets every message whose send returned: none lost, none twice, in order."""
    cfg = _cfg(link={"give_up_after": 20})
    async with Node(name="a", config=cfg) as a, Node(name="b", join=[a.address], config=cfg) as b:
        events: list[tuple[str, str, dict]] = []
        a.on_connection_event(lambda p, e, d: events.append((p, e, d)))
        sent: list[int] = []
        await _send_burst(a, 0, 3000, sent)
        kept = _unacked(a, "b")
        a.declare_dead("b", "test: a wrong verdict")
        assert kept > 0, "the scenario needs messages in flight at the verdict"
        assert a.info()["peers"]["b"]["state"] == "dead"
        # b is alive: it reconnects; a continues its stream instead of starting a new one
        await wait_for(lambda: a.info()["peers"]["b"]["state"] == "alive", 20)
        await _send_burst(a, 3000, 500, sent)
        got: list = []
        await _collect(b, sent[-1], got)
        assert got == sent, f"lost {len(set(sent) - set(got))}, duplicated {len(got) - len(set(got))}"
        assert not [e for e in events if e[1] == "undeliverable"]
        assert a.info()["peers"]["b"]["undeliverable"] == 0


# ------------------------------------------------------------------ real processes
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _serve(spawn, name, join=None, *extra):
    args = ["--name", name, "--listen", "tcp://127.0.0.1:0", "--app", "tests.apps:setup", *extra]
    if join:
        args += ["--join", join]
    return spawn(*args, env={"PYTHONPATH": REPO})


async def _stream(t: Node, stop: asyncio.Event, sent: list[int], failed: list[int]) -> None:
    i = 0
    while not stop.is_set():
        try:
            await t.send("victim", "ch", i)
            sent.append(i)
        except PeerUnavailable:
            failed.append(i)
        i += 1
        if i % 20 == 0:
            await asyncio.sleep(0.001)


@pytest.mark.timeout(90)
async def test_frozen_process_declared_dead_then_back_loses_nothing(spawn):
    """The issue's case: a peer frozen for 3 s is declared dead, then resumes. Every
    message whose send returned arrives once, in order; none is reported lost."""
    victim, rv = _serve(spawn, "victim")
    async with Node(name="t", listen="tcp://127.0.0.1:0", join=rv["addresses"]) as t:
        events: list[tuple[str, str, dict]] = []
        t.on_connection_event(lambda p, e, d: events.append((p, e, d)))
        await wait_for(lambda: t.members().get("victim", {}).get("state") == "alive", 20)
        stop, sent, failed = asyncio.Event(), [], []
        task = asyncio.create_task(_stream(t, stop, sent, failed))
        try:
            await wait_for(lambda: len(sent) > 200, 10)
            os.kill(victim.pid, signal.SIGSTOP)
            try:
                await t.membership.wait_for("victim", "dead", timeout=20)
                at_death = len(sent)
                await asyncio.sleep(2.0)  # frozen ~3 s in all
            finally:
                os.kill(victim.pid, signal.SIGCONT)
            await t.membership.wait_for("victim", "alive", timeout=30)
            await wait_for(lambda: len(sent) > at_death + 200, 20)
        finally:
            stop.set()
            await task
        got = await t.request("victim", "test.drain", "ch", timeout=20)
        assert len(got) == len(set(got)), f"{len(got) - len(set(got))} duplicates"
        assert got == sent, f"{len(set(sent) - set(got))} of {len(sent)} sent messages lost"
        assert not [e for e in events if e[1] == "undeliverable"]


@pytest.mark.timeout(90)
async def test_a_process_frozen_past_the_grace_gets_the_loss_reported_with_its_count(spawn):
    victim, rv = _serve(spawn, "victim")
    cfg = _cfg(link={"death_grace": 1.0})
    async with Node(name="t", listen="tcp://127.0.0.1:0", join=rv["addresses"], config=cfg) as t:
        lost = asyncio.get_running_loop().create_future()
        kept_at_death: list[int] = []

        def on_event(peer, event, details):
            if event == "dead" and peer == "victim":
                kept_at_death.append(t._peers["victim"].link.keeping)
            if event == "undeliverable" and peer == "victim" and not lost.done():
                lost.set_result(details)

        t.on_connection_event(on_event)
        await wait_for(lambda: t.members().get("victim", {}).get("state") == "alive", 20)
        stop, sent, failed = asyncio.Event(), [], []
        task = asyncio.create_task(_stream(t, stop, sent, failed))
        try:
            await wait_for(lambda: len(sent) > 200, 10)
            os.kill(victim.pid, signal.SIGSTOP)
            try:
                details = await asyncio.wait_for(lost, 20)
            finally:
                os.kill(victim.pid, signal.SIGCONT)
        finally:
            stop.set()
            await task
        assert kept_at_death and kept_at_death[0] > 0
        assert details["messages"] == kept_at_death[0]
        assert "death_grace" in details["reason"]
        assert t.info()["peers"]["victim"]["undeliverable"] == kept_at_death[0]
        # after it comes back, a fresh stream flows
        await t.membership.wait_for("victim", "alive", timeout=30)
        await t.send("victim", "ch2", "after")
        assert await t.request("victim", "test.drain", "ch2", timeout=20) == ["after"]


@pytest.mark.timeout(90)
async def test_a_peer_back_as_a_new_process_gets_the_loss_reported_with_its_count(spawn):
    """The kept stream cannot continue into a restarted peer (a new node id): the count is
    reported at its handshake, and the new process gets a fresh stream."""
    victim, rv = _serve(spawn, "victim")
    async with Node(name="t", listen="tcp://127.0.0.1:0", join=rv["addresses"]) as t:
        events: list[tuple[str, str, dict]] = []
        kept_at_death: list[int] = []

        def on_event(peer, event, details):
            if event == "dead" and peer == "victim":
                kept_at_death.append(t._peers["victim"].link.keeping)
            events.append((peer, event, details))

        t.on_connection_event(on_event)
        await wait_for(lambda: t.members().get("victim", {}).get("state") == "alive", 20)
        stop, sent, failed = asyncio.Event(), [], []
        task = asyncio.create_task(_stream(t, stop, sent, failed))
        try:
            await wait_for(lambda: len(sent) > 200, 10)
            os.kill(victim.pid, signal.SIGSTOP)
            await t.membership.wait_for("victim", "dead", timeout=20)
        finally:
            stop.set()
            await task
        os.kill(victim.pid, signal.SIGKILL)
        # in a thread: the new process joins through t, whose loop must keep running
        await asyncio.to_thread(_serve, spawn, "victim", t.address)
        await wait_for(lambda: any(e[1] == "undeliverable" for e in events), 30)
        (ev,) = [e for e in events if e[1] == "undeliverable"]
        assert kept_at_death[0] > 0 and ev[0] == "victim"
        assert ev[2]["messages"] == kept_at_death[0] and "restarted" in ev[2]["reason"]
        await t.send("victim", "ch", "after")
        assert await t.request("victim", "test.drain", "ch", timeout=20) == ["after"]
