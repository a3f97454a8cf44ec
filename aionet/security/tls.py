"""TLS contexts for ``tls://``: TLS 1.3 only, the node's certificate on both sides, and mutual
verification against a cluster CA when one is configured.

The transport (:mod:`aionet.transports.tls`) validates its options and asks here for the two
contexts; keeping the policy in one place lets other users of TLS (an HTTP endpoint, a future
transport) apply the same rules.
"""

from __future__ import annotations

import os
import ssl

from ..errors import ConfigError, TransportUnavailable

HOW_TO = (
    "set security.tls_cert and security.tls_key (or [transport] tls = {cert = ..., key = ...}); "
    "`aionet keys DIR` writes a test CA, certificate and key"
)


def check_tls13() -> None:
    """Raise TransportUnavailable if this Python's ``ssl`` cannot speak TLS 1.3."""
    if not getattr(ssl, "HAS_TLSv1_3", False):
        raise TransportUnavailable(f"tls:// needs TLS 1.3; this Python's {ssl.OPENSSL_VERSION} lacks it")


def make_context(cert: str, key: str, ca: str = "", *, server: bool, check_hostname: bool = False) -> ssl.SSLContext:
    """An SSL context for one side of a ``tls://`` connection.

    ``cert``/``key`` are PEM files used on both sides (the client presents them for mutual TLS).
    With ``ca``, the peer's certificate must be signed by it (a listener requires a client
    certificate); without, traffic is encrypted but unverified and the cluster token alone
    authenticates peers. ``check_hostname`` (client side) also matches the dialed host and
    needs ``ca``. Unreadable files raise TransportUnavailable naming the file."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    try:
        ctx.load_cert_chain(cert, key)
    except FileNotFoundError:  # ssl does not say which file: name it
        pairs = (("certificate", cert), ("key", key))
        missing = ", ".join(f"{what} {p}" for what, p in pairs if not os.path.exists(p)) or cert
        raise TransportUnavailable(
            f"tls:// file not found: {missing}; `aionet keys DIR` writes a test CA, certificate and key"
        ) from None
    except (ssl.SSLError, OSError) as exc:
        raise TransportUnavailable(f"tls:// cannot load certificate {cert!r} with key {key!r}: {exc}") from None
    if ca:
        try:
            ctx.load_verify_locations(cafile=ca)
        except FileNotFoundError:
            raise TransportUnavailable(f"tls:// CA file not found: {ca}") from None
        except (ssl.SSLError, OSError) as exc:
            raise TransportUnavailable(f"tls:// cannot load CA file {ca!r}: {exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
        if not server:
            ctx.check_hostname = check_hostname
    elif server:
        ctx.verify_mode = ssl.CERT_NONE
    else:
        if check_hostname:
            raise ConfigError("transport.tls.check_hostname needs a CA (security.tls_ca) to verify against")
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx
