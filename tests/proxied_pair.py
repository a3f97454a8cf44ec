"""Two nodes whose one connection runs through a FaultProxy, for tests that stall and cut it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aionet import Node
from aionet.config import Config
from aionet.testing import FaultProxy


@contextlib.asynccontextmanager
async def proxied(cfg_b: Config | None = None) -> AsyncIterator[tuple[Node, Node, FaultProxy]]:
    """``b`` (with ``cfg_b``) dials ``a`` through a proxy that can stall and cut; the link is up
    (one message delivered) when the block starts."""
    a = Node(name="a", listen="tcp://127.0.0.1:0")
    b = Node(name="b", listen="tcp://127.0.0.1:0", config=cfg_b)
    await a.start()
    await b.start()
    pa = FaultProxy.to(a.addresses[0])
    try:
        await pa.start()
        await b.connect(pa.address)
        await b.send("a", "hello", 0)
        await a.recv("hello", timeout=10)
        yield a, b, pa
    finally:
        pa.stall(False)
        await b.stop()
        await a.stop()
        await pa.stop()
