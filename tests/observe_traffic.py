"""``aionet serve --app tests.observe_traffic:setup``: the node keeps its test cluster busy (echo
requests of varied sizes to every member, short tasks, now and then a failing one) so the
dashboard's charts and task panel have something to show in the browser test's screenshot."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any


async def _busy(node: Any) -> None:
    rnd = random.Random(1)
    i = 0
    changed = asyncio.Event()
    node.on_member_change(lambda _ev: changed.set())  # for as long as the process lives
    while True:
        changed.clear()  # before reading the members, so a change after the read wakes the wait
        members = [n for n, m in node.members().items() if m["state"] == "alive" and n != node.name]
        if not members:
            await changed.wait()  # nobody to keep busy until a member joins (or comes back)
            continue
        for m in members:
            for _ in range(rnd.randint(5, 40)):
                with contextlib.suppress(Exception):
                    await node.request(m, "aionet.echo", b"x" * rnd.choice((64, 1024, 16384)), timeout=2)
        refs = [node.submit("tests.tasks_fns:sleep_ms", j, ms=rnd.choice((1, 5, 20))) for j in range(20)]
        if i % 10 == 0:
            refs.append(node.submit("tests.tasks_fns:boom", "a failing task, for the picture"))
        await node.gather(refs, return_exceptions=True)
        i += 1
        await asyncio.sleep(0.05)  # the scenario, not synchronisation: a steady trickle of rounds for the charts


async def setup(node: Any) -> None:
    node.traffic_task = asyncio.get_running_loop().create_task(_busy(node))  # lives as long as the process
