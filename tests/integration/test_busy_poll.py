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


async def test_busy_polling_is_off_by_default() -> None:
    async with asyncio.timeout(10), Node("a", config=_cfg()) as a:
        assert a.stats().busy_poll is None and a.info()["busy_poll"] is None


@pytest.mark.parametrize("value", [-1.0, 2_000_000.0])
def test_an_out_of_range_window_is_refused_with_the_key_named(value: float) -> None:
    with pytest.raises(ConfigError, match="node.busy_poll_us"):
        Node("a", config=_cfg(busy_poll_us=value))


def test_the_window_can_come_from_the_environment() -> None:
    cfg = Config.from_dict({}, env={"AIONET_NODE_BUSY_POLL_US": "50"})
    assert cfg.node.busy_poll_us == 50.0
