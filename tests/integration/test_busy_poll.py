"""``node.busy_poll_us``: the loop is kept polling after messages, and only for the window."""

from __future__ import annotations

import asyncio

import pytest

from aionet import Node
from aionet.config import Config
from aionet.errors import ConfigError
from tests.conftest import wait_for


def _cfg(**node) -> Config:
    return Config.from_dict({"node": {"listen": ["tcp://127.0.0.1:0"], **node}}, env={})


async def test_requests_and_sends_keep_the_loop_polling_then_it_sleeps_again() -> None:
    async with asyncio.timeout(30):
        async with Node("srv", config=_cfg(busy_poll_us=2000)) as srv:
            srv.add_service("echo", lambda x: x)
            async with Node("cli", join=srv.address, config=_cfg(busy_poll_us=2000)) as cli:
                await cli.wait_members(["srv"], timeout=10)
                for i in range(50):
                    assert await cli.request("srv", "echo", i) == i
                await cli.send("srv", "ch", b"x")
                assert await srv.recv("ch", timeout=10) == b"x"
                c, s = cli.stats().busy_poll, srv.stats().busy_poll
                assert c is not None and s is not None
                assert c.window_us == 2000
                # both sides polled: the client after each request, the server after each read
                assert c.windows >= 1 and c.spins > 0 and s.windows >= 1 and s.spins > 0
                # idle: a window closes 2 ms after the last message (only heartbeats and their
                # acks arrive now, each opening one), so the loop mostly sleeps
                await wait_for(lambda: not cli._busy.active, timeout=5)  # type: ignore[union-attr]
                before = cli.stats().busy_poll
                await asyncio.sleep(0.5)  # the idle interval measured (not a synchronisation)
                after = cli.stats().busy_poll
                assert before is not None and after is not None  # (a window may be open: a heartbeat)
                assert after.busy_s - before.busy_s < 0.1, (before, after)  # polling all along: ~0.5 s
                assert cli.info()["busy_poll"]["windows"] == cli.stats().busy_poll.windows  # type: ignore[union-attr]


async def test_busy_polling_is_on_by_default_and_0_turns_it_off() -> None:
    async with asyncio.timeout(10):
        async with Node("a", config=_cfg()) as a:
            bp = a.stats().busy_poll
            assert bp is not None and bp.window_us == 200.0
        async with Node("b", config=_cfg(busy_poll_us=0)) as b:
            assert b.stats().busy_poll is None and b.info()["busy_poll"] is None


@pytest.mark.parametrize("scheme", ["zmq+tcp", "inproc"])
async def test_no_window_opens_for_transports_that_need_no_wake_up_or_need_the_core(scheme: str) -> None:
    """libzmq's I/O threads need the core a polling loop would take (measured slower on two
    cores); inproc:// hands messages over in the loop, with no wake-up to save."""
    listen = "zmq+tcp://127.0.0.1:0" if scheme == "zmq+tcp" else "inproc://bp-{}"

    def cfg(name: str) -> Config:
        return Config.from_dict({"node": {"listen": [listen.format(name)], "busy_poll_us": 2000}}, env={})

    async with asyncio.timeout(30):
        async with Node("srv", config=cfg("srv")) as srv:
            srv.add_service("echo", lambda x: x)
            async with Node("cli", join=srv.address, config=cfg("cli")) as cli:
                await cli.wait_members(["srv"], timeout=10)
                for i in range(20):
                    assert await cli.request("srv", "echo", i) == i
                await cli.send("srv", "ch", b"x" * 100_000)  # waits for its ack
                assert await srv.recv("ch", timeout=10) == b"x" * 100_000
                c, s = cli.stats().busy_poll, srv.stats().busy_poll
                assert c is not None and s is not None
                assert (c.windows, c.spins, s.windows, s.spins) == (0, 0, 0, 0)


@pytest.mark.parametrize("value", [-1.0, 2_000_000.0])
def test_an_out_of_range_window_is_refused_with_the_key_named(value: float) -> None:
    with pytest.raises(ConfigError, match="node.busy_poll_us"):
        Node("a", config=_cfg(busy_poll_us=value))


def test_the_window_can_come_from_the_environment() -> None:
    cfg = Config.from_dict({}, env={"AIONET_NODE_BUSY_POLL_US": "50"})
    assert cfg.node.busy_poll_us == 50.0


def test_a_window_lasts_its_length_under_uvloop_whose_loop_clock_ticks_in_milliseconds() -> None:
    """uvloop's ``loop.time()`` is libuv's cached millisecond clock: timed by it, a 200 us
    window ran on to the next tick (1-2 ms), and its CPU cost with it (a paced client at
    1,000 requests/s went from 0.2 to 0.8 of a core with a "50 us" window)."""
    uvloop = pytest.importorskip("uvloop")
    from aionet.core.busy_poll import BusyPoll

    async def windows() -> list[float]:
        bp = BusyPoll(asyncio.get_running_loop(), 0.0002)
        lengths = []
        for _ in range(21):
            before = bp.busy_s
            bp.kick()
            async with asyncio.timeout(5):
                while bp.active:  # the window's own callbacks keep the loop turning meanwhile
                    await asyncio.sleep(0)
            lengths.append(bp.busy_s - before)
            await asyncio.sleep(0.003)  # idle between windows, as between paced messages
        return sorted(lengths)

    lengths = uvloop.run(windows())
    # 200 us each plus scheduling noise (the median: a window the OS preempted is an outlier);
    # on the millisecond clock every window measured 1 ms or 2
    assert lengths[10] < 0.0006, f"windows' median {1e6 * lengths[10]:.0f} us, for a 200 us window"
