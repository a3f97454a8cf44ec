"""Typed statistics and instrument hooks on real nodes over tcp://127.0.0.1:0: each hook fires
where the docs say, with the documented arguments; a broken instrument is removed and the
node carries on; ``node.info()`` is ``node.stats().as_dict()``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from aionet import Node, RemoteError
from aionet.config import Config
from aionet.devices import SimulatedDeviceBackend
from aionet.instrument import Instrument
from aionet.stats import LinkStats, MembershipStats, NodeStats, PeerStats, RouterStats
from tests.conftest import wait_for
from tests.unit.devices.test_staging import CAIArray

LISTEN = "tcp://127.0.0.1:0"
pytestmark = pytest.mark.timeout(30)


class Recorder(Instrument):
    def __init__(self) -> None:
        self.events: dict[str, list[tuple[Any, ...]]] = {}

    def _rec(self, hook: str, *args: Any) -> None:
        self.events.setdefault(hook, []).append(args)

    def request_finished(self, peer: str, service: str, seconds: float, error: str | None) -> None:
        self._rec("request_finished", peer, service, seconds, error)

    def request_handled(self, peer: str, service: str, seconds: float, error: str | None) -> None:
        self._rec("request_handled", peer, service, seconds, error)

    def member_changed(self, name: str, kind: str, previous: str | None, reason: str) -> None:
        self._rec("member_changed", name, kind, previous)

    def link_event(self, peer: str, event: str, info: dict[str, Any]) -> None:
        self._rec("link_event", peer, event)

    def task_changed(self, owner: str, task_id: int, attempt: int, name: str, state: str, device: str) -> None:
        self._rec("task_changed", owner, task_id, state)

    def transfer_finished(self, peer: str, direction: str, nbytes: int, seconds: float, path: str) -> None:
        self._rec("transfer_finished", peer, direction, nbytes, path)


def _services(node: Node) -> None:
    @node.service("boom")
    def boom(_x: Any) -> None:
        raise ValueError("no")

    @node.service("slow")
    async def slow(x: float) -> float:
        await asyncio.sleep(x)
        return x


async def test_request_hooks_on_both_sides() -> None:
    ra, rb = Recorder(), Recorder()
    async with Node(name="a", listen=LISTEN, instruments=[ra]) as a, Node(name="b", listen=LISTEN) as b:
        b.instruments.add(rb)
        _services(b)
        await a.connect(b.address)
        assert await a.request("b", "aionet.echo", 1, timeout=5) == 1
        with pytest.raises(RemoteError):
            await a.request("b", "boom", None, timeout=5)
        assert await a.request("b", "slow", 0.01, timeout=5) == 0.01
        with pytest.raises(TimeoutError):
            await a.request("b", "slow", 2.0, timeout=0.05)
        done = [(p, s, e) for p, s, _t, e in ra.events["request_finished"]]
        assert done == [
            ("b", "aionet.echo", None),
            ("b", "boom", "ValueError"),
            ("b", "slow", None),
            ("b", "slow", "cancelled"),
        ]
        assert all(t >= 0 for *_x, t, _e in ra.events["request_finished"])
        assert ra.events["request_finished"][2][2] >= 0.01  # the slow handler's time is in it
        await wait_for(lambda: len(rb.events.get("request_handled", [])) == 4, 5)
        handled = [(p, s, e) for p, s, _t, e in rb.events["request_handled"]]
        assert handled[:3] == [("a", "aionet.echo", None), ("a", "boom", "ValueError"), ("a", "slow", None)]
        assert handled[3][:2] == ("a", "slow")  # ran to the end although a stopped waiting
        assert ("a", "connected") in rb.events["link_event"] and ("b", "connected") in ra.events["link_event"]


async def test_member_and_link_hooks_see_a_peer_join_and_leave() -> None:
    rec = Recorder()
    async with Node(name="a", listen=LISTEN, instruments=[rec]) as a:
        async with Node(name="b", listen=LISTEN, join=a.address):
            await wait_for(lambda: ("b", "joined", None) in rec.events.get("member_changed", []), 10)
        await wait_for(lambda: any(e[:2] == ("b", "left") for e in rec.events.get("member_changed", [])), 10)
        await wait_for(lambda: ("b", "left") in rec.events.get("link_event", []), 10)


async def test_task_and_transfer_hooks() -> None:
    rec = Recorder()
    cfg = Config.from_dict(
        {"buffers": {"max_bytes": "16MiB", "staging_chunk_bytes": "1MiB"}, "scheduler": {"allow_modules": ["tests"]}},
        env={},
    )
    sim = SimulatedDeviceBackend
    async with (
        Node(name="a", listen=LISTEN, config=cfg, device_backend=sim(), instruments=[rec]) as a,
        Node(name="b", listen=LISTEN, config=cfg, device_backend=sim(), join=a.address) as b,
    ):
        assert await a.submit("tests.tasks_fns:async_add", 1, 2, affinity="a") == 3
        states = [e[2] for e in rec.events["task_changed"]]
        assert states[-3:] == ["queued", "running", "finished"]
        arr = np.arange(3 << 20, dtype=np.uint8)  # 3 MiB: staged in 1 MiB chunks
        await b.send("a", "d", CAIArray(arr))
        await a.recv("d", timeout=10)
        assert ("b", "recv", arr.nbytes, "staged") in rec.events["transfer_finished"]
        await a.send("b", "d", CAIArray(arr))
        await b.recv("d", timeout=10)
        assert ("b", "send", arr.nbytes, "staged") in rec.events["transfer_finished"]


async def test_a_raising_instrument_is_removed_and_requests_go_on() -> None:
    class Broken(Instrument):
        def request_finished(self, *args: Any) -> None:
            raise RuntimeError("exporter bug")

    good, bad = Recorder(), Broken()
    async with Node(name="a", listen=LISTEN, instruments=[bad, good]) as a, Node(name="b", listen=LISTEN) as b:
        await a.connect(b.address)
        with capture_logs() as logs:
            for i in range(3):
                assert await a.request("b", "aionet.echo", i, timeout=5) == i
        assert list(a.instruments) == [good] and len(good.events["request_finished"]) == 3
        assert sum(e["event"].startswith("instrument removed") for e in logs) == 1


async def test_stats_are_typed_and_info_is_their_plain_form() -> None:
    async with Node(name="a", listen=LISTEN) as a, Node(name="b", listen=LISTEN, join=None) as b:
        await a.connect(b.address)
        await a.send("b", "inbox", b"x" * 1000)
        await wait_for(lambda: b.stats().router.mailboxes.get("inbox") == 1, 5)
        st = b.stats()
        assert isinstance(st, NodeStats) and isinstance(st.router, RouterStats)
        assert st.router.mailbox_bytes["inbox"] >= 1000
        peer = a.stats().peers["b"]
        assert isinstance(peer, PeerStats) and isinstance(peer.link, LinkStats)
        assert peer.state == "alive" and peer.link.connected and peer.connections[0].outgoing
        assert st.scheduler.worker.total["cpu"] >= 1 and isinstance(st.membership, MembershipStats)
        info = b.info()
        json.dumps(info)  # plain data
        plain = b.stats().as_dict()
        for d in (info, plain):  # identical but for the clocks that moved in between
            d.pop("uptime")
            d["membership"].pop("loop_lag_ms")
        assert info == plain
        assert info["router"]["mailboxes"]["inbox"] == 1
