"""The probe client: is a member alive? Asked directly (a fresh connection and a HELLO
exchange) and through other members (PROBE_REQ/PROBE_RSP), with every probe bounded.

Why a fresh connection: it proves the member's event loop runs even when the data connection
is back-pressured. Why through others: one bad link must not kill a healthy node. Why the
bounds (issue 11: a peer's PROBE_REQs made a node dial an arbitrary address 1,561 times):
probes are shared per address and spaced out, PROBE_REQs are served only for known members
and one at a time per member, at most MAX_PROBE_CONNECTIONS connections are open at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..codecs import handshake
from ..core.ports import Messaging, PeerConnectivity
from ..errors import AionetError, HandshakeError, TransportError
from ..transports.base import Address
from .detector import LagClock
from .events import MembershipCounters
from .table import ALIVE, DEAD, SUSPECT, Member
from .wire import PROBE_REQ, PROBE_RSP

MAX_PROBE_CONNECTIONS = 32  # probe connections open at once, all addresses together
MAX_SERVED_PROBES = 16  # members probed at once on other members' behalf (PROBE_REQ)
PROBE_REUSE = 0.1  # s: a probe result this fresh answers every later asker of that address
MAX_PROBE_PAUSE = 0.4  # s: cap of the doubling pause between one probe's retries
# probe_round's outcome when the direct probe found nothing listening at any of the member's
# addresses (or another process answering to its name): the process is gone, conclusively; a
# loop blocked by user code still has its listening socket, which the kernel keeps accepting on
GONE = "gone"


@dataclass
class _ProbeRound:
    target: str
    asked: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)
    acks: int = 0
    nacks: int = 0
    alive: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)


def _refused(exc: BaseException, url: str) -> bool:
    """True when nothing listens at ``url`` (the process is gone), as opposed to a timeout."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    with contextlib.suppress(AionetError):
        if Address.parse(url).scheme == "inproc" and isinstance(exc, TransportError):
            return not isinstance(exc, TimeoutError)
    return False


class DialPolicy:
    """When membership may dial a member it must heartbeat, pure (times are fed in).

    Per member: at most one dial per ``max(1 s, 5 intervals)``; when both ends want a
    connection the one with the smaller name dials and the other waits three intervals (two
    crossing dials are wasted work, and a handshake race, where one would do). Per address: at
    most one dial per the same gap whatever member names it, so gossiped members all naming
    one address do not multiply the dials to it (issue 11); that table is pruned of expired
    entries, so it stays small."""

    def __init__(self, me: str, interval: float) -> None:
        self.me = me
        self.interval = interval
        self.gap = max(1.0, 5 * interval)
        self.want_since: dict[str, float] = {}  # member -> since when we lack a connection to it
        self._member_after: dict[str, float] = {}  # member -> when we may dial it again
        self._addr_after: dict[str, float] = {}  # address -> same, whichever member names it

    def want(self, name: str, addresses: Iterable[str] | None, now: float) -> bool:
        """We need a connection to ``name`` (at ``addresses``, when known): dial now?"""
        since = self.want_since.setdefault(name, now)
        if self.me > name and now - since < 3 * self.interval:
            return False
        if self._member_after.get(name, 0.0) > now:
            return False
        self._member_after[name] = now + self.gap
        return addresses is None or self.allow_addresses(addresses, now)

    def allow_addresses(self, addresses: Iterable[str], now: float) -> bool:
        addrs = list(addresses)
        if any(self._addr_after.get(a, 0.0) > now for a in addrs):
            return False
        if len(self._addr_after) > 4 * MAX_PROBE_CONNECTIONS:
            self._addr_after = {a: t for a, t in self._addr_after.items() if t > now}
        for a in addrs:
            self._addr_after[a] = now + self.gap
        return True

    def connected(self, name: str) -> bool:
        """A message to ``name`` went out; True if we had been waiting for a connection."""
        return self.want_since.pop(name, None) is not None

    def forget(self, name: str) -> None:
        self.want_since.pop(name, None)
        self._member_after.pop(name, None)


