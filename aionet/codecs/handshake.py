"""Connection handshake (sans-I/O): HELLO, HELLO, CONFIRM, WELCOME, RESUME.

1. dialer -> acceptor  HELLO   (version, name, node id, addresses, features, nonce)
2. acceptor -> dialer  HELLO   (the same about the acceptor, its own nonce, a MAC over both nonces)
3. dialer -> acceptor  CONFIRM (a MAC over both nonces: the dialer holds the token too)
4. acceptor -> dialer  WELCOME (the acceptor's peer table and link resume info)
5. dialer -> acceptor  RESUME  (the dialer's peer table and link resume info)

With a cluster token both sides prove they hold it (HMAC-SHA256, compared in constant time)
before anything about the cluster is sent: the peer table and the link's stream ids travel
only in messages 4 and 5, after both MACs checked out, so a stranger who merely dials (or
answers) learns the node's name and addresses and nothing else. Without a token the MACs are
empty (and a node accepts loopback peers only). Every message is one msgpack frame whose first
element is its kind, so a handshake is told from application traffic at a glance. A REJECT
(with a reason) may replace any message after the first. A membership probe is messages 1
and 2 only (the HELLO's ``probe`` feature).

Protocol 2 costs one round trip more than protocol 1 did (which sent the peer table and the
acceptor's stream ids in its HELLO, before the dialer's proof); it keeps protocol 1's resume
order (the dialer applies the acceptor's link view, then tells its own), which is what keeps
crossing dials from resetting each other's fresh streams.

``Hello.peers`` and ``Hello.link`` stay in the HELLO layout (reserved; protocol 2 requires
them empty) so that older call sites building a HELLO positionally keep working.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import DecodeError, HandshakeError, UnsupportedVersion
from .envelope import CONFIRM, HELLO, REJECT, RESUME, WELCOME  # noqa: F401  (callers build State(RESUME))

PROTOCOL_VERSION = 2  # 2: cluster state moved from HELLO to WELCOME/RESUME (after the proofs)
MAX_PEERS = 4096  # entries in one handshake's peer table (msgpack map bound below)
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
    """Message 3: the dialer's proof of the token (nothing else)."""

    mac: bytes

    def encode(self) -> bytes:
        return msgpack.packb([CONFIRM, self.mac])


@dataclass
class State:
    """Messages 4 (WELCOME) and 5 (RESUME): what a proven peer may know about this node's
    cluster view (its peer table) and about the link between the two (resume info)."""

    kind: int
    peers: dict[str, list[str]] = field(default_factory=dict)
    link: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        return msgpack.packb([self.kind, self.peers, self.link])


class Rejected(HandshakeError):
    """The peer refused the connection with a REJECT; ``retry`` when it was only busy (its
    handshake slots were full), so another try later may succeed."""

    def __init__(self, reason: str, retry: bool = False) -> None:
        super().__init__(f"peer rejected the connection: {reason}")
        self.retry = retry


def reject(reason: str, retry: bool = False) -> bytes:
    return msgpack.packb([REJECT, reason, True] if retry else [REJECT, reason])


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
        raise Rejected(reason, retry=len(msg) > 2 and msg[2] is True)
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
    if peers != {} or link != {}:
        # protocol 2 never discloses cluster state before both proofs: a HELLO carrying some
        # is from a broken or hostile peer
        raise HandshakeError("malformed handshake: HELLO carries a peer table or link info")
    if not isinstance(nonce, bytes) or not isinstance(mac_, bytes):
        raise HandshakeError("malformed handshake: bad nonce or mac")
    return Hello(version, name, node_id, addresses, features, {}, nonce, mac_, {})


def parse_confirm(frames: list[Any]) -> Confirm:
    msg = _unpack(frames)
    if msg[0] != CONFIRM or len(msg) != 2:
        raise HandshakeError("expected CONFIRM as the third handshake message")
    if not isinstance(msg[1], bytes):
        raise HandshakeError("malformed CONFIRM")
    return Confirm(msg[1])


def parse_state(frames: list[Any], kind: int) -> State:
    """Validate a WELCOME (``kind=WELCOME``) or RESUME."""
    msg = _unpack(frames)
    what = "WELCOME" if kind == WELCOME else "RESUME"
    if msg[0] != kind or len(msg) != 3:
        raise HandshakeError(f"expected {what} after the token proofs")
    _, peers, link = msg
    if (
        not isinstance(peers, dict)
        or len(peers) > MAX_PEERS
        or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(a, str) for a in v)
            for k, v in peers.items()
        )
    ):
        raise HandshakeError(f"malformed {what}: bad peer table")
    if not isinstance(link, dict):
        raise HandshakeError(f"malformed {what}: bad link info")
    return State(kind, peers, link)
