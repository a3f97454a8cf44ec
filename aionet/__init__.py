"""aionet: an asyncio message-passing runtime for heterogeneous clusters."""

from ._version import __version__
from .config import Config
from .errors import (
    AionetError,
    ConfigError,
    ConnectionClosed,
    ConnectTimeout,
    DeviceUnavailable,
    PeerUnavailable,
    ProtocolError,
    RemoteError,
    SerializationError,
    TaskError,
    TransportError,
    TransportUnavailable,
)
from .node import Node
from .runner import run
from .scheduler import TaskRef, task_context

__all__ = [
    "AionetError",
    "Config",
    "ConfigError",
    "ConnectTimeout",
    "ConnectionClosed",
    "DeviceUnavailable",
    "Node",
    "PeerUnavailable",
    "ProtocolError",
    "RemoteError",
    "SerializationError",
    "TaskError",
    "TaskRef",
    "TransportError",
    "TransportUnavailable",
    "__version__",
    "run",
    "task_context",
]
