"""Big messages (``BIG_MESSAGE`` bytes or more): the caller may reuse its buffer once
``send`` returns, and they are delivered exactly once with the bytes of the call, across
connection cuts before their ack; with copying on (``link.big_copy_max_bytes``), how far
sends run ahead of acks is bounded; with it off (default), a big send waits for its ack."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np
import pytest

from aionet import Node
from aionet.config import Config
from aionet.core.link import BIG_MESSAGE
from aionet.core.replay_copies import COPY_BUDGET, COPY_MAX
from aionet.errors import ConfigError
from tests.conftest import wait_for
from tests.proxied_pair import proxied

MiB = 2**20


def _copying(**tcp: int) -> Config:
    sections: dict = {"link": {"big_copy_max_bytes": COPY_MAX}}
    if tcp:
        sections["transport"] = {"tcp": tcp}
    return Config.from_dict(sections, env={})


async def _recv_n(node: Node, channel: str, n: int, timeout: float = 30) -> list:
    got: list = []
    async with asyncio.timeout(timeout):
        while len(got) < n:
            got.extend(await node.recv_batch(channel))
    return got


@contextlib.asynccontextmanager
async def flooding(b: Node, arr: np.ndarray, seconds: float = 1.0) -> AsyncIterator[list[int]]:
    """``b`` sends ``arr`` to ``a`` in a loop; yields ``[sends returned]`` once ``seconds`` passed
    with the loop still running (held back), and stops it on exit."""
    done = [0]

    async def flood() -> None:
        while True:
            await b.send("a", "big", arr)
            done[0] += 1

    task = asyncio.ensure_future(flood())
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), seconds)
        assert not task.done()
        yield done
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [BIG_MESSAGE, 3 * MiB, COPY_MAX + MiB], ids=["1MiB", "3MiB", "over-copy-max"])
@pytest.mark.parametrize("copying", [False, True], ids=["ack-paced", "copying"])
async def test_the_buffer_may_be_reused_when_send_returns(size, copying):
    """One array, refilled before every send (the pattern the promise exists for)."""
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0") as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address], config=_copying() if copying else None) as b,
    ):
        arr = np.empty(size, np.uint8)
        n = 12
        reader = asyncio.ensure_future(_recv_n(a, "big", n))
        for i in range(n):
            arr[:] = i
            await b.send("a", "big", arr)
        got = await reader
        assert [int(x[0]) for x in got] == list(range(n))
        assert all(len(x) == size and (x == i).all() for i, x in enumerate(got))


@pytest.mark.timeout(60)
async def test_cut_before_the_ack_delivers_the_original_bytes_exactly_once():
    async with proxied(_copying()) as (a, b, pa):
        link = b._peers["a"].link
        arr = np.empty(MiB, np.uint8)
        pa.stall()  # nothing reaches a, so nothing is acknowledged
        for i in (1, 2, 3):
            arr[:] = i
            await asyncio.wait_for(b.send("a", "big", arr), 10)  # returns before any ack
        arr[:] = 99  # the caller reuses its buffer
        assert len(link.state.unacked) >= 3, "acknowledged already: the test proved nothing"
        pa.cut(reset=True)  # what was in flight is lost with the connection
        pa.stall(False)
        got = await _recv_n(a, "big", 3)
        assert [bytes(np.unique(x)) for x in got] == [b"\x01", b"\x02", b"\x03"]
        await b.send("a", "big", "end")
        assert await a.recv("big", timeout=10) == "end"  # and nothing twice before it


@pytest.mark.timeout(60)
async def test_sends_run_ahead_of_acks_by_at_most_the_copy_budget():
    # a transport buffer large enough that only the copy budget can hold the sender back
    async with proxied(_copying(write_high_water=256 * MiB)) as (a, b, pa):
        link = b._peers["a"].link
        arr = np.ones(MiB, np.uint8)
        pa.stall()
        async with flooding(b, arr) as done:
            # ran ahead by the budget (envelope headers make 8 x 1 MiB just exceed it), then waited
            assert COPY_BUDGET // MiB <= done[0] <= COPY_BUDGET // MiB + 1
            assert link._copies.inflight_bytes <= COPY_BUDGET + 2 * (MiB + 4096)  # + the newest two
            pa.stall(False)
            got = await _recv_n(a, "big", done[0] + 4)
        assert all((x == 1).all() for x in got)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("size", "copying"), [(COPY_MAX + MiB, True), (MiB, False)], ids=["over-copy-max", "default"])
async def test_a_send_not_copied_returns_only_once_acknowledged(size, copying):
    async with proxied(_copying() if copying else None) as (a, b, pa):
        arr = np.full(size, 7, np.uint8)
        pa.stall()
        link = b._peers["a"].link
        before = link.state.next_seq
        task = asyncio.ensure_future(b.send("a", "big", arr))
        await wait_for(lambda: link.state.next_seq > before, 10)  # sequenced and written; a stalled peer acks nothing
        assert not task.done()  # zero-copy: the replay buffer still needs the caller's memory
        pa.stall(False)
        await asyncio.wait_for(task, 20)
        got = await a.recv("big", timeout=20)
        assert len(got) == size and (got == 7).all()


def test_a_negative_copy_bound_is_refused_with_the_fix_named():
    with pytest.raises(ConfigError, match="big_copy_max_bytes must be >= 0"):
        Config.from_dict({"link": {"big_copy_max_bytes": -1}}, env={})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [64 * 1024, 256 * 1024, BIG_MESSAGE - 4096], ids=["64KiB", "256KiB", "under-1MiB"])
async def test_a_buffer_under_a_mib_reused_before_a_cut_is_replayed_as_sent(size):
    """Below BIG_MESSAGE ``send`` returns before the ack; the caller reusing its buffer at
    once must not change what a replay after a cut delivers."""
    async with proxied() as (a, b, pa):
        link = b._peers["a"].link
        arr = np.empty(size, np.uint8)
        pa.stall()
        for i in (1, 2, 3):
            arr[:] = i
            await asyncio.wait_for(b.send("a", "mid", arr), 10)
        arr[:] = 99
        assert len(link.state.unacked) >= 3, "acknowledged already: the test proved nothing"
        pa.cut(reset=True)
        pa.stall(False)
        got = await _recv_n(a, "mid", 3)
        assert [bytes(np.unique(x)) for x in got] == [b"\x01", b"\x02", b"\x03"]


@pytest.mark.timeout(60)
async def test_a_read_only_buffer_under_a_mib_is_not_copied():
    """Immutable payloads (bytes, read-only arrays) stay zero-copy: nothing can change them."""
    async with proxied() as (a, b, pa):
        link = b._peers["a"].link
        arr = np.full(256 * 1024, 5, np.uint8)
        arr.flags.writeable = False
        pa.stall()
        await asyncio.wait_for(b.send("a", "mid", arr), 10)
        frames = link.state.unacked[-1][1]
        assert any(np.shares_memory(np.frombuffer(f, np.uint8), arr) for f in frames[1:])
        pa.stall(False)
        got = await _recv_n(a, "mid", 1)
        assert (got[0] == 5).all()


@pytest.mark.timeout(60)
async def test_a_reply_buffer_changed_after_the_handler_returns_is_replayed_as_returned():
    """A handler's reply goes out without waiting for its ack; the service changing the array
    it returned right after must not change what the caller gets, even across a cut."""
    async with proxied() as (a, b, pa):
        state = np.full(256 * 1024, 1, np.uint8)
        entered, go = asyncio.Event(), asyncio.Event()

        @a.service("state")
        async def get_state(_: object) -> np.ndarray:
            entered.set()
            await go.wait()
            asyncio.get_running_loop().call_soon(state.fill, 99)  # the service moves on at once
            return state

        link = a._peers["b"].link
        call = asyncio.ensure_future(b.request("a", "state", None, timeout=30))
        await asyncio.wait_for(entered.wait(), 10)
        pa.stall()
        before = link.state.next_seq
        go.set()
        await wait_for(lambda: link.state.next_seq > before and (state == 99).all(), 10)
        pa.cut(reset=True)
        pa.stall(False)
        got = await asyncio.wait_for(call, 30)
        assert (got == 1).all()


@pytest.mark.timeout(60)
async def test_over_inproc_a_reused_buffer_under_a_mib_arrives_as_sent():
    """The copy a send makes (a recycled link-owned buffer from 64 KiB) is a frame every
    transport carries: inproc:// hands it to the receiver as it is."""
    async with (
        Node(name="a", listen="inproc://bigmsg-a") as a,
        Node(name="b", listen="inproc://bigmsg-b", join=[a.address]) as b,
    ):
        arr = np.empty(256 * 1024, np.uint8)
        for i in range(4):
            arr[:] = i
            await b.send("a", "mid", arr)
        arr[:] = 99
        got = await _recv_n(a, "mid", 4)
        assert [bytes(np.unique(x)) for x in got] == [bytes([i]) for i in range(4)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["read-only array", "bytes"])
