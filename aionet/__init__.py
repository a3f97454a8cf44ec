"""aionet: an asyncio message-passing runtime for heterogeneous clusters."""

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

__version__ = "0.1.0"

from .config import Config
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
