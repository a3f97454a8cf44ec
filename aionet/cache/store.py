"""One node's cache memory: versioned entries, a byte budget with LRU eviction, TTLs.

Pure state (no I/O, no asyncio): the service feeds it writes and reads with an injected
clock. Why a version *floor*: an entry that leaves this store (deleted, expired, evicted)
must not let its key's version start again at 1, or a ``cas`` holding the old version could
succeed against a different value. Every forgotten version raises the floor, and a new
version is always above both the key's own and the floor: versions rise, not consecutively.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..core.ports import Clock
from .errors import CacheFull

ENTRY_OVERHEAD = 96  # bytes counted per entry besides its value (key, record, dict slot)

try:  # numpy is optional for the cache; arrays are recognised only when it is installed
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None  # type: ignore[assignment]


@dataclass(slots=True)
class Entry:
    """A stored value and what the cache knows about it."""

    value: Any
    version: int
    nbytes: int
    expires: float | None = None  # clock time; None: no TTL
    pinned: bool = False  # never evicted (still expires, still deletable)
    fences: dict[str, int] = field(default_factory=dict)  # lock name -> highest token that wrote it


def sizeof(value: Any, _depth: int = 0) -> int:
    """Bytes a value is counted as against the budget: exact for buffers and arrays, an
    estimate for containers (a cheap walk, bounded in depth; no serialization)."""
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if isinstance(value, memoryview):
        return value.nbytes
    if _np is not None and isinstance(value, _np.ndarray):
        return int(value.nbytes)
    if _depth < 4:
        if isinstance(value, (list, tuple, set, frozenset)):
            return 8 * len(value) + sum(sizeof(v, _depth + 1) for v in value)
        if isinstance(value, dict):
            return sum(16 + sizeof(k, _depth + 1) + sizeof(v, _depth + 1) for k, v in value.items())
    return sys.getsizeof(value, 64)


def freeze(value: Any, copy: bool) -> Any:
    """The form a value is stored in: numpy arrays read-only (copied first when ``copy``:
    the caller's array must not change the cached one behind the cache's back)."""
    if _np is not None and isinstance(value, _np.ndarray):
        if copy:
            value = value.copy()
        elif value.flags.writeable:
            value = value.view()
        value.flags.writeable = False
    return value


class Store:
    """Entries by key. Unpinned entries sit in LRU order and are evicted, oldest use first,
    when a write would exceed ``max_bytes``; pinned ones are never evicted (a write that
    cannot fit beside them raises :class:`CacheFull`)."""

    def __init__(self, max_bytes: int, clock: Clock) -> None:
        self.max_bytes = max_bytes
        self.clock = clock
        self._lru: OrderedDict[str, Entry] = OrderedDict()
        self._pinned: dict[str, Entry] = {}
        self.nbytes = 0
        self.pinned_bytes = 0
        self.floor = 0  # every version this store forgot is <= floor
        self.expiring = 0  # entries with a TTL: sweep scans nothing while there are none
        self.evictions = 0
        self.expirations = 0

    # ------------------------------------------------------------------ reads
    def __len__(self) -> int:
        return len(self._lru) + len(self._pinned)

    def __contains__(self, key: str) -> bool:
        return self.peek(key) is not None

    def peek(self, key: str) -> Entry | None:
        """The live entry, without touching its LRU position."""
        e = self._lru.get(key)
        if e is None:
            e = self._pinned.get(key)
            if e is None:
                return None
        if e.expires is not None and e.expires <= self.clock():
            self._forget(key, e)
            self.expirations += 1
            return None
        return e

    def get(self, key: str) -> Entry | None:
        """The live entry, marked as just used."""
        e = self.peek(key)
        if e is not None and not e.pinned:
            self._lru.move_to_end(key)
        return e

    def version(self, key: str) -> int:
        """The key's version here; 0 when absent."""
        e = self.peek(key)
        return e.version if e is not None else 0

    def next_version(self, key: str) -> int:
        """The version the next write of ``key`` gets (decided by the key's primary)."""
        return max(self.version(key), self.floor) + 1

    def items(self) -> Iterator[tuple[str, Entry]]:
        """A snapshot of the live entries (safe to mutate the store while iterating)."""
        now = self.clock()
        for key, e in [*self._pinned.items(), *self._lru.items()]:
            if e.expires is None or e.expires > now:
                yield key, e

    def ttl_left(self, e: Entry) -> float | None:
        return None if e.expires is None else max(e.expires - self.clock(), 0.0)

    # ------------------------------------------------------------------ writes
    def apply(
        self,
        key: str,
        value: Any,
        version: int,
        *,
        ttl: float | None = None,
        pinned: bool = False,
        fences: dict[str, int] | None = None,
        nbytes: int | None = None,
    ) -> bool:
        """Store ``value`` as ``version`` of ``key`` unless this store already holds that
        version or a newer one (replicas may see a write twice, never go back).
        Raises :class:`CacheFull` when it cannot fit beside the pinned entries."""
        old = self.peek(key)
        if old is not None and old.version >= version:
            return False
        size = (sizeof(value) if nbytes is None else nbytes) + ENTRY_OVERHEAD
        if size > self.max_bytes - self.pinned_bytes and size > self.max_bytes - self._pinned_bytes(exclude=key):
            raise self._full(key, size)
        if old is not None:
            self._drop(key, old)
        expires = None if ttl is None else self.clock() + ttl
        e = Entry(value, version, size, expires, pinned, dict(fences or {}))
        if expires is not None:
            self.expiring += 1
        (self._pinned if pinned else self._lru)[key] = e
        self.nbytes += size
        if pinned:
            self.pinned_bytes += size
        if self.nbytes > self.max_bytes:
            self._evict()
        return True

    def update(self, key: str, e: Entry, value: Any, version: int) -> None:
        """Write ``version`` (newer than ``e``'s) of an unpinned key whose live entry is ``e``,
        with no TTL and its fences kept: the common put, changing the entry in place (no new
        entry, no second lookup). Raises :class:`CacheFull` as :meth:`apply` does."""
        size = sizeof(value) + ENTRY_OVERHEAD
        if size > self.max_bytes - self.pinned_bytes:
            raise self._full(key, size)
        self.nbytes += size - e.nbytes
        if e.expires is not None:
            self.expiring -= 1
        e.value, e.version, e.nbytes, e.expires = value, version, size, None
        self._lru.move_to_end(key)
        if self.nbytes > self.max_bytes:
            self._evict()

    def remove(self, key: str, version: int) -> bool:
        """Delete ``key`` as of ``version`` (a replicated delete): later versions only."""
        self.floor = max(self.floor, version)
        e = self.peek(key)
        if e is None or e.version >= version:
            return False
        self._drop(key, e)
        return True

    def discard(self, key: str) -> None:
        """Forget a copy this node no longer replicates (its version still raises the floor)."""
        e = self._lru.get(key) or self._pinned.get(key)
        if e is not None:
            self._forget(key, e)

    def sweep(self, limit: int = 1000) -> int:
        """Remove up to ``limit`` expired entries (reads also drop them lazily); no scan
        while no entry has a TTL (the sweep runs every second, whatever the store holds)."""
        if not self.expiring:
            return 0
        now = self.clock()
        dead = [k for k, e in [*self._pinned.items(), *self._lru.items()] if e.expires is not None and e.expires <= now]
        for k in dead[:limit]:
            self.peek(k)
        return min(len(dead), limit)

    # ------------------------------------------------------------------ internals
    def _full(self, key: str, size: int) -> CacheFull:
        return CacheFull(
            f"cache entry {key!r} ({size} bytes) does not fit in this node's cache budget "
            f"(cache.max_bytes = {self.max_bytes}, {self._pinned_bytes()} bytes pinned): raise cache.max_bytes "
            f"or unpin entries"
        )

    def _pinned_bytes(self, exclude: str | None = None) -> int:
        total = self.pinned_bytes
        if exclude is not None and exclude in self._pinned:
            total -= self._pinned[exclude].nbytes
        return total

    def _drop(self, key: str, e: Entry) -> None:
        (self._pinned if e.pinned else self._lru).pop(key, None)
        self.nbytes -= e.nbytes
        if e.expires is not None:
            self.expiring -= 1
        if e.pinned:
            self.pinned_bytes -= e.nbytes

    def _forget(self, key: str, e: Entry) -> None:
        self._drop(key, e)
        self.floor = max(self.floor, e.version)

    def _evict(self) -> None:
        while self.nbytes > self.max_bytes and self._lru:
            key, e = next(iter(self._lru.items()))
            self._forget(key, e)
            self.evictions += 1


__all__ = ["ENTRY_OVERHEAD", "Entry", "Store", "freeze", "sizeof"]
