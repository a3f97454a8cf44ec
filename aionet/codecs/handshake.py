"""Connection handshake messages (sans-I/O): build and validate HELLO / REJECT.

The dialer sends HELLO first; the acceptor validates it and answers HELLO or REJECT.
Both are single-frame msgpack lists whose first element is the envelope kind, so a node can
tell a handshake from an application message with one look.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import DecodeError, HandshakeError, UnsupportedVersion

PROTOCOL_VERSION = 1
HELLO = 0
REJECT = 9
MAX_HELLO_BYTES = 1 << 20


@dataclass
class Hello:
    version: int
    name: str
    node_id: str
    addresses: list[str]
    features: dict[str, Any] = field(default_factory=dict)
    peers: dict[str, list[str]] = field(default_factory=dict)

    def encode(self) -> bytes:
        return msgpack.packb(
            [HELLO, self.version, self.name, self.node_id, self.addresses, self.features, self.peers]
        )


def reject(reason: str) -> bytes:
    return msgpack.packb([REJECT, reason])


def parse(frames: list[Any]) -> Hello:
    """Validate a HELLO (or raise HandshakeError / UnsupportedVersion / DecodeError)."""
    if len(frames) != 1:
        raise HandshakeError(f"expected a 1-frame handshake message, got {len(frames)} frames")
    raw = frames[0]
    if len(raw) > MAX_HELLO_BYTES:
        raise HandshakeError("handshake message too large")
    try:
        msg = msgpack.unpackb(
            raw, max_str_len=65536, max_bin_len=65536, max_array_len=4096, max_map_len=4096,
            strict_map_key=True,
        )
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError(f"malformed handshake: {exc}") from None
    if not isinstance(msg, list) or not msg:
        raise HandshakeError("malformed handshake: not a list")
    if msg[0] == REJECT:
        reason = msg[1] if len(msg) > 1 and isinstance(msg[1], str) else "no reason given"
        raise HandshakeError(f"peer rejected the connection: {reason}")
    if msg[0] != HELLO or len(msg) < 3:
        raise HandshakeError("expected HELLO as the first message")
    version = msg[1]
    if not isinstance(version, int):
        raise HandshakeError("malformed handshake: version is not an integer")
    if version != PROTOCOL_VERSION:
        raise UnsupportedVersion(
            f"peer speaks aionet protocol version {version}, this node speaks {PROTOCOL_VERSION}"
        )
    if len(msg) != 7:
        raise HandshakeError("malformed handshake: wrong number of fields")
    _, _, name, node_id, addresses, features, peers = msg
    if not isinstance(name, str) or not name or len(name) > 256:
        raise HandshakeError("malformed handshake: bad node name")
    if not isinstance(node_id, str):
        raise HandshakeError("malformed handshake: bad node id")
    if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
        raise HandshakeError("malformed handshake: bad address list")
    if not isinstance(features, dict):
        raise HandshakeError("malformed handshake: bad features")
    if not isinstance(peers, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(a, str) for a in v) for k, v in peers.items()
    ):
        raise HandshakeError("malformed handshake: bad peer table")
    return Hello(version, name, node_id, addresses, features, peers)
