"""aionet: an asyncio message-passing runtime for heterogeneous clusters."""

from .errors import (
    AionetError,
    ConfigError,
    ConnectionClosed,
    PeerUnavailable,
    ProtocolError,
    RemoteError,
    SerializationError,
    TaskError,
    TransportError,
    TransportUnavailable,
)

__version__ = "0.1.0"

from .config import Config  # noqa: E402
from .node import Node  # noqa: E402
from .scheduler import TaskRef, task_context  # noqa: E402

__all__ = [
    "AionetError",
    "Config",
    "Node",
    "ConfigError",
    "ConnectionClosed",
    "PeerUnavailable",
    "ProtocolError",
    "RemoteError",
    "SerializationError",
    "TaskError",
    "TaskRef",
    "TransportError",
    "TransportUnavailable",
    "__version__",
    "task_context",
]
