"""The app every node of tests/system/test_multihost.py runs (``--app tests.multihost_app:setup``).

The test runs in the host's network namespace and cannot reach the nodes, so they report
through files: ``<MULTIHOST_DIR>/<name>.json``, rewritten atomically every 0.1 s. Environment:

* ``MULTIHOST_DIR``: that directory; the test creates ``stop`` there to end the streams;
* ``MULTIHOST_STREAMERS``: comma-separated names that stream to each other (every ordered
  pair): ``seq`` 1, 2, 3... on channel ``mh.seq``; a message counts as sent when ``send``
  returned, and receivers count, per sender, what arrived in order, duplicates and gaps;
* ``MULTIHOST_DRIVER``: the node that submits tasks (``where`` below: one pinned to each node,
  then a batch placed by the scheduler) once it sees ``MULTIHOST_WORLD`` workers, and then
  calls ``mh.echo`` on every other node in a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import aionet

SEND_INTERVAL = 0.01  # s between messages on each stream
REQUEST_INTERVAL = 0.1  # s between rounds of requests
REQUEST_TIMEOUT = 1.0  # s; a request to the partitioned node fails, the others must not


def where() -> str:
    """A task: the name of the node that ran it."""
    time.sleep(0.05)  # long enough that a batch spreads over the workers
    return aionet.task_context().node.name  # ctx.node is the Node that runs the task


def setup(node: Any) -> None:
    out = Path(os.environ["MULTIHOST_DIR"])
    streamers = [s for s in os.environ.get("MULTIHOST_STREAMERS", "").split(",") if s]
    driver = os.environ.get("MULTIHOST_DRIVER", "")
    world = int(os.environ.get("MULTIHOST_WORLD", "0"))
    peers = [s for s in streamers if s != node.name] if node.name in streamers else []
    status: dict[str, Any] = {
        "name": node.name,
        "sent": dict.fromkeys(peers, 0),  # per receiver: highest seq whose send returned
        "send_errors": [],
        "received": dict.fromkeys(peers, 0),  # per sender: highest seq delivered in order
        "duplicates": 0,
        "gaps": [],
        "events": [],
        "members": {},
        "pinned": None,  # driver: node -> who ran the task pinned there (affinity)
        "task_nodes": None,  # driver: which nodes ran the batch of unpinned tasks
        "task_error": None,
        "echo_ok": {},  # driver: per node, requests answered correctly
        "echo_errors": {},  # driver: per node, requests that failed
        "stopped": False,
    }

    node.on_member_change(lambda ev: status["events"].append([time.time(), ev.name, ev.kind, ev.reason]))

    @node.service("mh.echo")
    def echo(x: Any) -> Any:
        return [node.name, x]

    async def report() -> None:
        path, tmp = out / f"{node.name}.json", out / f".{node.name}.json.tmp"
        while True:
            with contextlib.suppress(Exception):  # not started yet
                status["members"] = {n: m["state"] for n, m in node.members().items()}
                status["deaths_declared"] = node.membership.stats().deaths_declared
                status["workers"] = sorted(n for n, v in node.scheduler.owner.views.items() if v.total)
            tmp.write_text(json.dumps(status))
            tmp.replace(path)
            await asyncio.sleep(0.1)

    async def alive(names: list[str]) -> None:
        while not all(node.members().get(n, {}).get("state") == "alive" for n in names):
            await asyncio.sleep(0.05)

    async def produce(peer: str) -> None:
        await alive([peer])
        seq = 0
        while not (out / "stop").exists():
            seq += 1
            try:
                await node.send(peer, "mh.seq", [node.name, seq])
            except Exception as exc:  # reported: the test fails on any
                status["send_errors"].append(f"{peer} {seq}: {exc!r}")
                return
            status["sent"][peer] = seq
            await asyncio.sleep(SEND_INTERVAL)
        status["stopped"] = True

    async def consume() -> None:
        while True:
            sender, seq = await node.recv("mh.seq")
            last = status["received"].get(sender, 0)
            if seq == last + 1:
                status["received"][sender] = seq
            elif seq <= last:
                status["duplicates"] += 1
            else:
                status["gaps"].append([sender, last, seq])
                status["received"][sender] = seq

    async def drive() -> None:
        # every worker's resources known (no public wait for this yet: issue 17 item 8); a task
        # submitted before then may be refused as Unschedulable by a node that offers nothing yet
        while sum(bool(v.total) for v in node.scheduler.owner.views.values()) < world:
            await asyncio.sleep(0.05)
        try:
            names = sorted(node.members())
            pinned = [node.submit("tests.multihost_app:where", affinity=n) for n in names]
            spread = [node.submit("tests.multihost_app:where", policy="round-robin") for _ in range(4 * world)]
            status["pinned"] = dict(zip(names, await asyncio.wait_for(node.gather(pinned), 30), strict=True))
            status["task_nodes"] = sorted(set(await asyncio.wait_for(node.gather(spread), 30)))
        except Exception as exc:
            status["task_error"] = repr(exc)
        others = [n for n in node.members() if n != node.name]
        i = 0
        while not (out / "stop").exists():
            i += 1
            for peer in others:
                try:
                    got = await node.request(peer, "mh.echo", i, timeout=REQUEST_TIMEOUT)
                    ok = got == [peer, i]
                except Exception:
                    ok = False
                key = "echo_ok" if ok else "echo_errors"
                status[key][peer] = status[key].get(peer, 0) + 1
            await asyncio.sleep(REQUEST_INTERVAL)

    loops = [report(), consume(), *(produce(p) for p in peers)]
    if node.name == driver:
        loops.append(drive())
    # the node cancels nothing of ours: keep the tasks referenced for the process's life
    node._multihost_tasks = [asyncio.get_running_loop().create_task(c) for c in loops]
