"""ZeroMQ transport: ``zmq+tcp://host:port`` and ``zmq+ipc:///path`` over pyzmq.

aionet's contract is connection-oriented (listen -> one Connection per peer, connect -> a
Connection); ZeroMQ is not. The mapping:

* A listener is one ROUTER socket. Each ``connect`` is its own DEALER socket (so one TCP/IPC
  connection per aionet Connection). The ROUTER demultiplexes by routing id into per-peer
  Connection objects. Routing ids are assigned by libzmq, so ROUTER_HANDOVER is not needed.
* One aionet message is one ZeroMQ multipart message; frames stay frames. Control messages
  and the rare data message that zmq could not otherwise carry use an empty first frame,
  which aionet data never needs (frame 0 is a header): ``["", "H", version]`` hello,
  ``["", "W", version]`` welcome, ``["", "B", reason?]`` bye, and ``["", "D", *frames]`` for
  data with zero frames or an empty frame 0. Every other message travels exactly as sent.
* ``connect`` returns only after the listener answered the hello with a welcome, so a dead or
  closed address fails with TransportError instead of a socket that queues forever.
* Peer death: the DEALER and the ROUTER each have a socket monitor. ``EVENT_DISCONNECTED``
  (and CLOSED / HANDSHAKE_FAILED while connecting) ends the Connection with ConnectionClosed
  after delivering what had already arrived. On the ROUTER, a disconnect event names a file
  descriptor, not a routing id; the hello's ``SRCFD`` ties the two together. ZMTP heartbeats
  (``heartbeat_interval``/``heartbeat_timeout``) turn silent half-open links into disconnects.
* Reconnect is off (``RECONNECT_IVL=-1``): a dropped link surfaces as ConnectionClosed and the
  link layer above reconnects and replays. A silent zmq reconnect would hide message loss.
* No silent drops: ROUTER_MANDATORY makes a full per-peer queue EAGAIN (the sender waits) and
  an unknown peer EHOSTUNREACH (ConnectionClosed); the DEALER uses IMMEDIATE so nothing is
  queued towards a connection that does not exist. ``hwm`` (messages, not bytes) bounds zmq's
  own queues; ``max_queued_bytes``/``max_queued_messages`` bound what is read but not yet
  taken by ``recv``. When that bound is hit the socket stops being read, zmq's queue fills,
  TCP fills, and the remote sender blocks. On a listener this pauses all its peers at once.
* Zero copy: frames of ``zero_copy_min_bytes`` (64 KiB) and more are sent with ``copy=False``;
  ``send`` returns once libzmq released mutable buffers (immutable ``bytes`` need no wait:
  pyzmq holds a reference). Smaller frames are copied, which is faster. Frames are received
  with ``copy=False``: large ones are handed over as writable memoryviews of libzmq's buffer,
  small ones as ``bytes``.
* I/O: no zmq.asyncio. Each socket's ``ZMQ_FD`` is watched with ``loop.add_reader``; on wake-up
  the socket is drained with non-blocking receives (one await per *batch*, not per message),
  and sends try NOBLOCK first, waiting for writability only when zmq would block.
* ipc: ``zmq+ipc:///abs/path`` or a relative path (resolved against the working directory
  at bind/connect time); ``zmq+ipc://`` listens on a fresh file in the temp directory; a host
  or host:port is a ConfigError (libzmq would make a file named ``127.0.0.1:0`` in the cwd).
  libzmq leaves the socket file behind on close, so the listener removes the file its bind
  created (checked by device and inode) once it stops accepting.
* Tasks: connection handlers and push-mode readers are owned by the transport; ``aclose``
  waits for them (cancelling a handler still busy after a second). ``write_nowait`` enqueues
  without a task, and the futures it returns never leave an unretrieved exception.
* ``ZMQ_MAXMSGSIZE`` is set from ``limits.max_frame_bytes``: libzmq applies it per frame and
  disconnects a peer that announces a larger one. Frame count and total size per message
  are checked on arrival; a violation closes that Connection with a log line.

* CurveZMQ: with ``curve_public_key_file``/``curve_secret_key_file`` set, every listening
  socket is a CURVE server and every dialing socket a CURVE client, on ``zmq+tcp://`` and
  ``zmq+ipc://`` alike (one transport instance serves both; a plaintext ipc socket next to an
  encrypted tcp one would be a hole). Plaintext peers fail the ZMTP handshake. CURVE alone
  admits any client key, so the transport binds a ZAP handler (:class:`_ZapHandler`) on its
  own Context that admits only ``curve_allowed_clients`` (default: the node's own public key,
  the shared key of an ``aionet keys`` cluster). A dial to a listener with another key fails
  at the handshake, which the socket monitor reports at once, well within ``connect_timeout``.

One zmq Context per transport instance, created lazily and terminated in ``aclose`` (with the
ZAP handler, which is closed first).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import ipaddress
import os
import re
import socket as _socket
import stat
import struct
import tempfile
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from zmq.backend import Socket as _BackendSocket
from zmq.utils import z85 as _z85

from ..config import parse_size
from ..errors import (
    ConfigError,
    ConnectionClosed,
    FrameTooLarge,
    HandshakeError,
    ProtocolError,
    TooManyFrames,
    TransportError,
    TransportUnavailable,
)
from ..log import get_logger
from .base import Address, Buffer, Connection, ConnectionHandler, Listener, Message, Transport

log = get_logger("aionet.transports.zmq")

PROTOCOL = b"aionet-zmq/1"

_EMPTY = b""
_HELLO = b"H"
_WELCOME = b"W"
_BYE = b"B"
_DATA = b"D"
_MALFORMED = b"?"  # internal marker: a message that cannot be decoded

_NOBLOCK = zmq.NOBLOCK
_MORE = zmq.NOBLOCK | zmq.SNDMORE
_EVENTS = zmq.EVENTS
_POLLIN = zmq.POLLIN
_POLLOUT = zmq.POLLOUT
# pyzmq's sugar Socket.send is a Python wrapper; the hot path calls the Cython method.
_bsend = _BackendSocket.send

_OPTIONS: dict[str, Any] = {
    "hwm": 1000,  # ZMQ_SNDHWM and ZMQ_RCVHWM, in messages
    "sndhwm": None,
    "rcvhwm": None,
    "linger": 1.0,  # seconds zmq keeps flushing a closed connection's queue
    "heartbeat_interval": 1.0,  # seconds; 0 disables ZMTP heartbeats
    "heartbeat_timeout": 5.0,
    "connect_timeout": 5.0,
    "zero_copy_min_bytes": 65536,
    "max_queued_bytes": 64 * 2**20,  # received but not yet taken by recv, per socket
    "max_queued_messages": 65536,
    "drain_batch": 2048,  # messages read per wake-up before yielding to the loop
    "io_threads": 1,
    "max_sockets": 8192,
    # CurveZMQ (see _CurveKeys): this node's key pair turns encryption on for every socket
    "curve_public_key_file": None,
    "curve_secret_key_file": None,
    "curve_server_key_file": None,  # public key of the listeners dialed; default: our own
    "curve_allowed_clients": None,  # file(s)/directory of client public keys; default: our own
}

_MON_EVENTS = (
    zmq.EVENT_ACCEPTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CLOSED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_DIAL_FAIL_EVENTS = (
    zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CLOSED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_EVENT_NAMES = {int(e): e.name for e in zmq.Event if e.name}
_PROTOCOL_ERRORS = {int(getattr(zmq, n)): n[15:] for n in dir(zmq) if n.startswith("PROTOCOL_ERROR_")}


# ------------------------------------------------------------------------------------------
# CurveZMQ keys
# ------------------------------------------------------------------------------------------
_Z85_KEY = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")
# zmq's certificate files (zmq_cert / zmq.auth.create_certificates): `public-key = "..."`
_CERT_KEY = re.compile(r'(public|secret)-key\s*=\s*"([^"]*)"')
_CERT_OTHER = re.compile(r'(metadata|curve|[\w.-]+\s*=\s*"[^"]*")')
_ZAP_DOMAIN = b"aionet"
_ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP spec (RFC 27), one per context


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
class _CurveKeys:
    """This node's CurveZMQ key pair, the server key it expects when dialing, and the client
    keys its listeners let in (raw 32-byte keys, checked by the transport's ZAP handler).

    The defaults fit ``aionet keys``, which gives a whole test cluster one shared pair: dial
    servers holding our own key, admit clients holding our own key."""

    public: bytes  # Z85
    secret: bytes  # Z85
    server: bytes  # Z85
    allowed: frozenset[bytes]

    @classmethod
    def load(cls, v: dict[str, Any]) -> _CurveKeys | None:
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


class _Opts:
    """Validated ``[transport] zmq = {...}`` options."""

    def __init__(self, raw: dict[str, Any]) -> None:
        unknown = sorted(set(raw) - set(_OPTIONS))
        if unknown:
            raise ConfigError(f"unknown transport.zmq option(s) {', '.join(unknown)}; valid: {', '.join(_OPTIONS)}")
        v = {**_OPTIONS, **raw}
        try:
            hwm = int(v["hwm"])
            self.sndhwm = int(v["sndhwm"]) if v["sndhwm"] is not None else hwm
            self.rcvhwm = int(v["rcvhwm"]) if v["rcvhwm"] is not None else hwm
            self.linger_ms = int(float(v["linger"]) * 1000)
            self.hb_ivl_ms = int(float(v["heartbeat_interval"]) * 1000)
            self.hb_timeout_ms = int(float(v["heartbeat_timeout"]) * 1000)
            self.connect_timeout = float(v["connect_timeout"])
            self.zc_min = parse_size(v["zero_copy_min_bytes"])
            self.max_queued_bytes = parse_size(v["max_queued_bytes"])
            self.max_queued_msgs = int(v["max_queued_messages"])
            self.drain_batch = int(v["drain_batch"])
            self.io_threads = int(v["io_threads"])
            self.max_sockets = int(v["max_sockets"])
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"transport.zmq: {exc}") from None
        if min(self.sndhwm, self.rcvhwm) < 0 or self.zc_min < 1 or self.drain_batch < 1:
            raise ConfigError("transport.zmq: hwm must be >= 0, zero_copy_min_bytes and drain_batch >= 1")
        if self.max_queued_bytes <= 0 or self.max_queued_msgs <= 0 or self.io_threads < 1:
            raise ConfigError("transport.zmq: max_queued_*, io_threads must be positive")
        self.curve = _CurveKeys.load(v)


def _nbytes(frame: Any) -> int:
    if type(frame) is bytes or type(frame) is bytearray:
        return len(frame)
    return memoryview(frame).nbytes


def _immutable(frame: Any) -> bool:
    """True when nobody can change the bytes after send, so zmq may keep a reference."""
    if type(frame) is bytes:
        return True
    return type(frame) is memoryview and frame.readonly and type(frame.obj) is bytes


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _released(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[None]) -> None:
    # Runs in pyzmq's garbage-collector thread once libzmq has freed the zero-copy frame.
    with contextlib.suppress(RuntimeError):  # loop already closed: nobody is waiting
        loop.call_soon_threadsafe(_set_done, fut)


def _consume_exception(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def _closed_error(exc: TransportError) -> ConnectionClosed:
    if isinstance(exc, ConnectionClosed):
        return exc
    err = ConnectionClosed(str(exc))
    err.__cause__ = exc
    return err


def _all_done(loop: asyncio.AbstractEventLoop, waits: list[asyncio.Future[None]]) -> asyncio.Future[None]:
    """One future for several zero-copy release futures (which only ever get a result)."""
    done = loop.create_future()
    left = [len(waits)]

    def one(_fut: asyncio.Future[None]) -> None:
        left[0] -= 1
        if not left[0]:
            _set_done(done)

    for w in waits:
        w.add_done_callback(one)
    return done


def _chain_send(loop: asyncio.AbstractEventLoop, done: asyncio.Future[None], item: asyncio.Future[Any]) -> None:
    """A queued write_nowait message left the queue: finish ``done`` like ``item``."""
    if done.done():
        return
    if item.cancelled():
        done.cancel()
    elif (exc := item.exception()) is not None:
        done.set_exception(exc)
    elif item.result():
        _all_done(loop, item.result()).add_done_callback(lambda _f: _set_done(done))
    else:
        done.set_result(None)


def _zmq_error(exc: zmq.ZMQError, what: str) -> TransportError:
    if exc.errno in (zmq.EHOSTUNREACH, zmq.ENOTSOCK, zmq.ETERM):
        err: TransportError = ConnectionClosed(f"{what}: {exc.strerror}")
    else:
        err = TransportError(f"{what}: {exc.strerror}")
    err.__cause__ = exc
    return err


def _endpoint(url: str, *, bind: bool) -> str:
    """aionet URL -> zmq endpoint."""
    addr = Address.parse(url)
    if addr.scheme == "zmq+tcp":
        if not addr.host or addr.port is None:
            raise TransportError(f"zmq+tcp URL needs host and port: {url!r}")
        host = f"[{addr.host}]" if ":" in addr.host else addr.host
        port = "*" if (bind and addr.port == 0) else str(addr.port)
        return f"tcp://{host}:{port}"
    if addr.scheme == "zmq+ipc":
        return f"ipc://{_ipc_path(url, bind=bind)}"
    raise TransportError(f"ZMQTransport does not handle {addr.scheme!r} URLs")


_IPC_HINT = (
    "an ipc URL names a socket file, e.g. zmq+ipc:///tmp/aionet-a.sock (a relative path resolves "
    "against the working directory; listening on zmq+ipc:// picks a fresh file in the temp directory)"
)
# "127.0.0.1:0", "localhost:7700", "[::1]:5", "host:7700/x": a tcp address given to ipc
_HOST_PORT = re.compile(r"(\[[^\]/]*\]|[^/:]*):\d*|\[[^\]/]*\]")


def _ipc_path(url: str, *, bind: bool) -> str:
    """The socket file a ``zmq+ipc://`` URL names, made absolute.

    Relative paths are allowed and resolved against the working directory now, so the
    listener's reported address (what peers are told) is unambiguous. Anything that looks
    like a host:port or an IP address is refused: libzmq would create a file of that name
    in the working directory (``zmq+ipc://127.0.0.1:0`` used to). ``@name`` is Linux's
    abstract socket namespace and is passed through (there is no file)."""
    path = url.split("://", 1)[1]
    if not path or path == "*":
        if not bind:
            raise ConfigError(f"zmq+ipc URL {url!r} has no path to connect to; {_IPC_HINT}")
        # the ipc "port 0"; not libzmq's "ipc://*", which creates a directory in the cwd
        return os.path.join(tempfile.gettempdir(), f"aionet-{os.getpid()}-{os.urandom(6).hex()}.sock")
    if path.startswith("@"):
        return path
    first = path.split("/", 1)[0]
    if first and (_HOST_PORT.fullmatch(first) or _is_ip(first)):
        raise ConfigError(f"zmq+ipc URL {url!r} names a host/port, not a file; {_IPC_HINT}")
    path = os.path.abspath(os.path.expanduser(path))
    if len(path.encode()) > zmq.IPC_PATH_MAX_LEN:
        raise TransportError(f"ipc path longer than {zmq.IPC_PATH_MAX_LEN} bytes: {path!r}")
    return path


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _ipc_in_use(path: str) -> bool:
    if not os.path.exists(path):
        return False
    with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return False  # a stale file left by a dead process: libzmq replaces it
    return True


@dataclass(frozen=True)
class _IpcFile:
    """The socket file a listener's bind created, identified by device and inode.

    libzmq removes only the files of its own ``ipc://*`` directories, so each listener
    removes its file when it closes, and only if the path still holds the very file its
    bind made (another process may have bound the path since: that file is not ours)."""

    path: str
    dev: int
    ino: int

    @classmethod
    def created(cls, path: str) -> _IpcFile | None:
        try:
            st = os.lstat(path)  # bind() made it synchronously, in this thread
        except OSError:
            return None
        return cls(path, st.st_dev, st.st_ino) if stat.S_ISSOCK(st.st_mode) else None

    def remove(self) -> None:
        try:
            st = os.lstat(self.path)
            if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == (self.dev, self.ino):
                os.unlink(self.path)
        except FileNotFoundError:
            pass  # already gone (removed by hand, or its directory was)
        except OSError as exc:
            log.warning("cannot remove zmq ipc socket file", path=self.path, error=str(exc))


class _Receiver:
    """Reads the rest of a message from a socket, enforcing the configured limits.

    Frames are received with ``copy=False``: ``Frame.more`` is cheaper than asking the socket
    for RCVMORE, and each frame can become ``bytes`` (small) or a memoryview (large)."""

    def __init__(self, sock: zmq.Socket, opts: _Opts, limits: Any) -> None:
        self.recv = sock.recv
        self.zc_min = opts.zc_min
        self.max_frames = limits.max_frames
        self.max_bytes = limits.max_message_bytes

    def body(self, fr: zmq.Frame) -> tuple[bytes | None, list[Any], int]:
        """Given frame 0 (received), read the rest: (control or None for data, frames, bytes)."""
        recv, zc = self.recv, self.zc_min
        n = len(fr)
        if n:  # data as sent
            frames: list[Any] = [fr.bytes if n < zc else fr.buffer]
            size = n
            while fr.more:
                if len(frames) >= self.max_frames or size > self.max_bytes:
                    return self._discard(fr, len(frames), size)
                fr = recv(0, copy=False)
                n = len(fr)
                frames.append(fr.bytes if n < zc else fr.buffer)
                size += n
            if size > self.max_bytes:
                return self._discard(fr, len(frames), size)
            return None, frames, size
        if not fr.more:
            return _MALFORMED, [ProtocolError("a lone empty frame")], 0
        fr = recv(0, copy=False)
        ctl = fr.bytes
        frames = []
        size = 0
        while fr.more:
            if len(frames) >= self.max_frames or size > self.max_bytes:
                return self._discard(fr, len(frames), size)
            fr = recv(0, copy=False)
            n = len(fr)
            frames.append(fr.bytes if n < zc else fr.buffer)
            size += n
        if size > self.max_bytes:
            return self._discard(fr, len(frames), size)
        return (None if ctl == _DATA else ctl), frames, size

    def _discard(self, fr: zmq.Frame, count: int, size: int) -> tuple[bytes, list[Any], int]:
        while fr.more:
            fr = self.recv(0, copy=False)
            count += 1
            size += len(fr)
        if count > self.max_frames:
            return _MALFORMED, [TooManyFrames(f"message has {count} frames, limit {self.max_frames}")], 0
        return _MALFORMED, [FrameTooLarge(f"message of {size} bytes, limit {self.max_bytes}")], 0


class _Monitor:
    """A socket monitor read from the loop; calls ``on_event(event, value)`` per event."""

    def __init__(
        self,
        ctx: zmq.Context,
        sock: zmq.Socket,
        loop: asyncio.AbstractEventLoop,
        on_event: Callable[[int, int], None],
        events: int,
    ) -> None:
        addr = f"inproc://aionet-monitor-{os.urandom(8).hex()}"
        sock.monitor(addr, events)
        self._target = sock
        self._sock = ctx.socket(zmq.PAIR)
        self._sock.linger = 0
        self._sock.connect(addr)
        self._loop = loop
        self._on_event = on_event
        self._fd = self._sock.getsockopt(zmq.FD)
        self._closed = False
        loop.add_reader(self._fd, self.poll)
        # The inproc pipe attached synchronously, so no command will ever signal the FD until
        # one read has found the pipe empty and put the reader to sleep: do that now.
        self.poll()

    def poll(self) -> None:
        """Deliver every pending event (also called directly to bring the view up to date)."""
        sock = self._sock
        while not self._closed:
            try:
                parts = sock.recv_multipart(_NOBLOCK)
            except zmq.ZMQError:  # Again: nothing more; anything else: socket closed
                return
            if len(parts[0]) >= 6:
                event, value = struct.unpack_from("=HI", parts[0])
                self._on_event(event, value)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        with contextlib.suppress(zmq.ZMQError):
            self._target.disable_monitor()
        self._sock.close(0)


class _ZapHandler:
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
            self._sock.bind(_ZAP_ENDPOINT)
        except zmq.ZMQError as exc:
            self._sock.close(0)
            raise _zmq_error(exc, "cannot start the CurveZMQ authenticator") from exc
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
                parts = sock.recv_multipart(_NOBLOCK)
            except zmq.ZMQError:  # Again: nothing more; anything else: socket closed
                return
            reply = self._answer(parts)
            if reply is not None:
                with contextlib.suppress(zmq.ZMQError):  # libzmq gave up on the handshake
                    sock.send_multipart(reply, _NOBLOCK)

    def _answer(self, parts: list[bytes]) -> list[bytes] | None:
        # [routing id, "", version, request id, domain, address, identity, mechanism, *credentials]
        if len(parts) < 8 or parts[1] != _EMPTY:
            return None
        rid, _, version, request_id, _domain, address, _identity, mechanism, *creds = parts
        head = [rid, _EMPTY, b"1.0", request_id]
        if version != b"1.0":
            return [*head, b"500", b"unsupported ZAP version", _EMPTY, _EMPTY]
        if mechanism == b"CURVE" and creds and creds[0] in self._allowed:
            self.accepted += 1
            return [*head, b"200", b"OK", _z85.encode(creds[0]), _EMPTY]
        self.rejected += 1
        key = _z85.encode(creds[0]).decode() if mechanism == b"CURVE" and creds and len(creds[0]) == 32 else None
        log.warning(
            "zmq peer refused: its CurveZMQ key is not allowed (curve_allowed_clients)",
            peer=address.decode(errors="replace"),
            mechanism=mechanism.decode(errors="replace"),
            client_key=key,
        )
        return [*head, b"400", b"client key not allowed", _EMPTY, _EMPTY]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self._sock.close(0)


class _Pump:
    """Drives one zmq socket from the event loop.

    ``ZMQ_FD`` is edge-triggered and any socket call may consume its signal, so after each
    operation (ours or a sender's) the socket's ``EVENTS`` is re-checked before going idle.
    """

    def __init__(self, sock: zmq.Socket, loop: asyncio.AbstractEventLoop, opts: _Opts, limits: Any) -> None:
        self._sock = sock
        self._loop = loop
        self._opts = opts
        self._rx = _Receiver(sock, opts, limits)
        self._fd = sock.getsockopt(zmq.FD)
        self._kick_pending = False
        self._stopped = False
        self._queued_bytes = 0
        self._queued_msgs = 0
        self._paused = False
        loop.add_reader(self._fd, self._service)
        self.kick()  # arm the edge-triggered FD: it only fires after EVENTS saw nothing to do

    # --- flow control of the receive side -------------------------------------------------
    def _over_bound(self) -> bool:
        return self._queued_bytes > self._opts.max_queued_bytes or self._queued_msgs > self._opts.max_queued_msgs

    def _count_out(self, nbytes: int, nmsgs: int) -> None:
        self._queued_bytes -= nbytes
        self._queued_msgs -= nmsgs
        if (
            self._paused
            and self._queued_bytes <= self._opts.max_queued_bytes // 2
            and self._queued_msgs <= self._opts.max_queued_msgs // 2
        ):
            self._paused = False
            self.kick()

    # --- scheduling -------------------------------------------------------------------------
    def kick(self) -> None:
        """Re-check the socket soon (coalesced: at most once per loop iteration)."""
        if not self._kick_pending and not self._stopped:
            self._kick_pending = True
            self._loop.call_soon(self._kicked)

    def _kicked(self) -> None:
        self._kick_pending = False
        self._service()

    def _service(self) -> None:
        if self._stopped:
            return
        getopt = self._sock.getsockopt
        flush_tried = False
        try:
            while True:
                ev = getopt(_EVENTS)
                if ev & _POLLIN and not self._paused:
                    if self._drain(self._opts.drain_batch):
                        self.kick()  # batch used up: let other tasks run first
                        return
                    continue
                if ev & _POLLOUT and not flush_tried and self._has_pending():
                    flush_tried = True
                    if self._flush():
                        flush_tried = False
                    continue
                break
            self._idle()
        except zmq.ZMQError as exc:
            if not self._stopped:
                self._fatal(exc)

    def _stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._loop.remove_reader(self._fd)

    # --- subclass hooks ---------------------------------------------------------------------
    def _drain(self, budget: int, force: bool = False) -> bool:
        """Receive up to ``budget`` messages; True when the budget ran out (more may wait).
        ``force`` ignores the receive bound (to take what a dead peer left in zmq's queue)."""
        raise NotImplementedError

    def _has_pending(self) -> bool:
        raise NotImplementedError

    def _flush(self) -> bool:
        """Send queued messages; True if any progress was made."""
        raise NotImplementedError

    def _idle(self) -> None:
        """Called when the socket has nothing more to do right now."""

    def _fatal(self, exc: zmq.ZMQError) -> None:
        raise NotImplementedError


class _PendingSend:
    __slots__ = ("fut", "large", "parts")

    def __init__(self, parts: list[Any], large: bool, fut: asyncio.Future[Any]) -> None:
        self.parts = parts
        self.large = large
        self.fut = fut


class _ZConnection(Connection):
    """Receive queue, send queue and close state shared by both ends."""

    def __init__(self, pump: _Pump, loop: asyncio.AbstractEventLoop, opts: _Opts) -> None:
        self._pump = pump
        self._loop = loop
        self._zc_min = opts.zc_min
        self._rq: collections.deque[Message] = collections.deque()
        self._rq_bytes = 0
        self._rx_waiter: asyncio.Future[None] | None = None
        self._sendq: collections.deque[_PendingSend] = collections.deque()
        self._closed = False  # closed locally
        self._eof: ConnectionClosed | None = None  # remote side ended (recv drains, then raises)
        self._bsock = pump._sock

    # --- receive ----------------------------------------------------------------------------
    def _deliver(self, frames: Message, nbytes: int) -> None:
        """Queue a message (the drain loops inline this for the common case)."""
        self._rq.append(frames)
        self._rq_bytes += nbytes
        pump = self._pump
        pump._queued_bytes += nbytes
        pump._queued_msgs += 1
        w = self._rx_waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _wake(self) -> None:
        w = self._rx_waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _drop_queue(self) -> None:
        self._pump._count_out(self._rq_bytes, len(self._rq))
        self._rq.clear()
        self._rq_bytes = 0

    def _end_error(self) -> ConnectionClosed:
        if self._closed:
            return ConnectionClosed("connection closed")
        assert self._eof is not None
        err = ConnectionClosed(str(self._eof))
        err.__cause__ = self._eof.__cause__ or self._eof
        return err

    async def _wait(self) -> None:
        w = self._rx_waiter
        if w is None or w.done():
            w = self._rx_waiter = self._loop.create_future()
        await w

    async def recv(self) -> Message:
        while True:
            if self._rq and not self._closed:
                frames = self._rq.popleft()
                n = sum(map(len, frames))
                self._rq_bytes -= n
                self._pump._count_out(n, 1)
                return frames
            if self._closed or self._eof is not None:
                raise self._end_error()
            await self._wait()

    async def recv_many(self) -> list[Message]:
        while True:
            if self._rq and not self._closed:
                out = list(self._rq)
                self._rq.clear()
                n, self._rq_bytes = self._rq_bytes, 0
                self._pump._count_out(n, len(out))
                return out
            if self._closed or self._eof is not None:
                raise self._end_error()
            await self._wait()

    # --- send -------------------------------------------------------------------------------
    def _encode(self, frames: Sequence[Buffer]) -> tuple[list[Any], bool]:
        """-> (zmq parts, whether some frame is large enough for zero copy)."""
        zc = self._zc_min
        large = False
        for f in frames:
            if (len(f) if type(f) is bytes else _nbytes(f)) >= zc:
                large = True
                break
        if not frames or not _nbytes(frames[0]):
            return [_EMPTY, _DATA, *frames], large
        return list(frames), large

    def _send_one(self, frame: bytes) -> None:
        """Send a one-frame message, raising zmq.Again when it would block."""
        raise NotImplementedError

    def _send_parts(self, parts: list[Any], large: bool, prefix: bytes | None) -> list[asyncio.Future[None]] | None:
        """Send one multipart message without blocking.

        Returns None if zmq would block (nothing was sent), else the futures that complete
        when libzmq releases zero-copy mutable buffers (usually an empty list).
        """
        sock = self._bsock
        try:
            if prefix is not None:
                _bsend(sock, prefix, _MORE)
            last = len(parts) - 1
            if not large:
                for i in range(last):
                    _bsend(sock, parts[i], _MORE)
                _bsend(sock, parts[last], _NOBLOCK)
                return []
            waits: list[asyncio.Future[None]] = []
            zc = self._zc_min
            for i, p in enumerate(parts):
                flags = _NOBLOCK if i == last else _MORE
                if _nbytes(p) < zc:
                    _bsend(sock, p, flags)
                elif _immutable(p):
                    _bsend(sock, p, flags, copy=False)
                else:
                    try:
                        view = np.frombuffer(p, dtype=np.uint8)
                    except (ValueError, TypeError):  # not contiguous: copy it
                        _bsend(sock, memoryview(p).tobytes(), flags)
                        continue
                    fut = self._loop.create_future()
                    weakref.finalize(view, _released, self._loop, fut).atexit = False
                    _bsend(sock, view, flags, copy=False)
                    del view  # libzmq (via pyzmq's gc thread) now holds the last reference
                    waits.append(fut)
            return waits
        except zmq.Again:
            # Only the first frame can meet a full queue; a DEALER whose pipe died mid-message
            # rolls the message back, so retrying later is correct in both cases.
            return None

    def _try_send(self, parts: list[Any], large: bool) -> list[asyncio.Future[None]] | None:
        raise NotImplementedError

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectionClosed("connection closed")
        if self._eof is not None:
            raise self._end_error()

    async def send(self, frames: Sequence[Buffer]) -> None:
        # Hot path: one small bytes frame, nothing queued ahead, zmq has room.
        if len(frames) == 1 and not self._sendq and not self._closed and self._eof is None:
            f = frames[0]
            if type(f) is bytes and 0 < len(f) < self._zc_min:
                try:
                    self._send_one(f)
                except zmq.ZMQError:
                    pass  # would block, or failed: the general path queues or reports it
                else:
                    pump = self._pump
                    if not pump._kick_pending:
                        pump.kick()
                    return
        await self._send_general(frames)

    async def _send_general(self, frames: Sequence[Buffer]) -> None:
        self._check_open()
        parts, large = self._encode(frames)
        if not self._sendq:
            waits = self._try_send(parts, large)
            if waits is not None:
                self._pump.kick()
                for w in waits:
                    await w
                return
        await self._send_queued(parts, large)

    def write_nowait(self, frames: Sequence[Buffer]) -> Awaitable[None] | None:
        """Fix the message's place in the stream now (no task, unlike the default): sent at
        once, or queued behind earlier waiters. Returns a future to await when zmq would block
        or still references mutable zero-copy buffers; its failure is also consumed, so a
        caller that drops it leaves no "exception was never retrieved"."""
        if len(frames) == 1 and not self._sendq and not self._closed and self._eof is None:
            f = frames[0]  # hot path, as in send(): one small bytes frame and zmq has room
            if type(f) is bytes and 0 < len(f) < self._zc_min:
                try:
                    self._send_one(f)
                except zmq.ZMQError:
                    pass  # would block, or failed: the general path queues or reports it
                else:
                    if not self._pump._kick_pending:
                        self._pump.kick()
                    return None
        self._check_open()
        parts, large = self._encode(frames)
        if not self._sendq:
            try:
                waits = self._try_send(parts, large)
            except TransportError as exc:
                raise _closed_error(exc) from exc
            if waits is not None:
                self._pump.kick()
                return _all_done(self._loop, waits) if waits else None
        item = _PendingSend(parts, large, self._loop.create_future())
        self._sendq.append(item)
        self._pump.kick()
        done = self._loop.create_future()
        done.add_done_callback(_consume_exception)
        item.fut.add_done_callback(functools.partial(_chain_send, self._loop, done))
        return done

    def start_receiving(
        self,
        on_messages: Callable[[list[Message]], Awaitable[None] | None],
        on_closed: Callable[[BaseException], None],
    ) -> None:
        super().start_receiving(on_messages, on_closed)
        self._transport._own(self._pump_task)  # ends with the connection; aclose awaits it

    def send_nowait(self, frames: Sequence[Buffer]) -> None:
        """Send now, or queue behind earlier waiters without waiting (acks, heartbeats)."""
        self._check_open()
        parts, large = self._encode(frames)
        if large:  # nobody waits for libzmq to release buffers here: copy the mutable ones
            zc = self._zc_min
            parts = [p if _immutable(p) or _nbytes(p) < zc else memoryview(p).tobytes() for p in parts]
        if not self._sendq and self._try_send(parts, large) is not None:
            self._pump.kick()
            return
        item = _PendingSend(parts, large, self._loop.create_future())
        item.fut.add_done_callback(_consume_exception)
        self._sendq.append(item)
        self._pump.kick()

    async def _send_queued(self, parts: list[Any], large: bool) -> None:
        """Wait for writability behind earlier waiters (FIFO), then send."""
        item = _PendingSend(parts, large, self._loop.create_future())
        self._sendq.append(item)
        self._pump.kick()
        try:
            waits = await item.fut
        except asyncio.CancelledError:
            with contextlib.suppress(ValueError):
                self._sendq.remove(item)
            raise
        for w in waits:
            await w

    def _flush_queue(self) -> bool:
        """Send what the queue holds until zmq would block; True if anything was sent."""
        q = self._sendq
        progress = False
        while q:
            item = q[0]
            if item.fut.done():
                q.popleft()
                continue
            try:
                waits = self._try_send(item.parts, item.large)
            except TransportError as exc:
                self._fail_sends(exc)
                return True
            if waits is None:
                return progress
            q.popleft()
            item.fut.set_result(waits)
            progress = True
        return progress

    def _fail_sends(self, exc: TransportError) -> None:
        while self._sendq:
            item = self._sendq.popleft()
            if not item.fut.done():
                err = ConnectionClosed(str(exc))
                err.__cause__ = exc
                item.fut.set_exception(err)

    @property
    def closed(self) -> bool:
        return self._closed

    def extra_info(self) -> dict[str, Any]:
        return {
            "queued_in_messages": len(self._rq),
            "queued_in_bytes": self._rq_bytes,
            "queued_send_waiters": len(self._sendq),
            "eof": str(self._eof) if self._eof else None,
        }


# ======================================================================================
# Listener side: one ROUTER socket, one _PeerConnection per routing id
# ======================================================================================
class _PeerConnection(_ZConnection):
    """The listener's view of one dialer, multiplexed on the ROUTER by routing id."""

    def __init__(self, listener: _RouterListener, rid: bytes, fd: int, peer: str) -> None:
        super().__init__(listener, listener._loop, listener._opts)
        self._listener = listener
        self._transport = listener._transport
        self._rid = rid
        self._fd = fd
        self.local_address = listener.address
        self.peer_address = peer

    def _send_one(self, frame: bytes) -> None:
        sock = self._bsock
        _bsend(sock, self._rid, _MORE)
        _bsend(sock, frame, _NOBLOCK)

    def _try_send(self, parts: list[Any], large: bool) -> list[asyncio.Future[None]] | None:
        try:
            waits = self._send_parts(parts, large, self._rid)
        except zmq.ZMQError as exc:
            err = _zmq_error(exc, f"send to {self.peer_address}")
            if isinstance(err, ConnectionClosed):
                self._remote_end(err)
            raise err from exc
        if waits is None:
            self._listener._blocked[self] = None
        return waits

    def _remote_end(self, exc: ConnectionClosed) -> None:
        if self._eof is None and not self._closed:
            self._eof = exc
            self._fail_sends(exc)
            self._wake()
        self._listener._forget(self)

    def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._eof is None:
            self._listener._send_bye(self._rid)
        self._fail_sends(ConnectionClosed("connection closed"))
        self._drop_queue()
        self._wake()
        self._listener._forget(self)

    async def close(self) -> None:
        self.abort()

    def extra_info(self) -> dict[str, Any]:
        return {
            **super().extra_info(),
            "socket": "ROUTER",
            "routing_id": self._rid.hex(),
            "curve": self._listener._transport.curve,
        }


class _RouterListener(_Pump, Listener):
    """A bound ROUTER socket; peers become Connections after a hello."""

    def __init__(
        self,
        transport: ZMQTransport,
        sock: zmq.Socket,
        address: str,
        handler: ConnectionHandler,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._transport = transport
        self._address = address
        self._scheme = address.split("://", 1)[0]
        self._handler = handler
        self._conns: dict[bytes, _PeerConnection] = {}
        self._by_fd: dict[int, _PeerConnection] = {}
        self._live_fds: set[int] = set()
        self._blocked: dict[_PeerConnection, None] = {}
        self._byes: collections.deque[bytes] = collections.deque()
        self._accepting = True
        self._shut = False
        self._retry: asyncio.TimerHandle | None = None
        self._retry_delay = 0.001
        self._ipc_file: _IpcFile | None = None  # removed when the listener stops accepting
        _Pump.__init__(self, sock, loop, transport._opts, transport.limits)
        self._monitor = _Monitor(transport._context(), sock, loop, self._on_event, _MON_EVENTS)

    @property
    def address(self) -> str:
        return self._address

    # --- receive ----------------------------------------------------------------------------
    def _drain(self, budget: int, force: bool = False) -> bool:
        recv = self._sock.recv
        conns = self._conns
        zc = self._opts.zc_min
        max_b = 1 << 62 if force else self._opts.max_queued_bytes
        max_m = 1 << 62 if force else self._opts.max_queued_msgs
        if self._stopped or (self._paused and not force):
            return False
        qb, qm = self._queued_bytes, self._queued_msgs  # kept in locals on the hot path
        n = 0
        try:
            while n < budget:
                if qb > max_b or qm > max_m:
                    self._paused = True
                    return False
                try:
                    rid = recv(_NOBLOCK)
                except zmq.Again:
                    return False
                n += 1
                fr = recv(0, copy=False)
                conn = conns.get(rid)
                if conn is not None:
                    size = len(fr)
                    if size and not fr.more:  # the common case, inlined: one non-empty frame
                        conn._rq.append([fr.bytes if size < zc else fr.buffer])
                        conn._rq_bytes += size
                        qb += size
                        qm += 1
                        w = conn._rx_waiter
                        if w is not None and not w.done():
                            w.set_result(None)
                        continue
                self._queued_bytes, self._queued_msgs = qb, qm
                try:
                    self._slow_message(rid, fr, conn)
                finally:
                    qb, qm = self._queued_bytes, self._queued_msgs
                if self._stopped or (self._paused and not force):
                    return False
            return True
        finally:
            self._queued_bytes, self._queued_msgs = qb, qm

    def _slow_message(self, rid: bytes, fr: zmq.Frame, conn: _PeerConnection | None) -> None:
        if conn is None:
            self._stranger(rid, fr)
            return
        ctl, frames, size = self._rx.body(fr)
        if ctl is None:
            conn._deliver(frames, size)
        else:
            self._control(conn, ctl, frames)

    def _control(self, conn: _PeerConnection, ctl: bytes, args: list[Any]) -> None:
        if ctl == _BYE:
            conn._remote_end(ConnectionClosed(f"peer {conn.peer_address} closed the connection"))
            return
        if ctl == _MALFORMED and args and isinstance(args[0], ProtocolError):
            err: ProtocolError = args[0]
        else:
            err = ProtocolError(f"unexpected control frame {ctl[:16]!r}")
        log.warning(
            "zmq peer violated the protocol; closing its connection",
            peer=conn.peer_address,
            listener=self._address,
            error=str(err),
        )
        closed = ConnectionClosed(f"protocol violation by {conn.peer_address}: {err}")
        closed.__cause__ = err
        self._send_bye(conn._rid, str(err).encode()[:200])
        conn._remote_end(closed)

    def _stranger(self, rid: bytes, fr: zmq.Frame) -> None:
        """First message from an unknown routing id: only a valid hello creates a Connection."""
        try:
            fd = fr.get(zmq.SRCFD)
        except zmq.ZMQError:  # e.g. a ZMTP 1.0 peer: no descriptor, so its death is unobservable
            fd = -1
        ctl, args, _ = self._rx.body(fr)
        if ctl != _HELLO:
            if ctl != _BYE:  # a bye from a peer we already forgot is normal
                log.debug("zmq message from unknown peer ignored", listener=self._address, control=ctl)
            return
        if args[:1] != [PROTOCOL]:
            log.warning(
                "zmq hello with unsupported version rejected",
                listener=self._address,
                version=bytes(args[0][:32]) if args else None,
            )
            self._send_bye(rid, b"unsupported protocol version")
            return
        if not self._accepting:
            self._send_bye(rid, b"listener closed")
            return
        if fd < 0:
            self._send_bye(rid, b"connection cannot be tracked (ZMTP 3 required)")
            return
        self._monitor.poll()  # bring fd liveness up to date before trusting SRCFD
        if fd not in self._live_fds:
            log.debug("zmq hello from an already disconnected peer ignored", listener=self._address)
            return
        old = self._by_fd.get(fd)
        if old is not None:  # fd reused: its previous owner is certainly gone
            old._remote_end(ConnectionClosed(f"peer {old.peer_address} disconnected"))
        try:
            self._sock.send_multipart([rid, _EMPTY, _WELCOME, PROTOCOL], _NOBLOCK)
        except zmq.ZMQError:
            return
        conn = _PeerConnection(self, rid, fd, self._peer_name(fd))
        self._conns[rid] = conn
        self._by_fd[fd] = conn
        self._transport._own(self._loop.create_task(self._run_handler(conn), name=f"aionet-zmq {conn.peer_address}"))

    def _peer_name(self, fd: int) -> str:
        if self._scheme == "zmq+ipc":
            return f"zmq+ipc://{self._address.split('://', 1)[1]}#fd{fd}"
        try:
            with _socket.socket(fileno=os.dup(fd)) as s:
                host, port = s.getpeername()[:2]
        except OSError:
            return f"zmq+tcp://?#fd{fd}"
        host = f"[{host}]" if ":" in host else host
        return f"zmq+tcp://{host}:{port}"

    async def _run_handler(self, conn: _PeerConnection) -> None:
        try:
            await self._handler(conn)
        except asyncio.CancelledError:
            conn.abort()
            raise
        except ConnectionClosed as exc:  # the stream ended under the handler: not a bug
            log.debug("zmq connection ended in its handler", peer=conn.peer_address, reason=str(exc))
            conn.abort()
        except Exception:
            log.exception("zmq connection handler raised; closing", listener=self._address, peer=conn.peer_address)
            conn.abort()

    def _on_event(self, event: int, value: int) -> None:
        if event == zmq.EVENT_ACCEPTED:
            self._live_fds.add(value)
        elif event == zmq.EVENT_DISCONNECTED:
            self._live_fds.discard(value)
            conn = self._by_fd.get(value)
            if conn is not None:
                # Everything the peer sent before dying is already queued in zmq: take it first.
                self._drain_all()
                conn._remote_end(ConnectionClosed(f"peer {conn.peer_address} disconnected"))
                self.kick()
        elif event & (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
            detail = _PROTOCOL_ERRORS.get(value) if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL else None
            if self._transport.curve:  # refused before any message got through; worth a warning
                log.warning(
                    "zmq handshake with an incoming peer failed: CurveZMQ is required here; the peer "
                    "is plaintext or dialed with another server key (curve_server_key_file)",
                    listener=self._address,
                    zmq_event=_EVENT_NAMES.get(event, event),
                    detail=detail,
                )
            else:
                log.info(
                    "zmq handshake with an incoming peer failed",
                    listener=self._address,
                    zmq_event=_EVENT_NAMES.get(event, event),
                    detail=detail,
                )

    def _drain_all(self) -> None:
        with contextlib.suppress(zmq.ZMQError):  # bounded by what zmq holds: rcvhwm per peer
            self._drain(self._opts.rcvhwm * (len(self._conns) + 1) + 1024, force=True)
        if self._over_bound():
            self._paused = True

    # --- send -------------------------------------------------------------------------------
    def _send_bye(self, rid: bytes, reason: bytes = b"") -> None:
        if self._shut:
            return
        try:
            self._sock.send_multipart([rid, _EMPTY, _BYE, reason], _NOBLOCK)
        except zmq.Again:
            self._byes.append(rid)  # the peer's queue is full; retried with other blocked sends
            self._arm_retry()
        except zmq.ZMQError:
            pass  # peer already gone
        self.kick()

    def _has_pending(self) -> bool:
        return bool(self._blocked or self._byes)

    def _flush(self) -> bool:
        progress = False
        for _ in range(len(self._byes)):
            rid = self._byes.popleft()
            try:
                self._sock.send_multipart([rid, _EMPTY, _BYE, b""], _NOBLOCK)
                progress = True
            except zmq.Again:
                self._byes.append(rid)
            except zmq.ZMQError:
                progress = True
        for conn in list(self._blocked):
            del self._blocked[conn]
            if conn._flush_queue():
                progress = True
            if conn._sendq and not conn._closed and conn._eof is None:
                self._blocked.setdefault(conn, None)
        return progress

    def _idle(self) -> None:
        if self._blocked or self._byes:
            self._arm_retry()
        else:
            self._retry_delay = 0.001

    def _arm_retry(self) -> None:
        # ROUTER's POLLOUT means "some peer has room", so a single full peer is re-tried on a
        # short backoff timer as well as on every wake-up of the socket.
        if self._retry is None and not self._shut:
            self._retry = self._loop.call_later(self._retry_delay, self._retry_now)
            self._retry_delay = min(self._retry_delay * 2, 0.02)

    def _retry_now(self) -> None:
        self._retry = None
        if self._flush():
            self._retry_delay = 0.001
        self._service()

    def _fatal(self, exc: zmq.ZMQError) -> None:
        log.error("zmq listener socket failed", listener=self._address, error=str(exc))
        self._shutdown(_zmq_error(exc, "listener socket failed"))

    # --- lifecycle --------------------------------------------------------------------------
    def _forget(self, conn: _PeerConnection) -> None:
        if self._conns.get(conn._rid) is conn:
            del self._conns[conn._rid]
        if self._by_fd.get(conn._fd) is conn:
            del self._by_fd[conn._fd]
        self._blocked.pop(conn, None)
        if not self._accepting and not self._conns:
            self._shutdown(None)

    async def close(self) -> None:
        """Stop accepting. The socket (and port) stays open until its last Connection closes,
        because closing a ROUTER would cut every established peer."""
        if not self._accepting:
            return
        self._accepting = False
        self._remove_ipc_file()  # established peers keep their connections; new dials fail fast
        if not self._conns:
            self._shutdown(None)

    def _remove_ipc_file(self) -> None:
        f, self._ipc_file = self._ipc_file, None
        if f is not None:
            f.remove()

    def _shutdown(self, exc: TransportError | None) -> None:
        if self._shut:
            return
        self._accepting = False
        err = ConnectionClosed("listener shut down")
        if exc is not None:
            err.__cause__ = exc
        for conn in list(self._conns.values()):
            conn._remote_end(err)
        for rid in self._byes:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.send_multipart([rid, _EMPTY, _BYE, b""], _NOBLOCK)
        self._shut = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._stop()
        self._monitor.close()
        self._sock.close(linger=self._opts.linger_ms)
        self._remove_ipc_file()
        self._transport._listeners.discard(self)


# ======================================================================================
# Dialer side: one DEALER socket per Connection
# ======================================================================================
class _DealerConnection(_Pump, _ZConnection):
    """A dialed connection: its own DEALER socket, never reconnecting."""

    def __init__(self, transport: ZMQTransport, sock: zmq.Socket, url: str, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._handshake: asyncio.Future[None] = loop.create_future()
        _Pump.__init__(self, sock, loop, transport._opts, transport.limits)
        _ZConnection.__init__(self, self, loop, transport._opts)
        self.peer_address = url
        self.local_address = ""
        self._monitor = _Monitor(transport._context(), sock, loop, self._on_event, _DIAL_FAIL_EVENTS)

    # --- receive ----------------------------------------------------------------------------
    def _drain(self, budget: int, force: bool = False) -> bool:
        recv = self._sock.recv
        zc = self._opts.zc_min
        rq = self._rq
        max_b = 1 << 62 if force else self._opts.max_queued_bytes
        max_m = 1 << 62 if force else self._opts.max_queued_msgs
        if self._stopped or (self._paused and not force):
            return False
        welcomed = self._handshake.done()
        qb, qm = self._queued_bytes, self._queued_msgs  # kept in locals on the hot path
        n = 0
        try:
            while n < budget:
                if qb > max_b or qm > max_m:
                    self._paused = True
                    return False
                try:
                    fr = recv(_NOBLOCK, copy=False)
                except zmq.Again:
                    return False
                n += 1
                size = len(fr)
                if size and welcomed and not fr.more:  # the common case, inlined
                    rq.append([fr.bytes if size < zc else fr.buffer])
                    self._rq_bytes += size
                    qb += size
                    qm += 1
                    w = self._rx_waiter
                    if w is not None and not w.done():
                        w.set_result(None)
                    continue
                self._queued_bytes, self._queued_msgs = qb, qm
                try:
                    self._slow_message(fr)
                finally:
                    qb, qm = self._queued_bytes, self._queued_msgs
                welcomed = self._handshake.done()
                if self._stopped or (self._paused and not force):
                    return False
            return True
        finally:
            self._queued_bytes, self._queued_msgs = qb, qm

    def _slow_message(self, fr: zmq.Frame) -> None:
        ctl, frames, size = self._rx.body(fr)
        if ctl is not None:
            self._control(ctl, frames)
        elif self._handshake.done():
            self._deliver(frames, size)
        else:
            self._violation(ProtocolError("data before welcome"))

    def _control(self, ctl: bytes, args: list[Any]) -> None:
        if ctl == _WELCOME and not self._handshake.done():
            if args[:1] == [PROTOCOL]:
                self._handshake.set_result(None)
            else:
                self._violation(HandshakeError("listener answered with an unknown protocol version"))
        elif ctl == _WELCOME and self._handshake.cancelled():
            pass  # connect() was cancelled just before the welcome came; its abort() follows
        elif ctl == _BYE:
            reason = bytes(args[0]).decode(errors="replace") if args and args[0] else ""
            what = f"{self.peer_address} closed the connection" + (f" ({reason})" if reason else "")
            self._remote_end(ConnectionClosed(what))
        elif ctl == _MALFORMED and args and isinstance(args[0], ProtocolError):
            self._violation(args[0])
        else:
            self._violation(ProtocolError(f"unexpected control frame {ctl[:16]!r}"))

    def _violation(self, err: ProtocolError) -> None:
        log.warning("zmq listener violated the protocol; closing", peer=self.peer_address, error=str(err))
        closed = ConnectionClosed(f"protocol violation by {self.peer_address}: {err}")
        closed.__cause__ = err
        self._remote_end(closed)

    def _on_event(self, event: int, value: int) -> None:
        if self._stopped:
            return
        with contextlib.suppress(zmq.ZMQError):  # what already arrived is delivered first
            self._drain(1 << 30, force=True)
        name = _EVENT_NAMES.get(event, str(event))
        why = ""
        if not self._handshake.done() and event != zmq.EVENT_CLOSED:
            why = self._handshake_hint(event)
        self._remote_end(ConnectionClosed(f"connection to {self.peer_address} lost ({name}){why}"))

    def _handshake_hint(self, event: int) -> str:
        """Why a dial most likely failed during the ZMTP handshake (security mismatches)."""
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return ": the listener refused this node's CurveZMQ key (not in its curve_allowed_clients)"
        if event not in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
            return ""
        if self._transport.curve:
            return ": CurveZMQ handshake failed; the listener's key is not curve_server_key_file or it is plaintext"
        return ": ZMTP handshake failed; the listener may require CurveZMQ (transport.zmq curve_* keys)"

    def _fatal(self, exc: zmq.ZMQError) -> None:
        self._remote_end(_zmq_error(exc, f"connection to {self.peer_address} failed"))

    def _remote_end(self, exc: TransportError) -> None:
        if not isinstance(exc, ConnectionClosed):
            closed = ConnectionClosed(str(exc))
            closed.__cause__ = exc
            exc = closed
        if self._eof is None and not self._closed:
            self._eof = exc
        if not self._handshake.done():
            err = TransportError(f"cannot connect to {self.peer_address}: {exc}")
            err.__cause__ = exc
            self._handshake.set_exception(err)
            self._handshake.exception()  # mark retrieved: connect() may already have timed out
        self._fail_sends(exc)
        self._wake()
        self._release(0)

    # --- send -------------------------------------------------------------------------------
    def _send_one(self, frame: bytes) -> None:
        _bsend(self._bsock, frame, _NOBLOCK)

    def _try_send(self, parts: list[Any], large: bool) -> list[asyncio.Future[None]] | None:
        try:
            return self._send_parts(parts, large, None)
        except zmq.ZMQError as exc:
            err = _zmq_error(exc, f"send to {self.peer_address}")
            self._remote_end(err)
            raise err from exc

    def _has_pending(self) -> bool:
        return bool(self._sendq)

    def _flush(self) -> bool:
        return self._flush_queue()

    # --- lifecycle --------------------------------------------------------------------------
    async def _connect(self, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                try:  # IMMEDIATE holds the hello until the link is up
                    await self._send_queued([_EMPTY, _HELLO, PROTOCOL], False)
                except TransportError:
                    pass  # the handshake future carries the reason
                await self._handshake
        except TimeoutError:
            self.abort()
            raise TransportError(f"cannot connect to {self.peer_address}: no answer within {timeout:g}s") from None
        except BaseException:
            self.abort()
            raise

    def _release(self, linger_ms: int) -> None:
        if self._stopped:
            return
        self._stop()
        self._monitor.close()
        self._sock.close(linger=linger_ms)
        self._transport._dialers.discard(self)

    def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fail_sends(ConnectionClosed("connection closed"))
        self._drop_queue()
        self._wake()
        self._release(0)

    async def close(self) -> None:
        if self._closed:
            return
        if self._eof is not None or self._stopped:
            self.abort()
            return
        self._closed = True
        self._fail_sends(ConnectionClosed("connection closed"))
        self._drop_queue()
        self._wake()
        # The bye follows all data already handed to zmq; linger lets zmq flush both.
        with contextlib.suppress(zmq.ZMQError):
            self._sock.send_multipart([_EMPTY, _BYE], _NOBLOCK)
        self._release(self._opts.linger_ms)

    def extra_info(self) -> dict[str, Any]:
        return {**super().extra_info(), "socket": "DEALER", "curve": self._transport.curve}


# ======================================================================================
class ZMQTransport(Transport):
    """ZeroMQ transport (ROUTER listener, DEALER per connection); see the module docstring."""

    schemes = ("zmq+tcp", "zmq+ipc")

    def __init__(self, options: dict[str, Any] | None = None, limits: Any = None) -> None:
        super().__init__(options, limits)
        self._opts = _Opts(self.options)
        self._ctx: zmq.Context | None = None
        self._zap: _ZapHandler | None = None
        self._listeners: set[_RouterListener] = set()
        self._dialers: set[_DealerConnection] = set()
        self._tasks: set[asyncio.Task[Any]] = set()  # handler and push-mode tasks; ended in aclose
        self._closed = False

    @classmethod
    def check_available(cls) -> None:
        if zmq.zmq_version_info() < (4, 3, 2):
            raise TransportUnavailable(
                f"zmq transport needs libzmq >= 4.3.2 (reconnect disable, heartbeats); have {zmq.zmq_version()}"
            )

    def _context(self) -> zmq.Context:
        if self._closed:
            raise TransportError("zmq transport is closed")
        if self._ctx is None:
            ctx = zmq.Context(io_threads=self._opts.io_threads)
            ctx.setsockopt(zmq.MAX_SOCKETS, self._opts.max_sockets)
            if self._opts.curve is not None:
                try:  # before any socket exists, so no handshake can happen without it
                    self._zap = _ZapHandler(ctx, asyncio.get_running_loop(), self._opts.curve.allowed)
                except BaseException:
                    ctx.destroy(linger=0)
                    raise
            self._ctx = ctx
        return self._ctx

    @property
    def curve(self) -> bool:
        """True when every socket of this transport speaks CurveZMQ."""
        return self._opts.curve is not None

    def _socket(self, kind: int, *, ipv6: bool, server: bool) -> zmq.Socket:
        o = self._opts
        sock = self._context().socket(kind)
        keys = o.curve
        if keys is not None:
            if server:  # refuses NULL (plaintext) peers; the ZAP handler checks client keys
                sock.setsockopt(zmq.CURVE_SERVER, 1)
                sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
                sock.setsockopt(zmq.ZAP_DOMAIN, _ZAP_DOMAIN)
                with contextlib.suppress(zmq.ZMQError, AttributeError):  # draft option in some builds
                    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
            else:
                sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server)
                sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
                sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
        sock.copy_threshold = 0  # copy-or-not is decided per frame here
        sock.setsockopt(zmq.LINGER, o.linger_ms)
        sock.setsockopt(zmq.SNDHWM, o.sndhwm)
        sock.setsockopt(zmq.RCVHWM, o.rcvhwm)
        sock.setsockopt(zmq.MAXMSGSIZE, max(self.limits.max_frame_bytes, self.limits.max_header_bytes))
        sock.setsockopt(zmq.HANDSHAKE_IVL, int(max(o.connect_timeout, 1.0) * 1000))
        if o.hb_ivl_ms > 0:
            sock.setsockopt(zmq.HEARTBEAT_IVL, o.hb_ivl_ms)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, o.hb_timeout_ms)
            sock.setsockopt(zmq.HEARTBEAT_TTL, o.hb_timeout_ms)
        if ipv6:
            sock.setsockopt(zmq.IPV6, 1)
        return sock

    async def listen(self, url: str, handler: ConnectionHandler) -> Listener:
        endpoint = _endpoint(url, bind=True)
        if endpoint.startswith("ipc://") and _ipc_in_use(endpoint[6:]):
            # libzmq would unlink the file and silently take the path from the live listener
            raise TransportError(f"cannot listen on {url}: address in use")
        sock = self._socket(zmq.ROUTER, ipv6=endpoint.startswith("tcp://["), server=True)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            sock.bind(endpoint)
            bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise _zmq_error(exc, f"cannot listen on {url}") from exc
        address = f"zmq+{bound}"
        listener = _RouterListener(self, sock, address, handler, asyncio.get_running_loop())
        if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
            listener._ipc_file = _IpcFile.created(endpoint[6:])
        self._listeners.add(listener)
        log.debug("zmq listening", address=address)
        return listener

    async def connect(self, url: str, *, timeout: float | None = None) -> Connection:
        endpoint = _endpoint(url, bind=False)
        timeout = self._opts.connect_timeout if timeout is None else timeout
        sock = self._socket(zmq.DEALER, ipv6=endpoint.startswith("tcp://["), server=False)
        sock.setsockopt(zmq.RECONNECT_IVL, -1)  # a dropped link is ConnectionClosed, never re-dialled
        sock.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing towards a link that is not up
        sock.setsockopt(zmq.CONNECT_TIMEOUT, max(1, int(timeout * 1000)))
        conn = _DealerConnection(self, sock, url, asyncio.get_running_loop())
        self._dialers.add(conn)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            conn.abort()
            raise _zmq_error(exc, f"cannot connect to {url}") from exc
        await conn._connect(timeout)
        return conn

    def _own(self, task: asyncio.Task[Any]) -> None:
        """Keep a task this transport started until it ends; aclose waits for it."""
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("zmq transport task failed", task=task.get_name(), error=repr(exc), exc_info=exc)

    async def aclose(self) -> None:
        if self._closed:
            return
        for conn in list(self._dialers):
            conn.abort()
        for listener in list(self._listeners):
            listener._shutdown(None)
        self._closed = True
        if self._tasks:
            # Every connection has ended, so handlers reading them finish by themselves; a
            # handler still busy after a moment is cancelled, and each is awaited.
            me = asyncio.current_task()
            tasks = [t for t in self._tasks if t is not me]
            pending: set[asyncio.Task[Any]] = set()
            if tasks:
                _done, pending = await asyncio.wait(tasks, timeout=1.0)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        if self._zap is not None:
            self._zap.close()
            self._zap = None
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            # term() waits for lingering sockets to flush (bounded by `linger`): not on the loop.
            await asyncio.get_running_loop().run_in_executor(None, ctx.term)
