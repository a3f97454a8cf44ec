"""The member table and its merge rules, pure: updates in, effects out (no sockets, no sleeps).

Why pure: the merge decides everything membership believes (who joined, who restarted, who is
dead) and used to be testable only through live clusters. Here it takes an :class:`Update` and
the current time and returns what changed plus the effects the service must perform (emit an
event, spread the news, fail the link, verify a rumour), in the order it must perform them.

Precedence, as in SWIM: for one process a higher incarnation always wins; at equal
incarnation the stronger state wins (left > dead > suspect > alive). Every change of a
member's gossiped state goes through :meth:`MemberTable._transition`, which checks the edge
against :data:`TRANSITIONS` and raises :class:`InvalidTransition` on any other (a bug).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..errors import AionetError, ProtocolError
from .load import LoadReport


class MemberState(StrEnum):
    """A member's gossiped state. Declaration order is the wire code and the precedence."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


ALIVE, SUSPECT, DEAD, LEFT = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT
STATES: tuple[MemberState, ...] = tuple(MemberState)  # wire code = index; also the precedence order
_RANK = {s: i for i, s in enumerate(STATES)}

# (from, to) -> does the edge need a newer incarnation? Upward edges (by precedence) happen at
# the same incarnation (a rumour, a verdict, a goodbye); downward ones only when the member
# refutes (bumps its incarnation) or a restarted process (which starts above its old self)
# replaces it. Anything not listed, e.g. dead -> alive at the same incarnation, is a bug.
TRANSITIONS: dict[tuple[MemberState, MemberState], bool] = {
    (ALIVE, SUSPECT): False,  # suspected
    (ALIVE, DEAD): False,  # declared dead
    (ALIVE, LEFT): False,  # said goodbye
    (SUSPECT, DEAD): False,  # the suspicion was confirmed
    (SUSPECT, LEFT): False,
    (DEAD, LEFT): False,  # a goodbye outranks a death
    (SUSPECT, ALIVE): True,  # refuted
    (DEAD, ALIVE): True,  # refuted (it was only frozen or cut off) or restarted
    (DEAD, SUSPECT): True,  # refuted, then suspected again before we heard the refutation
    (LEFT, ALIVE): True,  # rejoined (restarted)
    (LEFT, SUSPECT): True,
    (LEFT, DEAD): True,
}

MAX_MEMBERS = 16384  # member records kept; updates about further new names are ignored
MAX_ADDRESSES = 16


class InvalidTransition(AionetError):
    """A member state change not in :data:`TRANSITIONS` (a bug in the merge, never input)."""


def check_transition(old: MemberState, new: MemberState, newer: bool) -> None:
    """Raise :class:`InvalidTransition` unless ``old -> new`` is allowed (``newer``: the
    change comes with a higher incarnation)."""
    if old == new:
        return
    needs_newer = TRANSITIONS.get((old, new))
    if needs_newer is None or (needs_newer and not newer):
        raise InvalidTransition(f"member state {old} -> {new} {'with' if newer else 'without'} a newer incarnation")


@dataclass(frozen=True)
class Update:
    """One member's state as gossiped."""

    name: str
    node_id: str
    incarnation: int
    state: MemberState
    addresses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if type(self.state) is not MemberState:  # a plain "alive" from user code or tests
            object.__setattr__(self, "state", MemberState(self.state))

    def to_wire(self) -> list[Any]:
        return [self.name, self.node_id, self.incarnation, _RANK[self.state], list(self.addresses)]

    @classmethod
    def from_wire(cls, w: Any) -> Update:
        if type(w) is not list or len(w) != 5:
            raise ProtocolError("membership update is not a 5-element list")
        name, node_id, inc, code, addrs = w
        if not isinstance(name, str) or not 0 < len(name) <= 256:
            raise ProtocolError("membership update: bad name")
        if not isinstance(node_id, str) or len(node_id) > 256:
            raise ProtocolError("membership update: bad node id")
        if type(inc) is not int or inc < 0:
            raise ProtocolError("membership update: bad incarnation")
        if type(code) is not int or not 0 <= code < len(STATES):
            raise ProtocolError("membership update: bad state")
        if (
            not isinstance(addrs, list)
            or len(addrs) > MAX_ADDRESSES
            or not all(isinstance(a, str) and len(a) <= 1024 for a in addrs)
        ):
            raise ProtocolError("membership update: bad addresses")
        return cls(name, node_id, inc, STATES[code], tuple(addrs))


def supersedes(new: Update, old: Update | None) -> bool:
    """Does ``new`` replace ``old`` in the member table? (Same name assumed.)

    A higher incarnation always wins, also across processes (a restarted node starts above its
    old self). At equal incarnation of the same process the stronger state wins
    (left > dead > suspect > alive), so a suspicion is only lifted by the node itself
    refuting it with a higher incarnation. Equal incarnations of different processes: keep old.
    """
    if old is None:
        return True
    if new.incarnation != old.incarnation:
        return new.incarnation > old.incarnation
    if new.node_id != old.node_id:
        return False
    return _RANK[new.state] > _RANK[old.state]


