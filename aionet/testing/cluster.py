"""An in-process cluster for tests: N nodes started, joined, and known alive by each other.

::

    import aionet.testing

    async with aionet.testing.cluster(n=3, transport="inproc") as nodes:
        await nodes[0].request(nodes[1].name, "aionet.echo", "hi")

``transport`` is ``"inproc"`` (``inproc://``, same event loop, no sockets), ``"tcp"``
(``tcp://127.0.0.1:0``) or any listen URL. The nodes are named ``n0``, ``n1``, ...; every
node after the first joins through ``n0``. Entering returns once every node sees every other
as alive, waiting on membership events rather than sleeping (``asyncio.TimeoutError`` after
``timeout`` seconds); leaving stops them all, the last started first. ``config`` holds extra
config sections for every node, e.g. ``{"heartbeat": {"interval": 0.1}}``; ``AIONET_*``
environment variables are not applied, so a test sees the same cluster everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ..config import Config
from ..node import Node

_LISTEN = {"inproc": "inproc://", "tcp": "tcp://127.0.0.1:0"}


def _all_alive(nodes: list[Node]) -> bool:
    names = {n.name for n in nodes}
    for n in nodes:
        members = n.members()
        if not names <= set(members) or any(members[x]["state"] != "alive" for x in names):
            return False
    return True


@contextlib.asynccontextmanager
async def cluster(
    n: int = 3,
    transport: str = "inproc",
    *,
    config: Mapping[str, Any] | None = None,
    prefix: str = "n",
    timeout: float = 15.0,
) -> AsyncIterator[list[Node]]:
    """Start ``n`` joined nodes; see the module docstring."""
    if n < 1:
        raise ValueError("a cluster needs at least one node")
    listen = transport if "://" in transport else _LISTEN.get(transport)
    if listen is None:
        raise ValueError(f"transport must be 'inproc', 'tcp' or a listen URL, not {transport!r}")
    nodes: list[Node] = []
    changed = asyncio.Event()
    unsubscribe = []
    try:
        for i in range(n):
            cfg = Config.from_dict({k: dict(v) for k, v in (config or {}).items()}, env={})
            join = [nodes[0].address] if nodes else None
            node = Node(name=f"{prefix}{i}", listen=listen, join=join, config=cfg)
            unsubscribe.append(node.on_member_change(lambda _ev: changed.set()))
            nodes.append(node)
            await node.start()
        async with asyncio.timeout(timeout):
            while True:
                changed.clear()
                if _all_alive(nodes):
                    break
                await changed.wait()
        for off in unsubscribe:
            off()
        unsubscribe.clear()
        yield nodes
    finally:
        for off in unsubscribe:
            off()
        for node in reversed(nodes):
            await node.stop()


__all__ = ["cluster"]
