"""Exceptions users catch. Every aionet error derives from :class:`AionetError`.

Library errors from below (OSError, zmq.ZMQError, msgpack errors, ...) are mapped to these
types at the transport/codec boundary so that callers never depend on which transport ran.
"""

from __future__ import annotations


class AionetError(Exception):
    """Base class of every error raised by aionet."""


class ConfigError(AionetError, ValueError):
    """Invalid configuration: unknown key, wrong type, bad value."""


class ProtocolError(AionetError):
    """The peer sent bytes that violate the wire protocol; the connection is closed."""


class FrameTooLarge(ProtocolError):
    """A frame, header or message announced a size above the configured limit."""


class TooManyFrames(ProtocolError):
    """A message announced more out-of-band buffers than the configured limit."""


class BadMagic(ProtocolError):
    """The stream does not start with aionet's magic bytes (not an aionet peer)."""


class UnsupportedVersion(ProtocolError):
    """The peer speaks a protocol version this node does not understand."""


class DecodeError(ProtocolError):
    """A header or payload could not be decoded (malformed msgpack, missing buffer, ...)."""


class HandshakeError(ProtocolError):
    """The connection handshake failed (wrong version, duplicate name, timeout, ...)."""


class SerializationError(AionetError, TypeError):
    """An object cannot be serialized (unsupported type, pickle disabled, ...)."""


class TransportError(AionetError, ConnectionError):
    """A transport-level failure: connect refused, connection lost, ..."""


class ConnectionClosed(TransportError):
    """The connection was closed (by us, by the peer, or because the peer died)."""


class ConnectTimeout(TransportError, TimeoutError):
    """Connecting took longer than the timeout (also an ``asyncio.TimeoutError``)."""


class TransportUnavailable(AionetError):
    """A transport cannot run here (missing library, no device, unknown URL scheme)."""


class DeviceUnavailable(AionetError, RuntimeError):
    """A device path was asked for but the device (or its library) is missing here.

    The message names what is missing, e.g. ``"no CUDA device: cupy is not installed"``.
    """


class PeerUnavailable(AionetError):
    """A peer is dead, unknown or unreachable past its deadline."""


class NodeClosed(AionetError):
    """This node has stopped: a ``recv`` (or a send to itself) waiting on one of its mailboxes
    is released with it, since nothing can arrive any more. Messages delivered before the stop
    are still handed out first."""


class WouldBlock(AionetError):
    """``Node.send_nowait`` could not take the message without waiting: the link's window
    (``link.max_inflight_bytes``) is full, the transport is above its high-water mark, or the
    link to the peer is not up yet. Nothing was sent; ``await node.wait_space(peer)``, then
    send again."""


class RemoteError(AionetError):
    """A remote handler raised. Carries the remote exception type, message and traceback."""

    def __init__(self, remote_type: str, message: str, traceback: str = "", peer: str = ""):
        self.remote_type = remote_type
        self.remote_message = message
        self.remote_traceback = traceback
        self.peer = peer
        where = f" on {peer}" if peer else ""
        super().__init__(f"{remote_type}{where}: {message}")

    def __reduce__(self):  # keep picklable for users' own process pools
        return (type(self), (self.remote_type, self.remote_message, self.remote_traceback, self.peer))


class TaskError(AionetError):
    """A task failed: not importable, raised, or exhausted its retries."""


class CollectiveError(AionetError):
    """A collective cannot complete: a member died or left (``member`` names it), the call
    timed out, or the group was closed. The group is broken: ``grp.shrink()`` to go on."""

    def __init__(self, message: str, member: str | None = None) -> None:
        super().__init__(message)
        self.member = member

    def __reduce__(self):  # keep picklable
        return (type(self), (str(self), self.member))


__all__ = [
    "AionetError",
    "BadMagic",
    "CollectiveError",
    "ConfigError",
    "ConnectionClosed",
    "DecodeError",
    "FrameTooLarge",
    "HandshakeError",
    "NodeClosed",
    "PeerUnavailable",
    "ProtocolError",
    "RemoteError",
    "SerializationError",
    "TaskError",
    "TooManyFrames",
    "TransportError",
    "TransportUnavailable",
    "UnsupportedVersion",
]
