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

The sequencing lives in one place, :class:`Handshake` (below): dial and accept
(:mod:`aionet.core.connect`) and membership probes (:mod:`aionet.membership.probe`) feed it
the frames that arrive and write the frames it queues; it checks order, proofs, identities
and a deadline on fed time, and is tested as a pair (``tests/unit/codecs/test_handshake_pair.py``).

``Hello.peers`` and ``Hello.link`` stay in the HELLO layout (reserved; protocol 2 requires
them empty) so that older call sites building a HELLO positionally keep working.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import AionetError, ConfigError, DecodeError, HandshakeError, ProtocolError, UnsupportedVersion
from .envelope import CONFIRM, HELLO, REJECT, RESUME, WELCOME

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
            isinstance(k, str) and isinstance(v, list) and all(isinstance(a, str) for a in v) for k, v in peers.items()
        )
    ):
        raise HandshakeError(f"malformed {what}: bad peer table")
    if not isinstance(link, dict):
        raise HandshakeError(f"malformed {what}: bad link info")
    return State(kind, peers, link)


# ---------------------------------------------------------------------- the state machine
class Role(enum.Enum):
    DIALER = "dialer"
    ACCEPTOR = "acceptor"
    PROBE = "probe"  # a dialer that stops after the acceptor's HELLO (membership liveness)


class Phase(enum.Enum):
    IDLE = "idle"
    SENT_HELLO = "sent-hello"  # dialer/probe: waiting for the acceptor's HELLO
    WAIT_HELLO = "wait-hello"  # acceptor: waiting for the dialer's HELLO
    WAIT_CONFIRM = "wait-confirm"  # acceptor: sent its HELLO, waiting for the dialer's proof
    WAIT_WELCOME = "wait-welcome"  # dialer: proved the token, waiting for WELCOME
    PROVEN = "proven"  # acceptor: the dialer proved the token; the caller sends WELCOME
    WAIT_RESUME = "wait-resume"  # acceptor: sent WELCOME, waiting for RESUME
    WELCOMED = "welcomed"  # dialer: got WELCOME; the caller sends RESUME
    DONE = "done"
    FAILED = "failed"


_EDGES: frozenset[tuple[Phase, Phase]] = frozenset(
    {
        (Phase.IDLE, Phase.SENT_HELLO),
        (Phase.IDLE, Phase.WAIT_HELLO),
        (Phase.SENT_HELLO, Phase.WAIT_WELCOME),
        (Phase.SENT_HELLO, Phase.DONE),  # a probe, or we dialed ourselves
        (Phase.WAIT_HELLO, Phase.WAIT_CONFIRM),
        (Phase.WAIT_HELLO, Phase.DONE),  # answered a probe, or a node dialed itself
        (Phase.WAIT_CONFIRM, Phase.PROVEN),
        (Phase.PROVEN, Phase.WAIT_RESUME),
        (Phase.WAIT_RESUME, Phase.DONE),
        (Phase.WAIT_WELCOME, Phase.WELCOMED),
        (Phase.WELCOMED, Phase.DONE),
    }
    | {(p, Phase.FAILED) for p in Phase if p not in (Phase.DONE, Phase.FAILED)}
)


class IllegalTransition(AionetError):
    """A bug: the caller drove the handshake out of order (never the peer's fault)."""


class HandshakeTimeout(HandshakeError, TimeoutError):
    """The peer did not complete the handshake before its deadline."""


class LocalHandshakeError(HandshakeError, ConfigError):
    """The handshake cannot succeed because of this node's own configuration (no token where
    the peer requires one, a duplicate name): fixing it is ours to do, not the peer's."""


@dataclass(frozen=True)
class Me:
    """What this node says about itself in a HELLO."""

    name: str
    node_id: str
    addresses: list[str]
    features: dict[str, Any]


@dataclass(frozen=True)
class PeerHello:
    """The peer introduced itself (dialer: the acceptor's HELLO checked out; acceptor: the
    dialer's HELLO, before any proof)."""

    hello: Hello


@dataclass(frozen=True)
class DialedSelf:
    """The other end is this very node (a seed list naming itself)."""

    hello: Hello


