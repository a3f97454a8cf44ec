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

__all__ = [
    "AionetError",
    "ConfigError",
    "ConnectionClosed",
    "PeerUnavailable",
    "ProtocolError",
    "RemoteError",
    "SerializationError",
    "TaskError",
    "TransportError",
    "TransportUnavailable",
    "__version__",
]
