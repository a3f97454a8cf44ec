"""aionet URLs to zmq endpoints, and the ipc socket files a listener owns."""

from __future__ import annotations

import ipaddress
import os
import re
import socket as _socket
import stat
import tempfile
from dataclasses import dataclass

import zmq

from ...errors import ConfigError, TransportError
from ...log import get_logger
from ..base import Address

log = get_logger("aionet.transports.zmq")


def zmq_endpoint(url: str, *, bind: bool) -> str:
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


def ipc_in_use(path: str) -> bool:
    if not os.path.exists(path):
        return False
    with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return False  # a stale file left by a dead process: libzmq replaces it
    return True


@dataclass(frozen=True)
class IpcFile:
    """The socket file a listener's bind created, identified by device and inode.

    libzmq removes only the files of its own ``ipc://*`` directories, so each listener
    removes its file when it closes, and only if the path still holds the very file its
    bind made (another process may have bound the path since: that file is not ours)."""

    path: str
    dev: int
    ino: int

    @classmethod
    def created(cls, path: str) -> IpcFile | None:
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
