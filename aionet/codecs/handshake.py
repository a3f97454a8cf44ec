"""Connection handshake (sans-I/O): HELLO, HELLO, CONFIRM.

1. dialer -> acceptor  HELLO   (version, name, node id, addresses, features, peers, nonce)
2. acceptor -> dialer  HELLO   (... its own nonce, a MAC over both nonces, link resume info)
3. dialer -> acceptor  CONFIRM (a MAC over both nonces, link resume info)

With a cluster token both sides prove they hold it (HMAC-SHA256, compared in constant time)
before any application frame is accepted; without one the MACs are empty. Every message is
one msgpack frame whose first element is its kind, so a handshake is told from application
traffic at a glance. A REJECT (with a reason) may replace messages 2 or 3.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import DecodeError, HandshakeError, UnsupportedVersion

PROTOCOL_VERSION = 1
HELLO = 0
REJECT = 9
CONFIRM = 10
MAX_HANDSHAKE_BYTES = 1 << 20
NONCE_BYTES = 16


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def mac(token: bytes | None, role: bytes, *parts: bytes | str) -> bytes:
    """HMAC-SHA256 over the role and the parts (length-prefixed, so parts cannot be shifted)."""
    if not token:
        return b""
    h = hmac.new(token, role, hashlib.sha256)
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        h.update(len(b).to_bytes(4, "little"))
        h.update(b)
    return h.digest()


def verify(expected: bytes, got: Any) -> bool:
    return isinstance(got, bytes) and hmac.compare_digest(expected, got)


@dataclass
class Hello:
    version: int
    name: str
    node_id: str
    addresses: list[str]
    features: dict[str, Any] = field(default_factory=dict)
    peers: dict[str, list[str]] = field(default_factory=dict)
    nonce: bytes = b""
    mac: bytes = b""
    link: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        return msgpack.packb(
            [
                HELLO,
                self.version,
                self.name,
                self.node_id,
                self.addresses,
                self.features,
                self.peers,
                self.nonce,
                self.mac,
                self.link,
            ]
        )


@dataclass
class Confirm:
    mac: bytes
    link: dict[str, Any]

    def encode(self) -> bytes:
        return msgpack.packb([CONFIRM, self.mac, self.link])


def reject(reason: str) -> bytes:
    return msgpack.packb([REJECT, reason])


def _unpack(frames: list[Any]) -> list[Any]:
    if len(frames) != 1:
        raise HandshakeError(f"expected a 1-frame handshake message, got {len(frames)} frames")
    raw = frames[0]
    if len(raw) > MAX_HANDSHAKE_BYTES:
        raise HandshakeError("handshake message too large")
    try:
        msg = msgpack.unpackb(
            raw,
            max_str_len=65536,
            max_bin_len=65536,
            max_array_len=4096,
            max_map_len=4096,
            strict_map_key=True,
        )
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError(f"malformed handshake: {exc}") from None
    if not isinstance(msg, list) or not msg:
        raise HandshakeError("malformed handshake: not a list")
    if msg[0] == REJECT:
        reason = msg[1] if len(msg) > 1 and isinstance(msg[1], str) else "no reason given"
        raise HandshakeError(f"peer rejected the connection: {reason}")
    return msg


def parse(frames: list[Any]) -> Hello:
    """Validate a HELLO (or raise HandshakeError / UnsupportedVersion / DecodeError)."""
    msg = _unpack(frames)
    if msg[0] != HELLO or len(msg) < 3:
        raise HandshakeError("expected HELLO as the first message (not an aionet peer, or out of order)")
    version = msg[1]
    if not isinstance(version, int):
        raise HandshakeError("malformed handshake: version is not an integer")
    if version != PROTOCOL_VERSION:
        raise UnsupportedVersion(f"peer speaks aionet protocol version {version}, this node speaks {PROTOCOL_VERSION}")
    if len(msg) != 10:
        raise HandshakeError("malformed handshake: wrong number of fields")
    _, _, name, node_id, addresses, features, peers, nonce, mac_, link = msg
    if not isinstance(name, str) or not name or len(name) > 256:
        raise HandshakeError("malformed handshake: bad node name")
    if not isinstance(node_id, str) or len(node_id) > 256:
        raise HandshakeError("malformed handshake: bad node id")
    if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
        raise HandshakeError("malformed handshake: bad address list")
    if not isinstance(features, dict):
        raise HandshakeError("malformed handshake: bad features")
    if not isinstance(peers, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(a, str) for a in v) for k, v in peers.items()
    ):
        raise HandshakeError("malformed handshake: bad peer table")
    if not isinstance(nonce, bytes) or not isinstance(mac_, bytes) or not isinstance(link, dict):
        raise HandshakeError("malformed handshake: bad nonce, mac or link info")
    return Hello(version, name, node_id, addresses, features, peers, nonce, mac_, link)


def parse_confirm(frames: list[Any]) -> Confirm:
    msg = _unpack(frames)
    if msg[0] != CONFIRM or len(msg) != 3:
        raise HandshakeError("expected CONFIRM as the third handshake message")
    _, mac_, link = msg
    if not isinstance(mac_, bytes) or not isinstance(link, dict):
        raise HandshakeError("malformed CONFIRM")
    return Confirm(mac_, link)
