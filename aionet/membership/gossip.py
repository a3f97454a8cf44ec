"""Dissemination, pure: which membership updates ride on the next messages, and how often.

Why a transmit-limited queue (memberlist's ``queue.go``): an update must reach everyone with
high probability, which ``GOSSIP_MULT * log2(n)`` relays achieve, and then stop costing bytes.
Only the newest update per member is kept, so the queue is bounded by the member table
(``MAX_MEMBERS``) however much a peer gossips.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from .load import LoadReport
from .table import ALIVE, Member, Update

GOSSIP_MULT = 3  # retransmissions per update = GOSSIP_MULT * ceil(log2(n + 1))
LOADS_PER_MESSAGE = 2  # other members' load reports relayed per HB/ACK


def gossip_budget(n_members: int) -> int:
    """How many times each update is piggybacked in a cluster of ``n_members``."""
    return GOSSIP_MULT * max(1, math.ceil(math.log2(n_members + 1)))


class GossipQueue:
    """Updates waiting to be piggybacked; the least-sent go first, each until its budget is spent.
    Only the newest update per member is kept (an older one is not worth sending)."""

    def __init__(self) -> None:
        self._items: dict[str, list[Any]] = {}  # name -> [Update, times_sent]

    def push(self, u: Update) -> None:
        self._items[u.name] = [u, 0]

    def take(self, limit: int, budget: int) -> list[Update]:
        if not self._items or limit <= 0:
            return []
        chosen = sorted(self._items.values(), key=lambda it: it[1])[:limit]
        out = []
        for it in chosen:
            out.append(it[0])
            it[1] += 1
            if it[1] >= budget:
                self._items.pop(it[0].name, None)
        return out

    def __len__(self) -> int:
        return len(self._items)


def load_entry(m: Member, now: float) -> list[Any]:
    """A member's last load report as relayed: [name, node_id, age_ms, report]."""
    assert m.load is not None and m.load_time is not None
    return [m.name, m.node_id, int((now - m.load_time) * 1000), m.load.to_wire()]


def sync_reply(me: Update, own: LoadReport, members: Iterable[Member], now: float) -> dict[str, Any]:
    """What a joiner gets back on first contact: every member's record and the load reports."""
    members = list(members)
    loads = [load_entry(m, now) for m in members if m.load is not None and m.load_time is not None and m.state == ALIVE]
    loads.append([me.name, me.node_id, 0, own.to_wire()])
    return {"members": [me.to_wire()] + [m.update().to_wire() for m in members], "loads": loads}


class LoadRelay:
    """Which load reports ride on the next HB/ACK to a peer: our own when that peer has not
    had this version yet, plus LOADS_PER_MESSAGE other members' reports, round-robin (so every
    report spreads without any one message growing with the cluster)."""

    def __init__(self) -> None:
        self._sent: dict[str, int] = {}  # peer -> seq of our report it last got
        self._rr = 0

    def own_for(self, peer: str, rep: LoadReport) -> Any:
        if self._sent.get(peer) == rep.seq:
            return None
        self._sent[peer] = rep.seq
        return rep.to_wire()

    def others_for(self, peer: str, members: dict[str, Member], now: float) -> list[Any]:
        names = [n for n, m in members.items() if m.load is not None and n != peer and m.state == ALIVE]
        if not names:
            return []
        out = []
        for _ in range(min(LOADS_PER_MESSAGE, len(names))):
            self._rr = (self._rr + 1) % len(names)
            out.append(load_entry(members[names[self._rr]], now))
        return out

    def forget(self, name: str) -> None:
        self._sent.pop(name, None)


__all__ = ["GOSSIP_MULT", "LOADS_PER_MESSAGE", "GossipQueue", "LoadRelay", "gossip_budget", "load_entry"]
