"""Producer / consumer loaded into `aionet serve` by tests/system/test_partitions.py (``--app
tests.partition_app:setup``).

The test runs in another network namespace than the nodes, so it cannot talk to them; the
nodes report through files instead (the mount namespace is shared). Environment:

* ``PARTITION_DIR``: where ``<node name>.json`` (status, rewritten atomically every 0.1 s)
  is written, and where the test creates ``stop`` to end the producer's stream;
* ``PARTITION_ROLE``: ``producer`` (streams to ``PARTITION_PEER`` and issues requests to it),
  ``consumer`` (checks the stream) or anything else (only reports membership events);
* ``PARTITION_PEER``: the consumer's node name, for the producer.

The producer sends ``seq`` 1, 2, 3... on channel ``part`` and counts a message as sent when
``send`` returned; the consumer counts what arrived in order, duplicates and gaps. A separate
loop calls ``part.echo`` one request at a time (no timeout: a request must complete once the
link recovers) and counts correct answers and errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

SEND_INTERVAL = 0.005  # s between messages (~200/s: a steady stream that spares the CPU)
REQUEST_INTERVAL = 0.05  # s between requests


def setup(node: Any) -> None:
    out = Path(os.environ["PARTITION_DIR"])
    role = os.environ.get("PARTITION_ROLE", "")
    peer = os.environ.get("PARTITION_PEER", "")
    status: dict[str, Any] = {
        "name": node.name,
        "role": role,
        "sent": 0,  # producer: messages whose send returned
        "send_errors": [],
        "requests_ok": 0,
        "request_errors": [],
        "received": 0,  # consumer: highest seq delivered in order
        "duplicates": 0,
        "gaps": 0,
        "events": [],
        "members": {},
        "stopped": False,
    }

    def on_event(ev: Any) -> None:
        status["events"].append([time.time(), ev.name, ev.kind, ev.reason])

    node.on_member_change(on_event)

    @node.service("part.echo")
    def echo(x: Any) -> Any:
        return x

    async def report() -> None:
        path, tmp = out / f"{node.name}.json", out / f".{node.name}.json.tmp"
        while True:
            with contextlib.suppress(Exception):  # not started yet
                status["members"] = {n: m["state"] for n, m in node.members().items()}
                stats = node.membership.stats()
                status["deaths_declared"] = stats.deaths_declared
                status["suspicions"] = stats.suspicions
                status["probes_sent"] = stats.probes_sent
            tmp.write_text(json.dumps(status))
            tmp.replace(path)
            await asyncio.sleep(0.1)

    async def wait_for_peer() -> None:
        while not (node.membership._running and node.members().get(peer, {}).get("state") == "alive"):
            await asyncio.sleep(0.05)

    async def produce() -> None:
        await wait_for_peer()
        seq = 0
        while not (out / "stop").exists():
            seq += 1
            try:
                await node.send(peer, "part", seq)
            except Exception as exc:  # counted, reported: the test fails on any
                status["send_errors"].append(f"{seq}: {exc!r}")
                return
            status["sent"] = seq
            await asyncio.sleep(SEND_INTERVAL)
        status["stopped"] = True

    async def request() -> None:
        await wait_for_peer()
        i = 0
        while not (out / "stop").exists():
            i += 1
            try:
                got = await node.request(peer, "part.echo", i)
            except Exception as exc:
                status["request_errors"].append(f"{i}: {exc!r}")
                return
            if got != i:
                status["request_errors"].append(f"{i}: answered {got!r}")
            else:
                status["requests_ok"] = i
            await asyncio.sleep(REQUEST_INTERVAL)

    async def consume() -> None:
        while True:
            seq = await node.recv("part")
            if seq == status["received"] + 1:
                status["received"] = seq
            elif seq <= status["received"]:
                status["duplicates"] += 1
            else:
                status["gaps"] += 1
                status["received"] = seq

    loops = [report()]
    if role == "producer":
        loops += [produce(), request()]
    elif role == "consumer":
        loops.append(consume())
    # the node cancels nothing of ours: keep the tasks referenced for the process's life
    node._partition_tasks = [asyncio.get_running_loop().create_task(c) for c in loops]
