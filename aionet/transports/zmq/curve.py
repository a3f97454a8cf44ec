"""CurveZMQ: key files (``aionet keys`` output or zmq certificates) and the ZAP handler that
admits only allowed client keys."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from zmq.utils import z85 as _z85

from ...errors import ConfigError, TransportError, TransportUnavailable
from ...log import get_logger
from ..base import map_errors
from .pump import NOBLOCK, zmq_error
from .wire import EMPTY

log = get_logger("aionet.transports.zmq")


# ------------------------------------------------------------------------------------------
# CurveZMQ keys
# ------------------------------------------------------------------------------------------
_Z85_KEY = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")
# zmq's certificate files (zmq_cert / zmq.auth.create_certificates): `public-key = "..."`
_CERT_KEY = re.compile(r'(public|secret)-key\s*=\s*"([^"]*)"')
_CERT_OTHER = re.compile(r'(metadata|curve|[\w.-]+\s*=\s*"[^"]*")')
ZAP_DOMAIN = b"aionet"
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP spec (RFC 27), one per context


def _read_keys(path: Path, option: str, kind: str) -> list[bytes]:
    """Z85 keys of ``kind`` ("public"/"secret") in a file: bare 40-character Z85 lines (what
    ``aionet keys`` writes) or zmq certificate files. Anything else is a ConfigError naming
    the file, so a typo never silently means "no key"."""
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        raise ConfigError(f"transport.zmq.{option}: file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"transport.zmq.{option}: cannot read {path}: {exc}") from None
    keys: list[bytes] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _CERT_KEY.fullmatch(line)
        if m is not None:
            if m[1] != kind:
                continue
            line = m[2]
        elif not _Z85_KEY.fullmatch(line) and _CERT_OTHER.fullmatch(line):
            continue  # certificate metadata
        if not _Z85_KEY.fullmatch(line):
            raise ConfigError(f"transport.zmq.{option}: {path} line {n} is not a 40-character Z85 CurveZMQ key")
        keys.append(line.encode())
    if not keys:
        raise ConfigError(f"transport.zmq.{option}: {path} holds no CurveZMQ {kind} key")
    return keys


def _read_key(value: Any, option: str, kind: str) -> bytes:
    path = _key_path(value, option)
    keys = _read_keys(path, option, kind)
    if len(keys) != 1:
        raise ConfigError(f"transport.zmq.{option}: {path} holds {len(keys)} keys, expected one")
    return keys[0]


def _key_path(value: Any, option: str) -> Path:
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise ConfigError(f"transport.zmq.{option} must be a file path, not {value!r}")
    return Path(value).expanduser()


def _z85_raw(key: bytes, where: str) -> bytes:
    try:
        raw = _z85.decode(key)
    except (KeyError, ValueError, OverflowError, struct.error):
        raw = b""
    if len(raw) != 32 or _z85.encode(raw) != key:
        raise ConfigError(f"{where}: not a valid Z85 CurveZMQ key")
    return raw


@dataclass(frozen=True)
class CurveKeys:
    """This node's CurveZMQ key pair, the server key it expects when dialing, and the client
    keys its listeners let in (raw 32-byte keys, checked by the transport's ZAP handler).

    The defaults fit ``aionet keys``, which gives a whole test cluster one shared pair: dial
    servers holding our own key, admit clients holding our own key."""

    public: bytes  # Z85
    secret: bytes  # Z85
    server: bytes  # Z85
    allowed: frozenset[bytes]

    @classmethod
    def load(cls, v: dict[str, Any]) -> CurveKeys | None:
        names = ("curve_public_key_file", "curve_secret_key_file", "curve_server_key_file", "curve_allowed_clients")
        given = [n for n in names if v.get(n) not in (None, "")]
        if not given:
            return None
        missing = [n for n in names[:2] if n not in given]
        if missing:
            raise ConfigError(
                f"transport.zmq: {', '.join(given)} set but {' and '.join(missing)} missing; CurveZMQ needs "
                "this node's key pair (`aionet keys DIR` writes curve.public and curve.secret)"
            )
        if not zmq.has("curve"):
            raise TransportUnavailable(
                f"transport.zmq curve_* options are set but libzmq {zmq.zmq_version()} was built without "
                "CURVE (libsodium); install a pyzmq wheel (it bundles libzmq with CURVE) or rebuild libzmq "
                "with libsodium"
            )
        pub_path = _key_path(v["curve_public_key_file"], "curve_public_key_file")
        sec_path = _key_path(v["curve_secret_key_file"], "curve_secret_key_file")
        public = _read_key(pub_path, "curve_public_key_file", "public")
        secret = _read_key(sec_path, "curve_secret_key_file", "secret")
        _z85_raw(public, f"transport.zmq.curve_public_key_file {pub_path}")
        _z85_raw(secret, f"transport.zmq.curve_secret_key_file {sec_path}")
        if zmq.curve_public(secret) != public:
            raise ConfigError(
                f"transport.zmq: curve_public_key_file {pub_path} is not the public key of "
                f"curve_secret_key_file {sec_path}"
            )
        with contextlib.suppress(OSError):
            if sec_path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                log.warning("CurveZMQ secret key file is accessible to other users; chmod 600 it", file=str(sec_path))
        server = public
        if v.get("curve_server_key_file") not in (None, ""):
            srv_path = _key_path(v["curve_server_key_file"], "curve_server_key_file")
            server = _read_key(srv_path, "curve_server_key_file", "public")
            _z85_raw(server, f"transport.zmq.curve_server_key_file {srv_path}")
        allowed = {_z85_raw(public, "curve_public_key_file")}
        if v.get("curve_allowed_clients") not in (None, ""):
            allowed = cls._allowed(v["curve_allowed_clients"])
        return cls(public, secret, server, frozenset(allowed))

    @staticmethod
    def _allowed(value: Any) -> set[bytes]:
        """``curve_allowed_clients``: a path or list of paths; a file holds one or more public
        keys, a directory contributes its ``*.public`` and ``*.key`` files."""
        opt = "curve_allowed_clients"
        items = [value] if isinstance(value, str | os.PathLike) else value
        if not isinstance(items, list | tuple) or not items:
            raise ConfigError(f"transport.zmq.{opt} must be a path or a list of paths, not {value!r}")
        files: list[Path] = []
        for item in items:
            path = _key_path(item, opt)
            if path.is_dir():
                found = sorted(p for p in path.iterdir() if p.suffix in (".public", ".key") and p.is_file())
                if not found:
                    raise ConfigError(f"transport.zmq.{opt}: directory {path} has no *.public or *.key files")
                files += found
            else:
                files.append(path)
        allowed: set[bytes] = set()
        for path in files:
            for key in _read_keys(path, opt, "public"):
                allowed.add(_z85_raw(key, f"transport.zmq.{opt} {path}"))
        return allowed


class ZapHandler:
    """The ZAP handler (RFC 27) of one transport's zmq Context: admits a CURVE client only if
    its public key is allowed.

    Without a handler libzmq's CURVE server encrypts for *any* client key; with it, libzmq
    asks here during each handshake. It is a ROUTER on the context's well-known inproc
    endpoint, read from the event loop like the socket monitors (no thread, no zmq.asyncio).
    Server sockets also set ZAP_ENFORCE_DOMAIN, so if this handler were missing, libzmq would
    refuse clients rather than admit everyone."""

    def __init__(self, ctx: zmq.Context, loop: asyncio.AbstractEventLoop, allowed: frozenset[bytes]) -> None:
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.linger = 0
        try:
            with map_errors({zmq.ZMQError: lambda e: zmq_error(e, "cannot start the CurveZMQ authenticator")}):
                self._sock.bind(ZAP_ENDPOINT)
        except TransportError:
            self._sock.close(0)
            raise
        self._allowed = allowed
        self._loop = loop
        self._fd = self._sock.getsockopt(zmq.FD)
        self._closed = False
        self.accepted = 0
        self.rejected = 0
        loop.add_reader(self._fd, self.poll)
        self.poll()  # arm the edge-triggered FD

    def poll(self) -> None:
        sock = self._sock
        while not self._closed:
            try:
                parts = sock.recv_multipart(NOBLOCK)
            except zmq.ZMQError:  # Again: nothing more; anything else: socket closed
                return
            reply = self._answer(parts)
            if reply is not None:
                with contextlib.suppress(zmq.ZMQError):  # libzmq gave up on the handshake
                    sock.send_multipart(reply, NOBLOCK)

    def _answer(self, parts: list[bytes]) -> list[bytes] | None:
        # [routing id, "", version, request id, domain, address, identity, mechanism, *credentials]
        if len(parts) < 8 or parts[1] != EMPTY:
            return None
        rid, _, version, request_id, _domain, address, _identity, mechanism, *creds = parts
        head = [rid, EMPTY, b"1.0", request_id]
        if version != b"1.0":
            return [*head, b"500", b"unsupported ZAP version", EMPTY, EMPTY]
        if mechanism == b"CURVE" and creds and creds[0] in self._allowed:
            self.accepted += 1
            return [*head, b"200", b"OK", _z85.encode(creds[0]), EMPTY]
        self.rejected += 1
        key = _z85.encode(creds[0]).decode() if mechanism == b"CURVE" and creds and len(creds[0]) == 32 else None
        log.warning(
            "zmq peer refused: its CurveZMQ key is not allowed (curve_allowed_clients)",
            peer=address.decode(errors="replace"),
            mechanism=mechanism.decode(errors="replace"),
            client_key=key,
        )
        return [*head, b"400", b"client key not allowed", EMPTY, EMPTY]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self._sock.close(0)
