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
    while True:
        await asyncio.sleep(0.05)
        members = [n for n, m in node.members().items() if m["state"] == "alive" and n != node.name]
        if not members:
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


async def setup(node: Any) -> None:
    node.traffic_task = asyncio.get_running_loop().create_task(_busy(node))  # lives as long as the process
