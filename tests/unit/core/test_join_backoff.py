"""Joining's seed backoff on virtual time (``aionet.testing.FakeClock``): the exact pauses
between rounds of seed dials (0.2 s doubling up to 2 s, each jittered down to half), no dial
before a pause is over, the join as soon as a seed answers, and ``node.join_timeout`` kept to
the instant. The dials are stubs: no sockets, no real waiting."""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import pytest

from aionet.config import Config
from aionet.core.connect import Connector
from aionet.errors import PeerUnavailable, TransportError
from aionet.log import get_logger
from aionet.testing import FakeClock

SEED = "tcp://seed.example:7700"
SEED_RNG = 11  # the jitter's seed: the test replays the same draws


class _Seeds:
    """A stub ``Connector.dial``: refused until ``up``, then answered by node "a"."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.up = False
        self.dials: list[float] = []  # virtual time of each dial

    async def dial(self, url: str) -> Any:
        self.dials.append(self.clock())
        if not self.up:
            raise TransportError(f"cannot connect to {url}: Connect call failed")
        return type("Dialed", (), {"peer": "a"})()


def _connector(clock: FakeClock, join_timeout: float = 60.0) -> tuple[Connector, _Seeds]:
    cfg = Config.from_dict({"node": {"name": "b", "join_timeout": join_timeout}}, env={})
    conn = Connector(
        name="b", node_id="b-id", config=cfg, log=get_logger("aionet.test"), token=None, serializer=None,  # type: ignore[arg-type]
        transports=None, device=None, router=None, peers=None, start_reader=None, spawn=None,  # type: ignore[arg-type]
        closing=lambda: False, running=lambda: True, addresses=lambda: ["tcp://127.0.0.1:7701"],
        clock=clock, sleep=clock.sleep, rng=random.Random(SEED_RNG),
    )  # fmt: skip
    seeds = _Seeds(clock)
    conn.dial = seeds.dial  # type: ignore[method-assign]
    return conn, seeds


def _expected_pauses(n: int) -> list[float]:
    """The first ``n`` pauses the node must take: 0.2 s doubling up to 2 s, times its jitter."""
    rng = random.Random(SEED_RNG)
    return [min(0.2 * 2**k, 2.0) * rng.uniform(0.5, 1.0) for k in range(n)]


async def _parked(clock: FakeClock, task: asyncio.Task[Any]) -> None:
    """Let the join task run until it waits on the clock (or ends): yields, no real time."""
    for _ in range(1000):
        if clock.sleepers or task.done():
            return
        await asyncio.sleep(0)  # yield to the join task (not a timed wait)
    raise AssertionError("the join task neither waited on the clock nor ended")


async def test_rounds_of_dials_follow_the_jittered_doubling_backoff_exactly():
    clock = FakeClock()
    conn, seeds = _connector(clock)
    joining = asyncio.ensure_future(conn.join([SEED]))
    want = _expected_pauses(8)  # 0.2, 0.4, 0.8, 1.6, then 2 s each, jittered
    for k, pause in enumerate(want[:7]):
        await _parked(clock, joining)
        assert len(seeds.dials) == k + 1  # one dial per round, none during a pause
        clock.advance(pause * (1 - 1e-9))  # just before the pause is over: still no dial
        await _parked(clock, joining)
        assert len(seeds.dials) == k + 1
        clock.advance(pause * 2e-9)
    await _parked(clock, joining)
    # the dials came right after each pause, and each pause was in its window
    gaps = [later - earlier for earlier, later in itertools.pairwise(seeds.dials)]
    assert gaps == pytest.approx(want[:7], rel=1e-6)
    assert all(min(0.2 * 2**k, 2.0) / 2 <= g <= min(0.2 * 2**k, 2.0) for k, g in enumerate(gaps))
    seeds.up = True  # the seed answers the next round, which comes after the 8th pause
    clock.advance(want[7] * (1 + 1e-9))
    await asyncio.wait_for(joining, 5)
    assert len(seeds.dials) == 9 and seeds.dials[-1] == pytest.approx(sum(want), rel=1e-6)


async def test_join_timeout_cuts_the_last_pause_and_fails_at_the_deadline():
    clock = FakeClock()
    conn, seeds = _connector(clock, join_timeout=1.0)
    joining = asyncio.ensure_future(conn.join([SEED]))
    # dials at 0, then after each pause of the schedule, until the deadline cuts one short
    starts = list(itertools.accumulate(_expected_pauses(6), initial=0.0))
    want = [t for t in starts if t < 1.0] + [1.0]
    for t in want[1:]:
        await _parked(clock, joining)
        assert not joining.done()
        clock.advance(t - clock() + 1e-12)
    await _parked(clock, joining)
    with pytest.raises(PeerUnavailable, match=r"within node.join_timeout=1 s"):
        joining.result()
    assert seeds.dials == pytest.approx(want, abs=1e-9)
