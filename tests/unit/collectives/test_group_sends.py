"""How a group hands its messages to the node: small payloads go out at once (send_nowait, no
task per message: a recursive-doubling round is latency-bound), payloads that travel out of
band keep the awaited send (the call must not return while the transport may still read the
caller's memory), and a link that cannot take a message now falls back to the awaited send."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

from aionet.collectives.group import Group
from aionet.errors import WouldBlock

INLINE_BYTES = 2048  # the codec's oob_min_bytes default: smaller arrays are packed inline


class FakeNet:
    """In-memory messaging between named endpoints, recording which API each message used."""

    def __init__(self) -> None:
        self.queues: dict[tuple[str, str], asyncio.Queue[Any]] = defaultdict(asyncio.Queue)
        self.consumers: dict[tuple[str, str], Any] = {}  # (node, channel) -> fn(sender, obj)
        self.used: list[tuple[str, str]] = []  # (sender, "send" | "send_nowait")
        self.refuse_nowait = 0  # how many send_nowait calls raise WouldBlock first


class FakeMessaging:
    def __init__(self, net: FakeNet, name: str) -> None:
        self.net = net
        self.name = name
        self.node_id = name

    def _deliver(self, peer: str, channel: str, obj: Any) -> None:
        fn = self.net.consumers.get((peer, channel))
        if fn is not None:
            asyncio.get_running_loop().call_soon(fn, self.name, obj)  # as a connection's reader would
        else:
            self.net.queues[peer, channel].put_nowait(obj)

    async def send(self, peer: str, channel: str, obj: Any) -> None:
        self.net.used.append((self.name, "send"))
        self._deliver(peer, channel, obj)

    def send_nowait(self, peer: str, channel: str, obj: Any) -> None:
        if self.net.refuse_nowait:
            self.net.refuse_nowait -= 1
            raise WouldBlock("full")
        self.net.used.append((self.name, "send_nowait"))
        self._deliver(peer, channel, obj)

    def on_channel(self, channel: str, fn: Any) -> None:
        if fn is None:
            self.net.consumers.pop((self.name, channel), None)
        else:
            self.net.consumers[self.name, channel] = fn

    async def recv_batch(self, channel: str, limit: int = 65536) -> list[Any]:
        q = self.net.queues[self.name, channel]
        out = [await q.get()]
        while not q.empty() and len(out) < limit:
            out.append(q.get_nowait())
        return out

    async def request(self, peer: str, service: str, obj: Any = None, timeout: float | None = None) -> Any:
        raise NotImplementedError

    def add_service(self, name: str, fn: Any, *, cancellable: bool = True) -> None:
        pass

    def register_type(self, cls: type, name: str | None = None) -> type:
        return cls


def make_groups(net: FakeNet, n: int) -> list[Group]:
    names = [f"r{i}" for i in range(n)]

    def build(members: list[str], name: str, epoch: int) -> Group:
        raise NotImplementedError

    return [
        Group(
            FakeMessaging(net, m),  # type: ignore[arg-type]
            names,
            "g",
            small_bytes=65536,
            max_ahead_bytes=1 << 30,
            segment_bytes=1 << 20,
            timeout=10.0,
            inline_bytes=INLINE_BYTES,
            alive=lambda _m: True,
            on_close=lambda _g: None,
            factory=build,
        )
        for m in names
    ]


async def allreduce_all(groups: list[Group], xs: list[Any], **kw: Any) -> list[Any]:
    try:
        return await asyncio.wait_for(
            asyncio.gather(*(g.allreduce(x, **kw) for g, x in zip(groups, xs, strict=True))), 10
        )
    finally:
        for g in groups:
            await g.close()


@pytest.mark.parametrize("n", [2, 3, 4])
async def test_small_allreduce_sends_without_tasks(n: int) -> None:
    net = FakeNet()
    groups = make_groups(net, n)
    out = await allreduce_all(groups, [np.array([float(r + 1)]) for r in range(n)])
    assert all(float(o[0]) == n * (n + 1) / 2 for o in out)
    assert net.used and {api for _, api in net.used} == {"send_nowait"}


async def test_out_of_band_payloads_keep_the_awaited_send() -> None:
    net = FakeNet()
    groups = make_groups(net, 2)
    count = INLINE_BYTES // 8 + 1  # just above the inline size
    out = await allreduce_all(groups, [np.ones(count) for _ in range(2)], algorithm="doubling")
    assert all(np.array_equal(o, np.full(count, 2.0)) for o in out)
    assert {api for _, api in net.used} == {"send"}


async def test_a_full_link_falls_back_to_the_awaited_send() -> None:
    net = FakeNet()
    net.refuse_nowait = 1
    groups = make_groups(net, 2)
    out = await allreduce_all(groups, [3, 4])
    assert out == [7, 7]
    assert sorted(api for _, api in net.used) == ["send", "send_nowait"]


@pytest.mark.parametrize("n", [3, 4])
async def test_the_ring_forwards_received_allgather_segments_read_only(n: int) -> None:
    """What the allgather forwards is a received buffer nobody writes: sent read-only, the link
    keeps it by reference and the send waits neither for the kernel nor for the ack. Everything
    else the ring sends is the caller's memory or ``res``, which later steps or the caller
    overwrite: those stay writable, so the link holds the send until the ack."""
    net = FakeNet()
    sent: list[tuple[int, int, bool]] = []  # (phase, step, read-only)
    groups = make_groups(net, n)
    for g in groups:
        send = g._msg.send

        async def recording(peer: str, channel: str, obj: Any, send: Any = send) -> None:
            t, payload = obj[1], obj[3]
            sent.append(((t >> 40) & 0xFF, (t >> 20) & 0xFFFFF, not payload.flags.writeable))
            await send(peer, channel, obj)

        g._msg.send = recording  # type: ignore[method-assign]
    count = 3 * 4096 * n  # out of band, several segments per chunk
    xs = [np.arange(count, dtype=np.float64) * (r + 1) for r in range(n)]
    out = await allreduce_all(groups, xs, algorithm="ring")
    want = np.arange(count, dtype=np.float64) * (n * (n + 1) // 2)
    assert all(np.array_equal(o, want) for o in out)
    forwarded = {ro for phase, step, ro in sent if phase == 5 and step >= 1}
    others = {ro for phase, step, ro in sent if not (phase == 5 and step >= 1)}
    assert forwarded == {True}
    assert others == {False}
