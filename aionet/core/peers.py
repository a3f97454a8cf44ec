"""The peer directory: who this node knows, how to reach them, and their links.

A peer entry is created only for a peer that proved the cluster token (a completed handshake)
or that a proven peer told us about; entries are pruned once the peer departs, so the table
tracks the cluster rather than its history. Connection events ("connected", "lost", "left",
"dead", and "undeliverable" with a count when messages to a peer were given up for good)
are announced from here to the services that subscribed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..codecs.envelope import BYE, PEERS
from ..errors import PeerUnavailable, ProtocolError
from ..instrument import Instruments
from ..stats import PeerStats
from ..transports.base import Connection
from .link import Link, close_conn

MAX_PEERS_PER_MESSAGE = 1024  # entries of a PEERS message / HELLO peer table acted on
MAX_HEARSAY_PEERS = 4096  # known peers beyond which names learned from others are ignored
PRUNE_EVERY = 1.0  # s between sweeps of the peer table (departed clients, dead non-members)

ConnListener = Callable[[str, str, dict[str, Any]], None]
Spawn = Callable[[Any, str], "asyncio.Task[Any]"]


@dataclass
class PeerConn:
    """A live, handshaken connection to a peer."""

    id: int
    conn: Connection
    peer: str
    outgoing: bool
    compress: bool
    since: float = field(default_factory=time.monotonic)


@dataclass
class Peer:
    """A peer this node knows (see the module docstring for when entries exist)."""

    name: str
    addresses: list[str] = field(default_factory=list)
    link: Link | None = None
    dialing: asyncio.Future[Link] | None = None
    pending_tx: str = ""  # stream id promised in a handshake before the link existed
    undeliverable: int = 0  # messages to it given up for good (each reported as an event)
    since: float = field(default_factory=time.monotonic)  # last learned or (re)connected


class PeerDirectory:
    """The peer table of one node, with its learn/announce/prune rules and connection events.

    ``member_state`` (name -> "alive"/.../"left" or None) is set by the node once membership
    exists: members stay in the table while membership may revive them."""

    def __init__(
        self, name: str, log: Any, forget_after: float, spawn: Spawn, instruments: Instruments | None = None
    ) -> None:
        self.name = name
        self.instruments = instruments if instruments is not None else Instruments()
        self.log = log
        self.forget_after = forget_after
        self._spawn = spawn
        self.table: dict[str, Peer] = {}
        self.member_state: Callable[[str], str | None] = lambda _name: None
        self._listeners: list[ConnListener] = []

    # ------------------------------------------------------------------ entries
    def get(self, name: str) -> Peer | None:
        return self.table.get(name)

    def peer(self, name: str) -> Peer:
        """The entry for ``name``, created if new."""
        p = self.table.get(name)
        if p is None:
            p = self.table[name] = Peer(name)
        return p

    def live_link(self, name: str) -> Link | None:
        """The peer's link when it is connected now (not dead, a connection attached)."""
        p = self.table.get(name)
        link = p.link if p is not None else None
        if link is None or link.current is None or link.dead is not None:
            return None
        return link

    def known(self) -> dict[str, list[str]]:
        """name -> advertised addresses, for every peer this node has heard of."""
        return {n: list(p.addresses) for n, p in self.table.items()}

    def summary(self) -> dict[str, dict[str, Any]]:
        """Known peers: name -> {addresses, connected}."""
        return {
            n: {"addresses": list(p.addresses), "connected": p.link is not None and p.link.current is not None}
            for n, p in self.table.items()
        }

    @staticmethod
    def state(p: Peer) -> str:
        link = p.link
        if link is None:
            return "unknown"
        if link.left:
            return "left"
        if link.dead is not None:
            return "dead"
        return "alive" if link.current is not None else "suspect"

    def stats(self) -> dict[str, PeerStats]:
        """Per peer: state, addresses, queued bytes, the link and its connections."""
        peers: dict[str, PeerStats] = {}
        for n, p in self.table.items():
            link = p.link
            conns = tuple(
                dataclasses.replace(c.conn.stats(), outgoing=c.outgoing, compress=bool(c.compress))
                for c in (link.conns if link else [])
                if not c.conn.closed
            )
            peers[n] = PeerStats(
                state=self.state(p),
                addresses=tuple(p.addresses),
                # unacknowledged bytes (the back-pressure window), and bytes waiting in our
                # transport buffers to be written / delivered, summed over connections
                inflight_bytes=link.state.inflight_bytes if link else 0,
                queued_send_bytes=sum(c.queued_send_bytes for c in conns),
                queued_recv_bytes=sum(c.queued_recv_bytes for c in conns),
                undeliverable=p.undeliverable,
                link=link.stats() if link else None,
                connections=conns,
            )
        return peers

    def proven_table(self, limit: int) -> dict[str, list[str]]:
        """Live peers and their addresses, for a proven peer (WELCOME / RESUME), at most ``limit``."""
        table = {
            n: list(p.addresses)
            for n, p in self.table.items()
            if p.addresses and p.link is not None and not p.link.left and p.link.dead is None
        }
        if len(table) > limit:
            table = dict(list(table.items())[:limit])  # the rest spreads by gossip
        return table

    def declare_dead(self, peer: str, reason: str) -> None:
        """Fail the link to ``peer`` now: pending sends and requests raise PeerUnavailable."""
        p = self.table.get(peer)
        if p is not None and p.link is not None and p.link.dead is None:
            p.link.fail(PeerUnavailable(f"{peer}: declared dead ({reason})"), keep=True)

    def member_left(self, peer: str, reason: str) -> None:
        """Membership heard (by gossip) that ``peer`` left. A connected link is left alone: the
        peer drains and says BYE on it. A link that is down would redial a node that is gone until
        ``link.give_up_after``, its pending requests waiting that long: it ends now, as on a BYE."""
        p = self.table.get(peer)
        link = p.link if p is not None else None
        if link is not None and link.dead is None and not link.left and link.current is None:
            self.log.info("peer left while its link was down; ending the link", peer=peer, reason=reason)
            link.peer_left()

    # ------------------------------------------------------------------ learning
    def learn(self, table: dict[str, list[str]], hearsay: bool = True) -> None:
        """Remember peers' addresses. What a peer tells us (``hearsay``: PEERS, a HELLO's
        table) is bounded (issue 11: 300,007 made-up peers cost 111 MiB): the first
        MAX_PEERS_PER_MESSAGE entries are read, and new names only while fewer than
        MAX_HEARSAY_PEERS peers are known. Membership passes its own, capped, member table."""
        if not isinstance(table, dict):
            raise ProtocolError("peer table is not a mapping")
        for i, (name, addrs) in enumerate(table.items()):
            if hearsay and i >= MAX_PEERS_PER_MESSAGE:
                self.log.warning("peer table too long; ignoring the rest", entries=len(table))
                break
            if (
                not isinstance(name, str)
                or not isinstance(addrs, list)
                or len(addrs) > 16
                or not all(isinstance(a, str) and len(a) <= 1024 for a in addrs)
            ):
                raise ProtocolError("malformed peer table entry")
            if name == self.name or not addrs:
                continue
            if hearsay and name not in self.table and len(self.table) >= MAX_HEARSAY_PEERS:
                continue  # a full table: names only hearsay vouches for are not worth memory
            p = self.peer(name)
            if p.link is None or p.link.current is None:
                p.addresses = list(addrs)
                p.since = time.monotonic()

    def announce(self, table: dict[str, list[str]], exclude: str) -> None:
        """Tell connected peers about a newly connected one (simple dissemination)."""
        for n, p in self.table.items():
            link = p.link
            if n == exclude or link is None or link.current is None or link.dead is not None:
                continue
            self._spawn(_quiet(link.send(PEERS, [table])), "aionet-announce")

    # ------------------------------------------------------------------ pruning
    async def prune_loop(self, closing: Callable[[], bool]) -> None:
        while not closing():
            await asyncio.sleep(PRUNE_EVERY)
            try:
                self.prune()
            except Exception as exc:  # a bug here must not end the sweeps (nor surface unretrieved)
                self.log.error("peer table sweep failed", error=repr(exc))

    def prune(self) -> None:
        """Forget peers that are gone, so the table tracks the cluster, not its history:
        a peer that said goodbye (e.g. an ``aionet status`` client) once its connections closed;
        a dead peer that is not a cluster member (members stay while membership may revive
        them); an address learned from a peer but never connected, after
        ``heartbeat.forget_after``."""
        now = time.monotonic()
        forget = self.forget_after
        for name, p in list(self.table.items()):
            if p.dialing is not None:
                continue
            link = p.link
            member = self.member_state(name)
            if link is None:
                gone = member is None and now - p.since > forget
            elif link.left:
                gone = not link.conns and member in (None, "left")
            elif link.dead is not None:
                gone = not link.conns and member is None
            else:
                gone = False
            if gone:
                if link is not None:
                    link.give_up("peer forgotten (gone from the cluster)")
                del self.table[name]
                self.log.debug("forgot peer", peer=name)

    async def close_links(self) -> None:
        """At shutdown: say BYE to connected peers (waiting up to 2 s for their acks), then
        close every live link; pending sends and requests fail with PeerUnavailable."""
        links = [p.link for p in self.table.values() if p.link is not None and p.link.dead is None]
        byes = [asyncio.ensure_future(_say_bye(link)) for link in links if link.current is not None]
        if byes:
            await asyncio.wait(byes, timeout=2.0)
        for link in links:
            link.left = True
            for c in list(link.conns):
                await close_conn(c.conn)
            link.fail(PeerUnavailable(f"{link.peer}: local node is shutting down"))
        for p in self.table.values():  # dead links still keeping messages: stop their timers
            if p.link is not None:
                p.link.give_up("local node is shutting down")
        for t in byes:  # a goodbye not acknowledged in time: ended here, not left running
            t.cancel()
        await asyncio.gather(*byes, return_exceptions=True)

    # ------------------------------------------------------------------ connection events
    def on_event(self, fn: ConnListener) -> None:
        """``fn(peer, event, details)`` for event in "connected", "lost", "left", "dead",
        "undeliverable" (details: ``messages``, ``reason``)."""
        self._listeners.append(fn)

    def emit(self, peer: str, event: str, **details: Any) -> None:
        if (hook := self.instruments.link_event) is not None:
            hook(peer, event, details)
        for fn in list(self._listeners):
            try:
                fn(peer, event, details)
            except Exception as exc:  # a listener bug must not break the reader
                self.log.error("connection event listener failed", error=repr(exc))


async def _say_bye(link: Link) -> None:
    with contextlib.suppress(Exception):
        await link.send(BYE, [])
        await link.wait_acked(link.state.next_seq - 1)


async def _quiet(aw: Any) -> None:
    with contextlib.suppress(Exception):
        await aw
