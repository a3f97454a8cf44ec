"""Lock leases with fencing tokens: the table a lock's primary keeps (pure, injected clock).

Why fencing tokens: a lease-based lock cannot stop a holder that was paused (GC, swap, a
partition) from acting after its lease ended; the token it was granted can. Each grant of a
lock name gets a token strictly above every earlier one for that name, and a store that
remembers the highest token it accepted (``cache.put(..., fence=lease)``) refuses the old
holder's late writes (Kleppmann, "How to do distributed locking").

Why a dead holder keeps the lock until its lease ends: the table cannot tell a dead holder
from a partitioned one, and handing the lock over early would give two live holders.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.ports import Clock


@dataclass(slots=True)
class Held:
    """A granted lease: who holds ``name`` with which token until when (table clock)."""

    owner: str
    token: int
    expires: float


@dataclass(frozen=True, slots=True)
class Granted:
    token: int
    ttl: float


@dataclass(frozen=True, slots=True)
class Busy:
    """The lock is held; it frees in ``remaining`` seconds at the latest (unless renewed)."""

    remaining: float
    token: int


class LeaseTable:
    """Leases and the highest token issued, per lock name."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.tokens: dict[str, int] = {}  # name -> highest token ever issued (kept after release)
        self.held: dict[str, Held] = {}

    def current(self, name: str) -> Held | None:
        """The unexpired lease of ``name``, if any."""
        h = self.held.get(name)
        if h is not None and h.expires <= self.clock():
            del self.held[name]
            return None
        return h

    def acquire(self, name: str, owner: str, ttl: float) -> Granted | Busy:
        """Grant ``name`` to ``owner`` for ``ttl`` s if free (or already ``owner``'s: re-entrant
        grants are refused as Busy, a holder renews instead)."""
        if not ttl > 0:
            raise ValueError("a lease ttl must be positive")
        h = self.current(name)
        if h is not None:
            return Busy(h.expires - self.clock(), h.token)
        token = self.tokens.get(name, 0) + 1
        self.tokens[name] = token
        self.held[name] = Held(owner, token, self.clock() + ttl)
        return Granted(token, ttl)

    def renew(self, name: str, token: int, ttl: float) -> bool:
        """Extend the lease ``token`` of ``name`` to ``ttl`` s from now; False if it ended."""
        h = self.current(name)
        if h is None or h.token != token:
            return False
        h.expires = self.clock() + ttl
        return True

    def release(self, name: str, token: int) -> bool:
        """End the lease ``token`` early; False if it already ended."""
        h = self.current(name)
        if h is None or h.token != token:
            return False
        del self.held[name]
        return True

    def valid(self, name: str, token: int) -> bool:
        """Whether ``token`` is the live lease of ``name`` (what a fenced write checks)."""
        h = self.current(name)
        return h is not None and h.token == token

    # ------------------------------------------------------------------ replication
    def record(self, name: str) -> list[object]:
        """``[name, highest token, owner | "", ttl left | -1]``: what replicas are sent."""
        h = self.current(name)
        if h is None:
            return [name, self.tokens.get(name, 0), "", -1.0]
        return [name, self.tokens.get(name, 0), h.owner, max(h.expires - self.clock(), 0.0)]

    def apply(self, rec: list[object]) -> None:
        """Take a replica record. The lease's end is counted from *now* on this node's clock,
        i.e. no earlier than the primary's (the record took time to arrive), so a replica that
        takes over never frees a lock before the lease the primary granted has ended."""
        name, token, owner, left = rec
        name, token = str(name), int(token)  # type: ignore[call-overload]
        if token < self.tokens.get(name, 0):
            return  # older than what this table knows
        self.tokens[name] = token
        if owner:
            self.held[name] = Held(str(owner), token, self.clock() + float(left))  # type: ignore[arg-type]
        else:
            h = self.held.get(name)
            if h is not None and h.token <= token:
                del self.held[name]

    def names(self) -> list[str]:
        return list(self.tokens)

    def forget(self, name: str) -> None:
        self.tokens.pop(name, None)
        self.held.pop(name, None)


__all__ = ["Busy", "Granted", "Held", "LeaseTable"]
