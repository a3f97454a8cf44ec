"""TLS transport (``tls://host:port``): the TCP transport with TLS 1.3 from the ``ssl`` module.

Everything about framing, batching, back-pressure and limits is :mod:`aionet.transports.tcp`
(the connection: :mod:`aionet.transports.tcp_connection`);
this module only supplies the SSL contexts (built by :mod:`aionet.security.tls`) through
TCPTransport's ``_server_ssl`` / ``_client_ssl`` hooks and reports the negotiated TLS session in ``stats().extra``.

Options (``[transport] tls = {...}``; the node fills ``cert``/``key``/``ca`` from
``security.tls_cert`` / ``tls_key`` / ``tls_ca`` and the table overrides them):

* ``cert``, ``key`` -- PEM certificate (chain) and private key of this node; required. The
  same pair is used when accepting and, for mutual TLS, when dialing.
* ``ca`` -- PEM CA bundle. When set, TLS is mutual: a listener requires a client certificate
  signed by it, and a dialer verifies the listener's certificate against it. When unset,
  connections are encrypted but certificates are not verified (the cluster token still
  authenticates peers, but an active man-in-the-middle is not excluded).
* ``check_hostname`` (False) -- also match the listener's certificate against the host of the
  URL dialed (needs ``ca``). Off by default: nodes are often dialed by IP, and with a private
  cluster CA every certificate it signed belongs to a cluster member.
* plus every ``tcp`` option (``nodelay``, ``max_queued_bytes``, ...).

Only TLS 1.3 is offered or accepted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import TransportUnavailable
from ..security.tls import HOW_TO, check_tls13, make_context
from ..stats import ConnectionStats
from .base import Address
from .options import Option, boolean, number, parse_options, positive, string
from .tcp import SCHEMA as TCP_SCHEMA
from .tcp import TCPConnection, TCPTransport

if TYPE_CHECKING:
    from ..config import LimitsSection

#: TLS-specific options; every TCP option is accepted as well.
TLS_SCHEMA: MappingProxyType[str, Option] = MappingProxyType(
    {
        "cert": Option("", string),
        "key": Option("", string),
        "ca": Option("", string),
        "check_hostname": Option(False, boolean),
        # Seconds a TLS handshake may take before the connection is dropped (a peer that opens a
        # socket and sends nothing must not hold it open). A Node sets it to link.handshake_timeout.
        "handshake_timeout": Option(10.0, number, positive, "must be positive"),
    }
)


class TLSConnection(TCPConnection):
    """A TCP connection whose transport is an SSL transport; addresses read ``tls://``."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # The accept handler runs as a task scheduled from super(): it sees these already.
        self.local_address = _tls_url(self.local_address)
        self.peer_address = _tls_url(self.peer_address)

    def stats(self) -> ConnectionStats:
        st = super().stats()
        info = dict(st.extra)
        t = self._transport
        sslobj = t.get_extra_info("ssl_object") if t is not None else None
        if sslobj is not None:
            cipher = sslobj.cipher()
            info["tls_version"] = sslobj.version()
            info["tls_cipher"] = cipher[0] if cipher else None
            peer = sslobj.getpeercert()
            if peer:
                subject = dict(x[0] for x in peer.get("subject", ()))
                info["tls_peer_subject"] = subject.get("commonName", "")
        return dataclasses.replace(st, extra=info)


def _tls_url(url: str) -> str:
    return "tls://" + url[len("tcp://") :] if url.startswith("tcp://") else url


class TLSTransport(TCPTransport):
    """``tls://`` listeners and connections: aionet framing over TLS 1.3."""

    schemes: ClassVar[tuple[str, ...]] = ("tls",)

    def __init__(self, options: dict[str, Any] | None = None, limits: LimitsSection | None = None):
        opts = parse_options("tls", {**TCP_SCHEMA, **TLS_SCHEMA}, options)
        super().__init__({k: v for k, v in opts.items() if k in TCP_SCHEMA}, limits)
        self.tls_options: dict[str, Any] = {k: v for k, v in opts.items() if k in TLS_SCHEMA}
        self.check_available(self.tls_options)
        self._cert = opts["cert"]
        self._key = opts["key"]
        self._ca = opts["ca"]
        self._check_hostname = opts["check_hostname"]
        self._handshake_timeout = opts["handshake_timeout"]
        self._server_ctx = make_context(self._cert, self._key, self._ca, server=True)
        self._client_ctx = make_context(
            self._cert, self._key, self._ca, server=False, check_hostname=self._check_hostname
        )

    @classmethod
    def check_available(cls, options: dict[str, Any] | None = None) -> None:
        """Raise TransportUnavailable if Python's ssl lacks TLS 1.3 or, when ``options`` are
        given (the constructor passes its own), if no certificate and key are configured."""
        check_tls13()
        if options is not None:
            missing = [k for k in ("cert", "key") if not options.get(k)]
            if missing:
                raise TransportUnavailable(f"tls:// has no {' and no '.join(missing)} configured: {HOW_TO}")

    # ---------------------------------------------------------------- TCPTransport hooks
    def _server_ssl(self) -> ssl.SSLContext:
        return self._server_ctx

    def _client_ssl(self, addr: Address) -> ssl.SSLContext:
        return self._client_ctx

    def _ssl_handshake_timeout(self) -> float | None:
        return self._handshake_timeout

    def _connection(self, loop: asyncio.AbstractEventLoop, cb: Any = None) -> TCPConnection:
        return TLSConnection(loop, self._opts, self.limits, cb)
