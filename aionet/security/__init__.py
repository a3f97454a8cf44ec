"""Security: the cluster token, the loopback rule for token-less nodes, TLS contexts and test
key generation (``aionet keys``). Pure helpers below the transports and the node."""

from .keys import KeygenError, KeySet, curve_keypair, generate, new_token, tls_backend
from .local import is_local_address, is_local_host, is_loopback_host
from .tls import check_tls13, make_context
from .token import load_token

__all__ = [
    "KeySet",
    "KeygenError",
    "check_tls13",
    "curve_keypair",
    "generate",
    "is_local_address",
    "is_local_host",
    "is_loopback_host",
    "load_token",
    "make_context",
    "new_token",
    "tls_backend",
]
