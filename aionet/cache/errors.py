"""Errors the cache raises to users (all :class:`aionet.AionetError`)."""

from __future__ import annotations

from ..errors import AionetError


class CacheError(AionetError):
    """Base class of the cache's errors."""


class StaleFenceError(CacheError):
    """A write carried a lock's fencing token that is no longer current: the lease it came
    from ended (expired, released, or another holder was granted the lock since)."""


class LockLost(CacheError):
    """The lease could not be renewed: it ended, and another holder may have the lock."""


class CacheFull(CacheError):
    """A value does not fit in the node's cache budget beside its pinned entries
    (raise ``cache.max_bytes``, or unpin entries)."""


#: remote exception type names -> the local class, so a caller sees the same type the
#: key's primary raised (remote failures arrive as RemoteError carrying the type name)
BY_NAME = {f"{__name__}.{c.__qualname__}": c for c in (StaleFenceError, LockLost, CacheFull)}

__all__ = ["BY_NAME", "CacheError", "CacheFull", "LockLost", "StaleFenceError"]
