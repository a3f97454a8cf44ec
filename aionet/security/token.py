"""The cluster token: the shared secret every handshake proves (``[security] token`` / ``token_file``).

Environment overrides (``AIONET_SECURITY_TOKEN``, ``AIONET_SECURITY_TOKEN_FILE``) are applied
by :mod:`aionet.config` like any other key; this module turns the resulting section into bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..config import SecuritySection


def load_token(security: SecuritySection) -> bytes | None:
    """The cluster secret, from ``security.token`` or else ``security.token_file``; None if
    neither is set (the node then accepts peers on this host only, see :mod:`.local`).

    The file's content is stripped, so a trailing newline written by an editor or ``echo``
    does not split a cluster. A missing or unreadable file is a :class:`ConfigError` that
    says how to make one."""
    if security.token:
        return security.token.encode()
    if not security.token_file:
        return None
    path = Path(security.token_file)
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        full = path.resolve()
        keys = f"aionet keys {full.parent}" if full.name == "token" else "aionet keys DIR"
        raise ConfigError(
            f"security.token_file: {full} does not exist; `{keys}` writes a cluster token "
            "(with TLS and CurveZMQ test keys)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"security.token_file: cannot read {path}: {exc.strerror or exc}") from exc