class Prober:
    """Direct and indirect probes for one node's membership service. Owns no tasks: it starts
    them through ``spawn`` (the service's), which cancels and awaits them on stop."""

    def __init__(
        self,
        node: Messaging,
        peers: PeerConnectivity,
        clock: LagClock,
        members: dict[str, Member],
        *,
        send: Callable[[str, list[Any]], bool],
        spawn: Callable[[Awaitable[Any], str], asyncio.Task[Any]],
        addresses: Callable[[], list[str]],
        probe_timeout: float,
        counters: MembershipCounters,
        log: Any,
    ) -> None:
        self.node = node
        self.peers = peers
        self.clock = clock
        self._members = members
        self._send = send
        self._spawn = spawn
        self._my_addresses = addresses
        self.probe_timeout = probe_timeout
        self.counters = counters
        self.log = log
        self._next_id = 0
        self._rounds: dict[int, _ProbeRound] = {}
        # url -> the probe exchange in flight (or finished < PROBE_REUSE ago): one per address
        self._exchanges: dict[str, asyncio.Task[tuple[str, str, str]]] = {}
        # member -> {requester: probe id}: PROBE_REQs waiting on the one probe we run for it
        self.served: dict[str, dict[str, int]] = {}

    def wake(self, name: str, alive: bool) -> None:
        """News about ``name`` (proof of life when ``alive``): rounds probing it look again."""
        for rnd in self._rounds.values():
            if rnd.target == name:
                rnd.alive = rnd.alive or alive
                rnd.wake.set()

    async def probe_round(self, m: Member, timeout: float, indirect: int) -> str:
        """Direct probe plus indirect probes through other members -> ALIVE, GONE (nothing
        listens at its addresses: conclusive), DEAD (no proof of life, confirmed by others) or
        '' (unknown)."""
        deadline = self.clock() + timeout
        self._next_id += 1
        pid = self._next_id
        rnd = self._rounds[pid] = _ProbeRound(m.name)
        direct = self._spawn(
            self._direct_probe(m.name, m.node_id, list(m.addresses), timeout), f"aionet-probe-{m.name}"
        )
        direct.add_done_callback(lambda _t: rnd.wake.set())
        for via in self._pick_intermediaries(m.name, indirect):
            if self._send(via, [PROBE_REQ, pid, m.name, m.node_id, timeout * 0.8]):
                rnd.asked.add(via)
                self.counters.probes_sent += 1
        # intermediaries probe with 0.8 x the timeout and may answer late when busy: wait a
        # little past the deadline for a first confirmation rather than give up on them
        hard = deadline + timeout / 2
        try:
            while True:
                if rnd.alive or rnd.acks:
                    return ALIVE
                now = self.clock()
                if direct.done():
                    r = direct.result()
                    if r == "alive":
                        return ALIVE
                    if r in ("refused", "replaced"):
                        return GONE
                    if len(rnd.answered) >= len(rnd.asked):
                        return DEAD if (rnd.nacks or not rnd.asked) else ""
                    if now >= deadline and 2 * rnd.nacks > len(rnd.asked):
                        return DEAD  # most of them could not reach it either
                if now >= hard:
                    break
                rnd.wake.clear()
                waiter = asyncio.ensure_future(rnd.wake.wait())
                try:
                    await self.wait_until(waiter, deadline if now < deadline else hard)
                finally:
                    waiter.cancel()
            if rnd.alive or rnd.acks or (direct.done() and not direct.cancelled() and direct.result() == "alive"):
                return ALIVE
            return DEAD if (rnd.nacks or not rnd.asked) else ""
        finally:
            self.log.debug(
                "probe round detail",
                member=m.name,
                asked=sorted(rnd.asked),
                answered=sorted(rnd.answered),
                acks=rnd.acks,
                nacks=rnd.nacks,
                direct=direct.result()
                if direct.done() and not direct.cancelled() and direct.exception() is None
                else "pending",
            )
            del self._rounds[pid]
            if not direct.done():
                direct.cancel()

    async def wait_until(self, fut: asyncio.Future[Any], deadline: float) -> bool:
        """Wait for ``fut`` until ``deadline`` on the lag-adjusted clock (a stall of our own
        loop extends the wait instead of eating it). True if ``fut`` finished."""
        while not fut.done():
            remaining = deadline - self.clock()
            if remaining <= 0:
                return False
            expected = self.clock.real() + remaining
            await asyncio.wait([fut], timeout=remaining)
            if not fut.done():
                self.clock.note(expected)
        return True

    def _pick_intermediaries(self, target: str, k: int) -> list[str]:
        cands = [n for n, m in self._members.items() if n != target and m.state == ALIVE and not m.suspected]
        random.shuffle(cands)
        connected = []
        for n in cands:
            if self.peers.connected(n):
                connected.append(n)
        return connected[:k]

    def serve(self, peer: str, pid: int, target: str, node_id: str, timeout: float | None) -> None:
        """Probe a member on ``peer``'s behalf. Bounded (issue 11): only members we know, at
        their addresses as we know them (never an address or name the asker supplies), one
        probe per member however many ask, at most MAX_SERVED_PROBES members at once; anything
        else is answered -1 ("could not try"), which counts neither way."""
        t = self.probe_timeout * 0.8 if timeout is None else min(max(timeout, 0.01), 4 * self.probe_timeout)
        m = self._members.get(target)
        if m is None or m.node_id != node_id or m.state not in (ALIVE, SUSPECT) or not m.addresses:
            self._send(peer, [PROBE_RSP, pid, -1])
            return
        waiting = self.served.get(target)
        if waiting is not None:  # already probing it: this asker gets the same answer
            waiting[peer] = pid
            return
        if len(self.served) >= MAX_SERVED_PROBES:
            self._send(peer, [PROBE_RSP, pid, -1])
            return
        self.served[target] = {peer: pid}
        self._spawn(self._serve_probe(target, node_id, list(m.addresses), t), f"aionet-probe-for-{target}")

    async def _serve_probe(self, target: str, node_id: str, addrs: list[str], timeout: float) -> None:
        result = -1
        try:
            r = await self._direct_probe(target, node_id, addrs, timeout)
            result = 1 if r == "alive" else 0
        finally:
            for requester, pid in self.served.pop(target, {}).items():
                self._send(requester, [PROBE_RSP, pid, result])

    def answered(self, peer: str, pid: int, result: int) -> None:
        """A PROBE_RSP: ``peer`` probed for round ``pid``; 1 alive, 0 no proof, -1 could not try."""
        rnd = self._rounds.get(pid)
        if rnd is None or peer not in rnd.asked or peer in rnd.answered:
            return
        rnd.answered.add(peer)
        if result == 1:
            rnd.acks += 1
        elif result == 0:
            rnd.nacks += 1
        rnd.wake.set()

    async def _direct_probe(self, name: str, node_id: str, addresses: list[str], timeout: float) -> str:
        """Dial and exchange HELLOs only: 'alive', 'replaced' (another process answers to the
        name), 'refused' (nothing listens), 'hung' (connected, no answer) or 'unreachable'.
        Retries back off (PROBE_REUSE doubling to MAX_PROBE_PAUSE): a handful of connections
        per probe, not one every few milliseconds."""
        deadline = self.clock() + timeout
        result = "unreachable"
        pause = PROBE_REUSE
        while self.clock() < deadline and addresses:
            refused = 0
            for url in addresses:
                r = await self._probe_url(url, name, node_id, deadline)
                if r in ("alive", "replaced"):
                    return r
                if r == "refused":
                    refused += 1
                elif r == "hung":
                    result = "hung"
            if refused == len(addresses):
                return "refused"
            sleeping = asyncio.ensure_future(asyncio.sleep(pause))
            try:
                await self.wait_until(sleeping, deadline)
            finally:
                sleeping.cancel()
            pause = min(2 * pause, MAX_PROBE_PAUSE)
        return result

    async def _probe_url(self, url: str, name: str, node_id: str, deadline: float) -> str:
        """One probe of ``url`` expecting member ``name``/``node_id``. Callers probing the same
        address share one connection (and its result for PROBE_REUSE s after it ends), and at
        most MAX_PROBE_CONNECTIONS are open at once: no peer can make us open connections to an
        address faster than one per PROBE_REUSE s."""
        task = self._exchanges.get(url)
        if task is None:
            if sum(not t.done() for t in self._exchanges.values()) >= MAX_PROBE_CONNECTIONS:
                return "unreachable"
            task = self._spawn(self._probe_exchange(url, deadline), "aionet-probe-conn")
            self._exchanges[url] = task
            task.add_done_callback(lambda t, u=url: self._reuse_for_a_while(u, t))
        if not await self.wait_until(task, deadline):
            return "unreachable"
        if task.cancelled():
            return "error"
        status, reply_name, reply_node_id = task.result()
        if status != "answered":
            return status
        if reply_name != name:
            return "error"
        return "alive" if reply_node_id == node_id else "replaced"

    def _reuse_for_a_while(self, url: str, task: asyncio.Task[Any]) -> None:
        def forget() -> None:
            if self._exchanges.get(url) is task:
                del self._exchanges[url]

        if task.cancelled():
            forget()
        else:
            asyncio.get_running_loop().call_later(PROBE_REUSE, forget)

    async def _probe_exchange(self, url: str, deadline: float) -> tuple[str, str, str]:
        """Connect to ``url``, send a probe HELLO, check the answer proves the cluster token.
        -> (status, name, node id): status 'answered' (name and node id are the answerer's,
        token proven), 'refused', 'unreachable', 'hung' or 'error'. Owns its helper futures:
        whatever ends it (timeout, cancellation, a closed connection), none is left with an
        unretrieved exception and the connection is closed."""
        node = self.node
        try:
            transport = self.peers.transport(url)
        except AionetError:
            return ("unreachable", "", "")
        connecting = asyncio.ensure_future(transport.connect(url, timeout=None))
        receiving: asyncio.Future[Any] | None = None
        conn = None
        try:
            if not await self.wait_until(connecting, deadline):
                return ("unreachable", "", "")
            try:
                conn = connecting.result()
            except (AionetError, OSError) as exc:
                return ("refused" if _refused(exc, url) else "error", "", "")
            me = handshake.Me(node.name, node.node_id, self._my_addresses(), {})
            hs = handshake.Handshake(
                handshake.Role.PROBE, me, self.peers.token, now=self.clock(), timeout=max(deadline - self.clock(), 0.0)
            )
            for frame in hs.data_to_send():
                await conn.send([frame])
            receiving = asyncio.ensure_future(conn.recv())
            if not await self.wait_until(receiving, deadline):
                return ("hung", "", "")
            try:
                ev = hs.receive(receiving.result())
            except HandshakeError as exc:
                self.log.warning("probe answer refused", url=url, error=str(exc))
                return ("error", "", "")
            return ("answered", ev.hello.name, ev.hello.node_id)
        except (AionetError, OSError):
            return ("error", "", "")
        finally:
            for fut in (connecting, receiving):
                if fut is not None:
                    _drop(fut)
            if conn is None and connecting.done() and not connecting.cancelled() and connecting.exception() is None:
                conn = connecting.result()  # connected just as we gave up
            if conn is not None:
                conn.abort()


def _drop(fut: asyncio.Future[Any]) -> None:
    """Cancel a helper future we are done with, and swallow what it ends with (it may already
    have failed, e.g. the connection closed just as we stopped waiting)."""
    if fut.done():
        if not fut.cancelled():
            fut.exception()
        return
    fut.cancel()
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())


__all__ = [
    "GONE",
    "MAX_PROBE_CONNECTIONS",
    "MAX_PROBE_PAUSE",
    "MAX_SERVED_PROBES",
    "PROBE_REUSE",
    "DialPolicy",
    "Prober",
]