async def test_an_immutable_big_send_returns_before_its_ack_and_survives_a_cut(kind):
    """A big payload nobody can change (a read-only array, bytes) need not wait for its ack:
    the replay buffer keeps it by reference. Several run ahead of the ack, and a cut before
    any ack still delivers each exactly once, in order."""
    async with proxied() as (a, b, pa):
        link = b._peers["a"].link
        payloads = []
        for i in (1, 2, 3):
            arr = np.full(2 * MiB, i, np.uint8)
            arr.flags.writeable = False
            payloads.append(arr if kind == "read-only array" else arr.tobytes())
        pa.stall()  # nothing reaches a, so nothing is acknowledged
        for p in payloads:
            await asyncio.wait_for(b.send("a", "big", p), 10)  # returns although unacknowledged
        assert len(link.state.unacked) >= 3, "acknowledged already: the test proved nothing"
        assert link._copies.copies == 0  # and zero-copy: nothing was copied for the replay
        pa.cut(reset=True)
        pa.stall(False)
        got = await _recv_n(a, "big", 3)
        assert [bytes(np.unique(np.frombuffer(x, np.uint8))) for x in got] == [b"\x01", b"\x02", b"\x03"]
        await b.send("a", "big", "end")
        assert await a.recv("big", timeout=10) == "end"  # and nothing twice before it


