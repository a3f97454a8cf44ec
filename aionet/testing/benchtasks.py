"""Task functions for ``aionet bench tasks``: a no-op and a 10 ms sleep. The one aionet module a
node may run tasks from (when its config allows it): nothing here runs commands or takes code."""

from __future__ import annotations

import time
from typing import Any


def noop(x: Any = None) -> Any:
    return x


def sleep10(x: Any = None) -> Any:
    time.sleep(0.01)
    return x
