"""Queues of waiters (futures) that callers wake one at a time, first come first served."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


def wake_first(waiters: deque[asyncio.Future[Any]]) -> bool:
    """Resolve the first waiter still waiting (cancelled ones are dropped on the way);
    False when none was left."""
    while waiters:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(None)
            return True
    return False