def ring_successors(names: Iterable[str], me: str, k: int) -> list[str]:
    """The ``k`` members after ``me`` on the ring sorted by name (whom ``me`` heartbeats)."""
    ring = sorted(set(names) | {me})
    n, i = len(ring), ring.index(me)
    return [ring[(i + j) % n] for j in range(1, min(k, n - 1) + 1)]


def ring_predecessors(names: Iterable[str], me: str, k: int) -> list[str]:
    """The ``k`` members before ``me`` on the ring (who heartbeat ``me``)."""
    ring = sorted(set(names) | {me})
    n, i = len(ring), ring.index(me)
    return [ring[(i - j) % n] for j in range(1, min(k, n - 1) + 1)]


@dataclass
class Member:
    """This node's view of one other member."""

    name: str
    node_id: str
    incarnation: int
    state: MemberState  # as gossiped; changed only by MemberTable._transition
    addresses: list[str]
    since: float  # real monotonic time of the last state change
    suspected: str = ""  # reason of a local suspicion under verification (not gossiped)
    last_seen: float | None = None  # last direct proof of life (monotonic)
    load: LoadReport | None = None
    load_time: float | None = None  # when that report was made (monotonic, estimated)
    verified_at: float = -math.inf  # adjusted clock: last verification that found it alive
    suspect_at: float = 0.0  # adjusted clock: when the gossiped suspicion started
    revived_at: float = -math.inf  # real monotonic time it last came back from dead (refuted, restarted)

    @property
    def shown_state(self) -> MemberState:
        return SUSPECT if self.state == ALIVE and self.suspected else self.state

    def update(self) -> Update:
        return Update(self.name, self.node_id, self.incarnation, self.state, tuple(self.addresses))


# ---------------------------------------------------------------------- effects
@dataclass(frozen=True)
class Emit:
    """Tell subscribers: ``kind`` is joined, restarted or the member's new shown state."""

    name: str
    kind: str
    state: str
    previous: str | None
    incarnation: int
    node_id: str
    reason: str


@dataclass(frozen=True)
class Disseminate:
    """Queue ``update`` for piggybacking and push it to the ring neighbours (not ``source``)."""

    update: Update
    source: str | None


@dataclass(frozen=True)
class LearnAddresses:
    """Tell the node where a live member listens."""

    name: str
    addresses: tuple[str, ...]


@dataclass(frozen=True)
class LinkLeft:
    """The member left: a link to it that is down ends (there is nobody to redial); a connected
    one is left to the peer's own BYE, so replies it sends while draining still arrive."""

    name: str
    node_id: str
    reason: str


@dataclass(frozen=True)
class KillLink:
    """The member is dead: fail the link to it, unless the link is to another process."""

    name: str
    node_id: str
    reason: str


@dataclass(frozen=True)
class StartVerify:
    """A rumour we cannot simply accept or ignore: probe the member ourselves."""

    name: str
    reason: str


@dataclass(frozen=True)
class Restarted:
    """Another process took the name: drop per-process state (detector, verification)."""

    name: str


@dataclass(frozen=True)
class Refuted:
    """The member refuted a suspicion: probe rounds waiting on it may stop."""

    name: str


@dataclass(frozen=True)
class TableFull:
    """An update about a new name was ignored because the table holds MAX_MEMBERS."""

    source: str | None


Effect = Emit | Disseminate | LearnAddresses | KillLink | LinkLeft | StartVerify | Restarted | Refuted | TableFull


