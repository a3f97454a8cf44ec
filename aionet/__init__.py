"""aionet: an asyncio message-passing runtime for heterogeneous clusters.

``Node``, ``TaskRef`` and ``task_context`` are imported on first use (PEP 562), so that light
users of the package, the command line above all, do not load the transports and services.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .config import Config
from .errors import (
    AionetError,
    CollectiveError,
    ConfigError,
    ConnectionClosed,
    ConnectTimeout,
    DeviceUnavailable,
    NodeClosed,
    PeerUnavailable,
    ProtocolError,
    RemoteError,
    SerializationError,
    TaskError,
    TransportError,
    TransportUnavailable,
    WouldBlock,
)
from .runner import run

if TYPE_CHECKING:
    from .cache import cache_ref
    from .node import Node
    from .scheduler import TaskRef, task, task_context

#: public names loaded on first access -> the module that defines them
_LAZY = {
    "cache_ref": ".cache",
    "Node": ".node",
    "TaskRef": ".scheduler",
    "task": ".scheduler",
    "task_context": ".scheduler",
}

__all__ = [
    "AionetError",
    "CollectiveError",
    "Config",
    "ConfigError",
    "ConnectTimeout",
    "ConnectionClosed",
    "DeviceUnavailable",
    "Node",
    "NodeClosed",
    "PeerUnavailable",
    "ProtocolError",
    "RemoteError",
    "SerializationError",
    "TaskError",
    "TaskRef",
    "TransportError",
    "TransportUnavailable",
    "WouldBlock",
    "__version__",
    "cache_ref",
    "run",
    "task",
    "task_context",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
