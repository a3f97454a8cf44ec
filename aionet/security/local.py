"""The loopback rule: which peers count as "on this host".

A node without a cluster token accepts only local peers (and warns when it listens beyond
this host), and a node recognises its own listen URLs among seed URLs. Both need the same
answer to "is this address this machine?", defined here once.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

#: Schemes whose endpoints cannot leave this host.
LOCAL_SCHEMES = frozenset({"inproc", "zmq+ipc"})


def _scheme_host(address: str) -> tuple[str, str] | None:
    """(scheme, host) of a transport URL, parsed as :meth:`aionet.transports.Address.parse`
    does (lower-case scheme and host, IPv6 without brackets); None if it is not one."""
    if "://" not in address:
        return None
    try:
        parts = urlsplit(address)
        parts.port  # noqa: B018 - a bad port makes the URL invalid, as Address.parse says
    except ValueError:
        return None
    return parts.scheme.lower(), parts.hostname or ""


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (127.0.0.0/8, ::1). No DNS lookup."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_local_address(address: str) -> bool:
    """True for peers on this host: loopback IPs, ``localhost``, inproc and ipc endpoints.

    This is what a node without a cluster token accepts; anything unparsable is not local."""
    parsed = _scheme_host(address)
    if parsed is None:
        return False
    scheme, host = parsed
    return scheme in LOCAL_SCHEMES or is_loopback_host(host)


def is_local_host(host: str) -> bool:
    """True if ``host`` is this machine: loopback, its host name, or an IP bound here (checked
    by binding to it, which needs no DNS)."""
    if is_loopback_host(host) or host == socket.gethostname():
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False
