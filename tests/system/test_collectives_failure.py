"""A member SIGKILLed mid-allreduce (or mid-reduce_scatter, over the native ring): every other
member's pending call raises CollectiveError naming it within 1 s, and after ``shrink()`` the
survivors' next allreduce is correct. Over the group's native ring (its own streams, moved by
compiled code) and over the ring of the links.

Three members live in this process, the victim is an ``aionet serve`` process killed by PID."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import numpy as np
import pytest

from aionet import CollectiveError, Node, PeerUnavailable, RemoteError
from aionet.config import Config
from tests.conftest import wait_for

N_FLOATS = 1 << 20  # 4 MiB: the ring path, several segments in flight at the kill


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("native", "kind"),
    [(True, "allreduce"), (False, "allreduce"), (True, "reduce_scatter")],
    ids=["native ring", "links", "native reduce_scatter"],
)
async def test_sigkill_mid_allreduce_raises_everywhere_within_a_second_then_shrink(
    spawn, native: bool, kind: str
) -> None:
    native_bytes = 1 << 20 if native else 0
    cfg = Config.from_dict({"collectives": {"native_bytes": native_bytes}}, env={})
    async with Node(name="a", listen="tcp://127.0.0.1:0", config=cfg) as a:  # noqa: SIM117  (b, c join a)
        async with (
            Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address], config=cfg) as b,
            Node(name="c", listen="tcp://127.0.0.1:0", join=[a.address], config=cfg) as c,
        ):
            args = ["--name", "v", "--listen", "tcp://127.0.0.1:0", "--join", a.address, "--app", "tests.apps:setup"]
            env = {"AIONET_COLLECTIVES_NATIVE_BYTES": str(native_bytes)}
            victim, _info = await asyncio.to_thread(spawn, *args, env=env)  # spawn reads stdout: not on the loop
            members = ["a", "b", "c", "v"]
            nodes = [a, b, c]
            await wait_for(
                lambda: all(n.members().get(m, {}).get("state") == "alive" for n in nodes for m in members), 20
            )
            loop_call = asyncio.ensure_future(a.request("v", "test.allreduce_loop", [members, N_FLOATS, kind]))
            groups = [n.group(members=members, name="loop") for n in nodes]
            rounds = [0, 0, 0]
            failed: dict[int, tuple[float, CollectiveError]] = {}

            async def run(i: int) -> None:
                x = np.ones(N_FLOATS, dtype=np.float32)
                while True:
                    try:
                        out = await getattr(groups[i], kind)(x)
                    except CollectiveError as exc:
                        failed[i] = (time.monotonic(), exc)
                        return
                    assert out.size == N_FLOATS // (4 if kind == "reduce_scatter" else 1)
                    assert out[0] == 4.0 and out[-1] == 4.0
                    rounds[i] += 1

            runners = [asyncio.ensure_future(run(i)) for i in range(3)]
            await wait_for(lambda: min(rounds) >= 2, 30)
            killed_at = time.monotonic()
            os.kill(victim.pid, signal.SIGKILL)
            await asyncio.wait_for(asyncio.gather(*runners), 10)
            delays = {i: t - killed_at for i, (t, _e) in failed.items()}
            assert set(delays) == {0, 1, 2}
            print("collective error delays after SIGKILL (s):", delays)
            assert max(delays.values()) < 1.0, delays
            assert all(exc.member == "v" and "'v'" in str(exc) for _t, exc in failed.values())
            if native:  # the calls went over the native ring's streams (a reduce_scatter's too)
                assert all(g._native_state is True for g in groups)
            else:
                # the allgather's segments were received straight into the results (a's left is v,
                # killed mid-receive), and the failed calls left no place registered for more
                assert all(n._receive_targets.hits > 0 for n in nodes)
            assert all(n._receive_targets.pending() == 0 for n in nodes)
            with contextlib.suppress(PeerUnavailable, RemoteError):
                await loop_call
            victim.wait(timeout=10)
            # the survivors carry on over a shrunk group once they all see v dead
            await wait_for(lambda: all(n.members()["v"]["state"] == "dead" for n in nodes), 20)
            small = [g.shrink() for g in groups]
            assert [s.members for s in small] == [("a", "b", "c")] * 3
            outs = await asyncio.wait_for(
                asyncio.gather(*(s.allreduce(np.full(1000, s.rank + 1.0)) for s in small)), 20
            )
            assert all(np.array_equal(o, np.full(1000, 6.0)) for o in outs)