class MemberTable:
    """Records of the other members and the merge of gossiped updates into them."""

    def __init__(self, max_members: int = MAX_MEMBERS) -> None:
        self.members: dict[str, Member] = {}
        self.max_members = max_members

    def get(self, name: str) -> Member | None:
        return self.members.get(name)

    def forget(self, name: str) -> None:
        self.members.pop(name, None)

    def _transition(self, m: Member, u: Update, now: float, adj_now: float) -> None:
        """The one place a member's gossiped state (and incarnation, process) changes."""
        newer = u.incarnation > m.incarnation
        check_transition(m.state, u.state, newer)
        if u.state == m.state and not newer and u.node_id == m.node_id:
            raise InvalidTransition(f"member {m.name}: update {u} changes nothing")
        prev = m.state
        m.node_id, m.incarnation, m.state = u.node_id, u.incarnation, u.state
        if prev == DEAD and u.state in (ALIVE, SUSPECT):
            m.revived_at = now
        if u.state != prev:
            m.since = now
            if u.state == SUSPECT:
                m.suspect_at = adj_now

    def merge(
        self,
        u: Update,
        *,
        now: float,
        adj_now: float,
        source: str | None = None,
        reason: str = "",
        spread: bool = True,
        verify_after: float = math.inf,
        distrust_revived: float = 0.0,
    ) -> tuple[bool, list[Effect]]:
        """Merge one update about another member -> (changed, effects to perform in order).

        ``now`` is the real monotonic time, ``adj_now`` the lag-adjusted one. ``spread`` off:
        the update is news to us only (a seed's table). A death we cannot accept (an older
        incarnation than ours) about a member silent for ``verify_after`` s is verified.
        A peer's death verdict about a member we think alive is verified, not believed, when the
        peer itself came back from dead within ``distrust_revived`` s: a node cut off by a
        partition condemns everyone it lost, and once the cut heals its stale verdicts would
        otherwise kill healthy members until they refute. (Verdicts of other peers are believed
        at once: a killed process must be dead everywhere within milliseconds.)"""
        m = self.members.get(u.name)
        via = f"via {source}" if source else ""
        if m is None:
            if len(self.members) >= self.max_members:
                return False, [TableFull(source)]
            m = Member(u.name, u.node_id, u.incarnation, u.state, list(u.addresses), since=now)
            if u.state == SUSPECT:
                m.suspect_at = adj_now
            self.members[u.name] = m
            out: list[Effect] = []
            if u.addresses and u.state in (ALIVE, SUSPECT):
                out.append(LearnAddresses(u.name, u.addresses))
            kind = "joined" if u.state in (ALIVE, SUSPECT) else u.state.value
            out.append(self._event(m, kind, None, reason or via))
            if spread:
                out.append(Disseminate(u, source))
            return True, out
        if not supersedes(u, m.update()):
            if (
                u.state == DEAD
                and u.node_id == m.node_id
                and m.state in (ALIVE, SUSPECT)
                and (m.last_seen is None or now - m.last_seen > verify_after)
            ):
                # dead by an older incarnation than ours: maybe we missed news; check ourselves
                return False, [StartVerify(m.name, f"reported dead by {source or 'a peer'}")]
            return False, []
        if u.state == DEAD and source is not None and u.node_id == m.node_id and m.state == ALIVE:
            src = self.members.get(source)
            if src is not None and distrust_revived > 0:
                if src.state == DEAD:  # it speaks again before we heard it refute: same thing
                    why = f"we count {source} itself dead (a stale verdict?)"
                    return False, [StartVerify(m.name, f"reported dead by {source}, but {why}")]
                if now - src.revived_at <= distrust_revived:
                    why = f"{source} was itself dead {now - src.revived_at:.1f} s ago (a stale verdict?)"
                    return False, [StartVerify(m.name, f"reported dead by {source}, but {why}")]
        out = []
        prev_shown, prev_state = m.shown_state, m.state
        restarted = u.node_id != m.node_id
        refuted = u.incarnation > m.incarnation
        self._transition(m, u, now, adj_now)
        if u.addresses:
            m.addresses = list(u.addresses)
            if u.state in (ALIVE, SUSPECT):
                out.append(LearnAddresses(u.name, u.addresses))
        if restarted:
            m.load = m.load_time = m.last_seen = None
            m.suspected = ""
            out.append(Restarted(u.name))
        elif refuted and u.state == ALIVE:
            m.suspected = ""
            out.append(Refuted(u.name))
        if u.state == DEAD:
            m.suspected = ""
            out.append(KillLink(m.name, m.node_id, reason or f"gossip from {source}"))
        elif u.state == LEFT and prev_state != LEFT:
            out.append(LinkLeft(m.name, m.node_id, reason or f"gossip from {source}"))
        if restarted:
            out.append(self._event(m, "restarted" if prev_state in (ALIVE, SUSPECT) else "joined", prev_shown, reason))
        elif m.shown_state != prev_shown:
            out.append(self._event(m, m.shown_state.value, prev_shown, reason or via))
        if spread:
            out.append(Disseminate(u, source))
        return True, out

    @staticmethod
    def _event(m: Member, kind: str, previous: MemberState | None, reason: str) -> Emit:
        prev = previous.value if previous is not None else None
        return Emit(m.name, kind, m.shown_state.value, prev, m.incarnation, m.node_id, reason)


__all__ = [
    "ALIVE",
    "DEAD",
    "LEFT",
    "MAX_ADDRESSES",
    "MAX_MEMBERS",
    "STATES",
    "SUSPECT",
    "TRANSITIONS",
    "Disseminate",
    "Effect",
    "Emit",
    "InvalidTransition",
    "KillLink",
    "LearnAddresses",
    "LinkLeft",
    "Member",
    "MemberState",
    "MemberTable",
    "Refuted",
    "Restarted",
    "StartVerify",
    "TableFull",
    "Update",
    "check_transition",
    "ring_predecessors",
    "ring_successors",
    "supersedes",
]