@dataclass(frozen=True)
class Probed:
    """A probe completed: the acceptor answered (dialer side), or we answered one."""

    hello: Hello


@dataclass(frozen=True)
class Proven:
    """Acceptor: the dialer proved the token; send WELCOME with :meth:`Handshake.welcome`."""

    hello: Hello


@dataclass(frozen=True)
class Welcomed:
    """Dialer: the acceptor's WELCOME; apply it, then send RESUME with :meth:`Handshake.resume`."""

    state: State


@dataclass(frozen=True)
class Resumed:
    """Acceptor: the dialer's RESUME; the handshake is complete."""

    state: State


Event = PeerHello | DialedSelf | Probed | Proven | Welcomed | Resumed


class Handshake:
    """One side of one handshake, sans-I/O: feed it the frames that arrive, write the frames
    it queues (:meth:`data_to_send`), act on the events it returns. The order of messages, the
    token proofs, the identity checks and the deadline live here, once, for dial, accept and
    membership probes; the caller only moves bytes and owns the peer table and the link."""

    def __init__(
        self,
        role: Role,
        me: Me,
        token: bytes | None,
        *,
        now: float,
        timeout: float,
        expect: str | None = None,
        local_peer: bool = True,
        nonce: bytes | None = None,
    ) -> None:
        self.role = role
        self.me = me
        self.token = token or None
        self.deadline = now + timeout
        self.expect = expect
        self.local_peer = local_peer  # acceptor: the dialer's address is on this host
        self.nonce = nonce if nonce is not None else new_nonce()
        self.phase = Phase.IDLE
        self.peer: Hello | None = None
        self._out: list[bytes] = []
        if role is Role.ACCEPTOR:
            self._to(Phase.WAIT_HELLO)
        else:
            features = dict(me.features, probe=True) if role is Role.PROBE else me.features
            self._out.append(self._hello(b"", features).encode())
            self._to(Phase.SENT_HELLO)

    # ------------------------------------------------------------------ plumbing
    def _to(self, phase: Phase) -> None:
        if (self.phase, phase) not in _EDGES:
            raise IllegalTransition(f"handshake ({self.role.value}): {self.phase.value} -> {phase.value}")
        self.phase = phase

    def _hello(self, mac_: bytes, features: dict[str, Any] | None = None) -> Hello:
        m = self.me
        feats = m.features if features is None else features
        return Hello(PROTOCOL_VERSION, m.name, m.node_id, list(m.addresses), feats, {}, self.nonce, mac_, {})

    def _fail(self, exc: BaseException, reject_reason: str | None = None) -> BaseException:
        if reject_reason is not None:
            self._out.append(reject(reject_reason))
        if self.phase not in (Phase.DONE, Phase.FAILED):
            self._to(Phase.FAILED)
        return exc

    def _expect_phase(self, phase: Phase, what: str) -> None:
        if self.phase is not phase:
            raise IllegalTransition(f"handshake ({self.role.value}): {what}() in {self.phase.value}")

    def data_to_send(self) -> list[bytes]:
        """Frames to write now, in order (each one message of one frame)."""
        out, self._out = self._out, []
        return out

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    def check_timeout(self, now: float) -> None:
        """Raise :class:`HandshakeTimeout` once ``now`` passed the deadline unfinished."""
        if now >= self.deadline and self.phase not in (Phase.DONE, Phase.FAILED):
            raise self._fail(HandshakeTimeout(f"no complete handshake within the timeout ({self.role.value})"))

    def remaining(self, now: float) -> float:
        return max(self.deadline - now, 0.0)

    # ------------------------------------------------------------------ input
    def receive(self, frames: list[Any]) -> Event:
        """One message from the peer -> the event it makes (or a HandshakeError family
        exception for the peer's faults, :class:`LocalHandshakeError` for ours)."""
        try:
            if self.phase is Phase.SENT_HELLO:
                return self._on_acceptor_hello(parse(frames))
            if self.phase is Phase.WAIT_HELLO:
                return self._on_dialer_hello(parse(frames))
            if self.phase is Phase.WAIT_CONFIRM:
                return self._on_confirm(parse_confirm(frames))
            if self.phase is Phase.WAIT_WELCOME:
                state = parse_state(frames, WELCOME)
                self._to(Phase.WELCOMED)
                return Welcomed(state)
            if self.phase is Phase.WAIT_RESUME:
                state = parse_state(frames, RESUME)
                self._to(Phase.DONE)
                return Resumed(state)
        except ProtocolError as exc:  # HandshakeError, DecodeError, UnsupportedVersion, Rejected
            raise self._fail(exc) from None
        raise IllegalTransition(f"handshake ({self.role.value}): no message expected in {self.phase.value}")

    def _on_acceptor_hello(self, hello: Hello) -> Event:
        self.peer = hello
        if hello.node_id == self.me.node_id:
            self._to(Phase.DONE)
            return DialedSelf(hello)
        if self.expect is not None and hello.name != self.expect:
            raise HandshakeError(f"is node {hello.name!r}, expected {self.expect!r}")
        if hello.name == self.me.name and self.role is not Role.PROBE:
            raise LocalHandshakeError(f"is node {self.me.name!r} too; node names must be unique")
        if hello.features.get("auth") and not self.token:
            raise LocalHandshakeError(
                f"peer {hello.name!r} requires a cluster token and none is configured "
                "(set security.token or security.token_file)"
            )
        expected = mac(self.token, b"A", self.nonce, hello.nonce, hello.name, self.me.name)
        if self.token and not verify(expected, hello.mac):
            self._out.append(reject("authentication failed"))
            raise HandshakeError(f"peer {hello.name!r} failed to prove the cluster token")
        if self.role is Role.PROBE:
            self._to(Phase.DONE)
            return Probed(hello)
        self._out.append(Confirm(mac(self.token, b"D", hello.nonce, self.nonce, self.me.name, hello.name)).encode())
        self._to(Phase.WAIT_WELCOME)
        return PeerHello(hello)

    def _on_dialer_hello(self, hello: Hello) -> Event:
        self.peer = hello
        if hello.node_id == self.me.node_id:  # we dialed ourselves: answer so the dialer sees it
            self._out.append(self._hello(b"").encode())
            self._to(Phase.DONE)
            return DialedSelf(hello)
        if hello.name == self.me.name:
            raise HandshakeError(f"peer uses this node's own name {self.me.name!r}; names must be unique")
        if self.token is None and not self.local_peer:
            raise HandshakeError("this node has no cluster token and accepts local peers only")
        mac_a = mac(self.token, b"A", hello.nonce, self.nonce, self.me.name, hello.name)
        self._out.append(self._hello(mac_a).encode())
        if hello.features.get("probe"):  # membership liveness probe: answered; no link
            self._to(Phase.DONE)
            return Probed(hello)
        self._to(Phase.WAIT_CONFIRM)
        return PeerHello(hello)

    def _on_confirm(self, confirm: Confirm) -> Event:
        assert self.peer is not None
        expected = mac(self.token, b"D", self.nonce, self.peer.nonce, self.peer.name, self.me.name)
        if self.token and not verify(expected, confirm.mac):
            raise HandshakeError(f"peer {self.peer.name!r} failed to prove the cluster token (wrong token?)")
        self._to(Phase.PROVEN)
        return Proven(self.peer)

    # ------------------------------------------------------------------ output after proofs
    def welcome(self, peers: dict[str, list[str]], link: dict[str, Any]) -> None:
        """Acceptor, after :class:`Proven`: queue WELCOME (our peer table, our link view)."""
        self._expect_phase(Phase.PROVEN, "welcome")
        self._to(Phase.WAIT_RESUME)
        self._out.append(State(WELCOME, peers, link).encode())

    def resume(self, peers: dict[str, list[str]], link: dict[str, Any]) -> None:
        """Dialer, after :class:`Welcomed`: queue RESUME; the handshake is then complete."""
        self._expect_phase(Phase.WELCOMED, "resume")
        self._to(Phase.DONE)
        self._out.append(State(RESUME, peers, link).encode())