@pytest.mark.timeout(60)
async def test_immutable_big_sends_are_still_held_back_by_the_transport_bound():
    """Not waiting for acks must not mean unbounded buffering: with the peer stalled, sends of
    a read-only array stop once the transport is above its high-water mark."""
    async with proxied(Config.from_dict({"transport": {"tcp": {"write_high_water": 4 * MiB}}}, env={})) as (a, b, pa):
        conn = b._peers["a"].link.current.conn
        arr = np.ones(MiB, np.uint8)
        arr.flags.writeable = False
        pa.stall()
        async with flooding(b, arr) as done:
            # the kernel's socket buffers (the proxy's too) take some; beyond that the sender waits
            assert 4 <= done[0] <= 64, done
            assert conn.stats().queued_send_bytes <= 4 * MiB + 2 * (MiB + 4096)
            pa.stall(False)
            got = await _recv_n(a, "big", done[0] + 1)
        assert all((x == 1).all() for x in got)


@pytest.mark.timeout(60)
async def test_over_inproc_a_reused_big_buffer_arrives_as_sent():
    """inproc:// hands the receiver the very frame objects; a big writable array must still
    arrive as it was at the call, although the caller refills it once ``send`` returns (the
    messages are taken only after all the sends, so a shared buffer would show the last fill)."""
    async with (
        Node(name="a", listen="inproc://bigmsg-big-a") as a,
        Node(name="b", listen="inproc://bigmsg-big-b", join=[a.address]) as b,
    ):
        arr = np.empty(2 * MiB, np.uint8)
        for i in range(4):
            arr[:] = i
            await b.send("a", "big", arr)
        arr[:] = 99
        got = await _recv_n(a, "big", 4)
        assert [bytes(np.unique(x)) for x in got] == [bytes([i]) for i in range(4)]
        assert not any(np.shares_memory(x, arr) for x in got)
        ro = np.full(2 * MiB, 7, np.uint8)
        ro.flags.writeable = False  # immutable: not copied when sent; the receiver's own writable copy
        await b.send("a", "big", ro)
        (mine,) = await _recv_n(a, "big", 1)
        assert (mine == 7).all() and mine.flags.writeable and not np.shares_memory(mine, ro)
