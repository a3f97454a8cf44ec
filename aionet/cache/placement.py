"""Which nodes hold a key: rendezvous (highest random weight) hashing over alive members.

Why rendezvous: every node computes the same replica list from the same member set with no
coordination, and a member leaving moves only the keys it held (each key's other replicas
keep their rank), a member joining takes only the keys it now ranks first or second for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

_CACHE_MAX = 65536  # memoized placements (cleared when the member set changes)


def score(key: str, node: str) -> int:
    """A node's weight for a key: a 64-bit hash of both (stable across processes)."""
    h = hashlib.blake2b(key.encode(), digest_size=8, key=node.encode()[:64])
    return int.from_bytes(h.digest(), "big")


def rank(key: str, nodes: Iterable[str]) -> list[str]:
    """``nodes`` ordered by their weight for ``key``, highest (the primary) first."""
    return sorted(nodes, key=lambda n: (score(key, n), n), reverse=True)


class Placement:
    """The replica lists for one member set; ``update`` swaps the set."""

    def __init__(self, members: Iterable[str], replicas: int) -> None:
        if replicas < 1:
            raise ValueError("replicas must be at least 1")
        self.replicas = replicas
        self.members: frozenset[str] = frozenset(members)
        self._memo: dict[str, tuple[str, ...]] = {}

    def update(self, members: Iterable[str]) -> bool:
        """Use a new member set; True when it differs from the current one."""
        new = frozenset(members)
        if new == self.members:
            return False
        self.members = new
        self._memo.clear()
        return True

    def owners(self, key: str) -> tuple[str, ...]:
        """The key's replicas, primary first (fewer when fewer members are alive)."""
        got = self._memo.get(key)
        if got is None:
            got = tuple(rank(key, self.members)[: self.replicas])
            if len(self._memo) >= _CACHE_MAX:
                self._memo.clear()
            self._memo[key] = got
        return got

    def primary(self, key: str) -> str:
        return self.owners(key)[0]


def owners_in(key: str, members: Iterable[str], replicas: int) -> tuple[str, ...]:
    """The replicas of ``key`` in an arbitrary member set (no memo)."""
    return tuple(rank(key, members)[:replicas])


__all__ = ["Placement", "owners_in", "rank", "score"]
