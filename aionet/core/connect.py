"""Connecting peers: dial, accept, the handshake around :mod:`aionet.codecs.handshake`, join.

The acceptor keeps no state about a dialer until it proved the cluster token; accepted
connections wait for their handshake in bounded slots (per remote host and in total), shedding
the oldest when full. Dials by name share one task per peer and take turns per address. Joining
retries the seeds with jittered backoff, since clusters start in any order.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..codecs import batch, handshake
from ..codecs.serialize import Serializer
from ..config import Config
from ..errors import (
    AionetError,
    ConnectionClosed,
    HandshakeError,
    PeerUnavailable,
    ProtocolError,
    TransportError,
)
from ..security import is_local_address, is_local_host, is_loopback_host
from ..transports.base import Address, Connection
from ..transports.registry import TransportRegistry
from .device_transfer import DeviceTransfers
from .link import SIZE_LIMITS, Link, close_conn
from .peers import Peer, PeerConn, PeerDirectory, Spawn
from .ports import Clock, loop_time
from .router import Router

DIAL_GAP = 0.1  # s between dials by name of one address (one at a time), however many names name it
_SHED_LOG_EVERY = 10.0  # s: at most one warning per this long about shed handshakes
_JOIN_FIRST_DELAY = 0.2  # s before the second round of seed dials; doubles each round ...
_JOIN_MAX_DELAY = 2.0  # ... up to this (each delay jittered down to half)


class _HandshakeCut(HandshakeError):
    """The connection ended mid-handshake or the reply did not come in time: transient
    (crossing dials, a peer restarting, a shed handshake), so worth another try."""


class _ClosedBeforeHello(ConnectionClosed):
    """The connection closed before sending anything: a port check, not a failed handshake."""


class _WrongScheme(TransportError):
    """A tls:// dial reset by a listener that does not speak TLS: retrying cannot help."""


class _DialedSelf(HandshakeError):
    """A seed URL turned out to be this very node (it listed itself)."""


@dataclass
class _Pending:
    """An accepted connection whose handshake is in progress (holds a handshake slot)."""

    conn: Connection
    host: str
    shed: bool = False


def _host_of(address: str) -> str:
    """The remote host of a connection's peer address (what per-address limits count)."""
    try:
        a = Address.parse(address)
    except AionetError:
        return address
    return a.host or address


class Connector:
    """Dials and accepts for one node and turns handshaken connections into peer links.

    Takes the node's collaborators explicitly (never the Node): ``start_reader`` hands a
    registered connection to the dispatch loop; ``closing``/``running`` read the node's
    lifecycle; ``addresses`` gives the bound listen URLs."""

    def __init__(
        self,
        *,
        name: str,
        node_id: str,
        config: Config,
        log: Any,
        token: bytes | None,
        serializer: Serializer,
        transports: TransportRegistry,
        device: DeviceTransfers,
        router: Router,
        peers: PeerDirectory,
        start_reader: Callable[[PeerConn, Link], None],
        spawn: Spawn,
        closing: Callable[[], bool],
        running: Callable[[], bool],
        addresses: Callable[[], list[str]],
        clock: Clock = loop_time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.node_id = node_id
        self.config = config
        self.log = log
        self._token = token
        self.serializer = serializer
        self.transports = transports
        self._device = device
        self.router = router
        self._peers = peers
        self._start_reader = start_reader
        self._spawn = spawn
        self._closing = closing
        self._running = running
        self._addresses = addresses
        # join's backoff: when, how long and how jittered it waits (tests inject virtual time)
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._compression = config.codec.compression != "none"
        self._next_conn_id = 0
        self._dial_turns: dict[str, list[Any]] = {}  # address -> [lock, users, next start]: _dial_turn
        # accepted connections still in their handshake, oldest first (dicts keep insertion order)
        self.handshaking: dict[int, _Pending] = {}
        self._shed_count = 0
        self._shed_logged = 0.0

    # ------------------------------------------------------------------ ports.PeerConnectivity
    @property
    def token(self) -> bytes | None:
        """The cluster token (a probe checks that its answerer proves it)."""
        return self._token

    def known_peers(self) -> dict[str, list[str]]:
        return self._peers.known()

    def connected(self, name: str) -> bool:
        """Whether a connection to ``name`` is up now."""
        return self._peers.live_link(name) is not None

    def peer_node_id(self, name: str) -> str:
        """The node id ``name``'s link was handshaken with ("" when none)."""
        p = self._peers.get(name)
        link = p.link if p is not None else None
        return link.peer_node_id if link is not None else ""

    async def ensure_link(self, name: str) -> None:
        """Dial ``name`` unless a connection is up: a fresh link when there is none (or it
        died), a redial of the existing link when it is only disconnected."""
        p = self._peers.get(name)
        link = p.link if p is not None else None
        if link is None or link.dead is not None:
            await self.link_to(name)
        elif link.current is None:
            await self.dial_peer(name)

    def learn_peers(self, table: dict[str, list[str]], hearsay: bool = True) -> None:
        self._peers.learn(table, hearsay)

    def declare_dead(self, peer: str, reason: str) -> None:
        self._peers.declare_dead(peer, reason)

    def member_left(self, peer: str, reason: str) -> None:
        self._peers.member_left(peer, reason)

    def advertised(self) -> list[str]:
        return self._advertised()

    async def connect(self, url: str) -> str:
        """Dial a seed by URL; the answering node's name (membership's join)."""
        return (await self.dial(url)).peer

    def _advertised(self) -> list[str]:
        adv = self.config.node.advertise
        return [adv] if adv else self._addresses()

    async def join(self, seeds: Sequence[str]) -> None:
        """Dial the seeds until one answers, for up to ``node.join_timeout`` seconds.

        Clusters are started in parallel (StatefulSets, SLURM, scripts), so a seed that is not
        up yet is normal: every round dials all remaining seeds at once, and rounds repeat with
        jittered exponential backoff. Seeds naming this node itself are skipped (all nodes may
        share one seed list); if no other seed is left, this node starts the cluster. Errors
        that waiting cannot fix (a wrong token, another protocol version) fail at once."""
        timeout = self.config.node.join_timeout
        deadline = self._clock() + timeout
        pending = [url for url in dict.fromkeys(seeds) if not self.is_own_address(url)]
        delay = _JOIN_FIRST_DELAY
        rounds = 0
        while True:
            if not pending:
                self.log.info("this node is its only seed: starting a new cluster")
                return
            rounds += 1
            results = await asyncio.gather(*(self.dial(url) for url in pending), return_exceptions=True)
            errors: dict[str, BaseException] = {}
            for url, res in zip(pending, results, strict=True):
                if isinstance(res, _DialedSelf):
                    self.log.info("seed is this node itself; skipping it", seed=url)
                elif isinstance(res, BaseException):
                    errors[url] = res
            joined = len(pending) - len(errors) - sum(isinstance(r, _DialedSelf) for r in results)
            if joined:
                for url, exc in errors.items():
                    self.log.info("seed unreachable; joined through another", seed=url, error=str(exc))
                return
            pending = [url for url in pending if url in errors]
            if not pending:
                continue  # every seed was this node: start alone (logged above)
            for exc in errors.values():
                if not isinstance(exc, asyncio.CancelledError) and not _worth_retrying(exc):
                    raise PeerUnavailable("cannot join: " + _seed_errors(errors)) from None
            left = deadline - self._clock()
            if left <= 0:
                waited = f"within node.join_timeout={timeout:g} s" if timeout else "(node.join_timeout = 0)"
                raise PeerUnavailable(
                    f"could not reach any seed {waited}: {_seed_errors(errors)}; start a seed first, "
                    "check node.join, or raise node.join_timeout"
                )
            pause = min(left, delay * self._rng.uniform(0.5, 1.0))
            self.log.info(
                "waiting for seeds",
                seeds=pending,
                attempt=rounds,
                retry_in=round(pause, 2),
                gives_up_in=round(left, 1),
                error=str(next(iter(errors.values()))),
            )
            await self._sleep(pause)
            delay = min(delay * 2, _JOIN_MAX_DELAY)

    def is_own_address(self, url: str) -> bool:
        """True when ``url`` names one of this node's own listeners (same scheme and port, and
        the same host, a loopback host, or any host of a wildcard listener that is local)."""
        try:
            a = Address.parse(url)
        except AionetError:
            return False
        for own in [*self._addresses(), *self._advertised()]:
            try:
                b = Address.parse(own)
            except AionetError:
                continue
            if a.scheme != b.scheme:
                continue
            if a.port is None or b.port is None:
                if a.url() == b.url():
                    return True
                continue
            if a.port != b.port:
                continue
            if a.host == b.host or (is_loopback_host(a.host) and is_loopback_host(b.host)):
                return True
            if b.host in ("0.0.0.0", "::", "") and is_local_host(a.host):
                return True
        return False

    def check_reachable(self, name: str) -> Peer:
        """Raise PeerUnavailable when no wait could give a link to ``name`` (this node is not
        running, the peer is unknown or has left); else its entry. ``send_nowait`` asks this
        before it says WouldBlock, which tells the caller to wait and try again."""
        p = self._peers.get(name)
        if not self._running() or self._closing():
            raise PeerUnavailable(f"{name}: local node is not running")
        if p is None or not p.addresses:
            known = ", ".join(sorted(self._peers.table)) or "none"
            raise PeerUnavailable(f"unknown peer {name!r} (known peers: {known})")
        if p.link is not None and p.link.left:
            raise PeerUnavailable(f"{name}: peer has left the cluster")
        return p

    async def link_to(self, name: str) -> Link:
        """A live link to ``name``, dialing it if needed."""
        p = self._peers.get(name)
        if p is not None and p.link is not None and p.link.dead is None:
            return p.link
        p = self.check_reachable(name)
        if p.dialing is None or p.dialing.done():
            # on a task of its own, shared by every caller: a caller that gives up (its
            # request timed out, it was cancelled) stops waiting without cancelling the dial
            p.dialing = self._spawn(self._dial_link(p), "aionet-dial")
            # every waiter may have given up (a cancelled send): the failure is still retrieved
            p.dialing.add_done_callback(_retrieve)
        dialing = p.dialing
        try:
            return await asyncio.shield(dialing)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if dialing.cancelled() and not (task is not None and task.cancelling()):
                raise PeerUnavailable(f"{name}: dial cancelled (local node is shutting down)") from None
            raise

    async def _dial_link(self, p: Peer) -> Link:
        try:
            await self.dial_peer(p.name)
            link = p.link
            assert link is not None
            return link
        finally:
            p.dialing = None

    async def dial_peer(self, name: str) -> None:
        p = self._peers.table[name]
        errors: list[str] = []
        # A handshake cut short (both sides dialing each other as one restarts or joins) is
        # transient: retry briefly. A refused connection or a failed proof is not.
        for attempt in range(3):
            transient = False
            for url in list(p.addresses):
                try:
                    async with self._dial_turn(url):
                        await self.dial(url, expect=name)
                    return
                except (TimeoutError, TransportError, HandshakeError, OSError) as exc:
                    errors.append(f"{url}: {exc}")
                    transient = transient or isinstance(exc, _HandshakeCut)
            if not transient or attempt == 2:
                break
            await asyncio.sleep(0.05 * (attempt + 1))
        raise PeerUnavailable(f"{name}: unreachable ({'; '.join(errors) or 'no address'})")

    @contextlib.asynccontextmanager
    async def _dial_turn(self, url: str) -> AsyncIterator[None]:
        """Dials by name to one address go one at a time, starting DIAL_GAP apart: peers
        gossip names and addresses, and many names at one address must not make this node
        hammer it (issue 11). The entry lives while someone waits for or holds the turn."""
        entry = self._dial_turns.setdefault(url, [asyncio.Lock(), 0, 0.0])
        entry[1] += 1
        try:
            async with entry[0]:
                delay = entry[2] - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                entry[2] = time.monotonic() + DIAL_GAP
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._dial_turns[url]

    def _new_link(self, name: str, tx_id: str = "") -> Link:
        link = Link(
            name,
            dumps=self.serializer.dumps,
            dumps_sized=self.serializer.dumps_sized,
            max_inflight_bytes=self.config.link.max_inflight_bytes,
            give_up_after=self.config.link.give_up_after,
            log=self.log,
            redial=lambda: self.dial_peer(name),
            on_dead=self._on_link_dead,
            limits=self.config.limits,
            death_grace=self.config.link.death_grace,
            on_undeliverable=self._on_undeliverable,
            copy_max=self.config.link.big_copy_max_bytes,
            dtypes=self.serializer.dtypes,
            oob_min=self.serializer.oob_min_bytes,
        )
        if tx_id:
            link.tx_id = tx_id
        return link

    def _on_link_dead(self, name: str, exc: BaseException) -> None:
        self._device.drop_peer(name, exc)
        self.router.fail_peer(name, exc if isinstance(exc, PeerUnavailable) else PeerUnavailable(str(exc)))
        link = self._peers.table[name].link if name in self._peers.table else None
        self._peers.emit(name, "left" if link is not None and link.left else "dead", reason=str(exc))
        if not self._closing() and not (link is not None and link.left):
            self.log.warning("peer link failed", peer=name, error=str(exc))

    def _on_undeliverable(self, name: str, count: int, reason: str) -> None:
        """Messages to ``name`` given up for good: count, event, one warning; never silent."""
        p = self._peers.get(name)
        if p is not None:
            p.undeliverable += count
        self._peers.emit(name, "undeliverable", messages=count, reason=reason)
        if not self._closing():
            self.log.warning("messages to peer given up", peer=name, messages=count, reason=reason)

    def _live_link(self, name: str, tx_id: str = "") -> Link:
        """The peer's link, replacing one that died (a fresh stream)."""
        p = self._peers.peer(name)
        old = p.link
        if old is None or old.dead is not None:
            p.link = self._new_link(name, tx_id)
            if old is not None and not old.left:
                # Declared dead but maybe alive (a false suspicion): our outgoing stream is
                # gone, but remember how far we got in the peer's stream. If the peer kept it,
                # it replays what we have not acknowledged and we drop what we already
                # delivered; if it started a new one, the handshake resets this.
                p.link.inherit_rx(old)
                # ... and continue our own stream too, when the old link still keeps what the
                # peer had not acknowledged (within link.death_grace): the handshake trims it by
                # the peer's resume info and attach() replays the rest, in order, once.
                adopted = p.link.adopt_stream(old) if tx_id in ("", old.tx_id) else 0
                if adopted:
                    self.log.info("continuing the stream to a peer declared dead", peer=name, unacked=adopted)
        return p.link

    # ------------------------------------------------------------------ handshake
    def transport(self, url: str) -> Any:
        options = dict(self.config.transport.__dict__)
        sec = self.config.security  # tls:// takes [security] tls_*; [transport] tls = {...} overrides
        tls = {"cert": sec.tls_cert, "key": sec.tls_key, "ca": sec.tls_ca}
        tls["handshake_timeout"] = self.config.link.handshake_timeout
        options["tls"] = {**{k: v for k, v in tls.items() if v}, **(options.get("tls") or {})}
        transport = self.transports.get(url, options, self.config.limits)
        use_pool = getattr(transport, "use_pool", None)
        if use_pool is not None:  # rdma: one registered pool serves RDMA and GPU staging
            use_pool(self._device.stager.pool)
        return transport

    def _hello(self, nonce: bytes, mac: bytes) -> handshake.Hello:
        """Our HELLO: who we are and how to reach us; nothing about the cluster (that waits
        for WELCOME/RESUME, after both sides proved the token)."""
        features = {"compression": ["lz4"] if self._compression else [], "auth": self._token is not None}
        features["limits"] = {k: getattr(self.config.limits, k) for k in SIZE_LIMITS}  # see Link.post
        # SEND envelopes with many payloads are welcome, up to as many as a mailbox holds (codecs/batch.py)
        features[batch.FEATURE] = min(self.config.link.mailbox_size, self.config.link.peer_mailbox_size)
        # REQ envelopes with many requests (at most as many as may run at once) and REP
        # envelopes with many replies are welcome too
        features[batch.RPC_FEATURE] = self.config.link.max_concurrent_requests
        # and as many again may wait for a handler slot without the reader stopping (Router.waiting)
        features[batch.RPC_WAIT_FEATURE] = self.config.link.max_concurrent_requests
        # requests to services answered inline here take no slot: callers need not count them
        features[batch.RPC_INLINE_FEATURE] = self.router.inline_services()
        # a CANCEL for a request whose caller gave up cancels its handler here (router.py)
        features["cancel"] = True
        return handshake.Hello(
            handshake.PROTOCOL_VERSION, self.name, self.node_id, self._advertised(), features, {}, nonce, mac, {}
        )

    def handshake(self, role: handshake.Role, timeout: float, **kw: Any) -> handshake.Handshake:
        """A handshake state machine speaking for this node (dial, accept, probe)."""
        hello = self._hello(b"", b"")
        me = handshake.Me(hello.name, hello.node_id, hello.addresses, hello.features)
        return handshake.Handshake(role, me, self._token, now=time.monotonic(), timeout=timeout, **kw)

    @staticmethod
    async def _flush(conn: Connection, hs: handshake.Handshake) -> None:
        for frame in hs.data_to_send():
            await conn.send([frame])

    async def dial(self, url: str, expect: str | None = None) -> PeerConn:
        if self._closing():
            raise PeerUnavailable(f"{url}: local node is not running")
        transport = self.transport(url)
        try:
            conn = await transport.connect(url, timeout=self.config.transport.connect_timeout)
        except TransportError as exc:
            better = _explain_connect_error(url, exc)
            if better is exc:
                raise
            raise better from exc
        timeout = self.config.link.handshake_timeout
        replied = False
        hs = self.handshake(handshake.Role.DIALER, timeout, expect=expect)
        try:
            async with asyncio.timeout(timeout):
                try:
                    await self._flush(conn, hs)
                    ev = hs.receive(await conn.recv())
                    replied = True
                    if isinstance(ev, handshake.DialedSelf):
                        raise _DialedSelf(f"{url} is this node itself")
                    hello = ev.hello
                    await self._flush(conn, hs)  # CONFIRM: our proof of the token
                    welcome = hs.receive(await conn.recv())
                    assert isinstance(welcome, handshake.Welcomed)
                except HandshakeError as exc:
                    with contextlib.suppress(Exception):  # a REJECT the machine queued, if any
                        await asyncio.wait_for(self._flush(conn, hs), 1.0)
                    if isinstance(exc, (_DialedSelf, handshake.Rejected)):
                        raise
                    raise type(exc)(f"{url}: {exc}") from None
                # a crossing dial from the peer may already have been promised a stream id in our
                # WELCOME: use it, or both sides reset each other's fresh stream (lost messages)
                pending = self._peers.peer(hello.name)
                link = self._live_link(hello.name, pending.pending_tx)
                if pending.link is link:
                    pending.pending_tx = ""
                notes = link.apply_resume(welcome.state.link, hello.node_id)
                hs.resume(self._peers.proven_table(handshake.MAX_PEERS), link.resume_info())
                await self._flush(conn, hs)
        except BaseException as exc:
            await close_conn(conn)
            if isinstance(exc, TimeoutError):
                raise _HandshakeCut(f"{url}: no handshake reply within {timeout} s") from None
            if isinstance(exc, handshake.Rejected) and exc.retry:
                raise _HandshakeCut(f"{url}: {exc}") from exc
            if isinstance(exc, ConnectionClosed):
                cause = exc.__cause__ or exc
                if _tls_refusal(cause):
                    raise HandshakeError(f"{url}: TLS refused the connection: {cause}") from exc
                scheme = url.partition("://")[0]
                if not replied and scheme == "tls" and isinstance(cause, ConnectionResetError):
                    # TLS 1.3: the listener checks our certificate after our side of the TLS
                    # handshake is done, and resets the connection if it does not trust it
                    raise HandshakeError(
                        f"{url}: the listener reset the connection right after the TLS handshake; it "
                        "probably does not trust this node's certificate (check security.tls_cert here "
                        "and security.tls_ca there)"
                    ) from exc
                if not replied and scheme in ("tcp", "tls") and exc.__cause__ is None:
                    # an aionet node answers or resets (a shed handshake); a clean close without a
                    # word is something else, e.g. a tls:// listener that got plain tcp://
                    raise HandshakeError(
                        f"{url}: the peer closed the connection without answering the aionet handshake: "
                        "not an aionet node, or it speaks another scheme (tls:// dialed as tcp://?); "
                        "check the scheme"
                    ) from exc
                raise _HandshakeCut(f"{url}: connection closed during handshake ({cause})") from exc
            raise
        if self._closing():  # the node stopped during the handshake: no link may open now
            await close_conn(conn)
            raise PeerUnavailable(f"{url}: local node is not running")
        for note in notes:
            self.log.info("link resumed", peer=hello.name, note=note)
        return await self._register(conn, hello, link, outgoing=True, peers=welcome.state.peers)

    async def on_accept(self, conn: Connection) -> None:
        """Run the acceptor's side of a handshake in a bounded slot.

        Slots are limited per remote host (``link.max_handshakes_per_host``) and in total
        (``link.max_handshakes``). When either is full the OLDEST pending handshake (of that
        host, or overall) is shed, not the newcomer: silent sockets cannot lock legitimate
        peers out, since a real handshake takes a round trip or two while a flood's sockets
        sit idle until shed or timed out (``link.handshake_timeout``)."""
        cfg = self.config.link
        host = _host_of(conn.peer_address)
        same_host = [h for h in self.handshaking.values() if h.host == host]
        if len(same_host) >= cfg.max_handshakes_per_host:
            self._shed(same_host[0], "link.max_handshakes_per_host")
        elif len(self.handshaking) >= cfg.max_handshakes:
            self._shed(next(iter(self.handshaking.values())), "link.max_handshakes")
        slot = _Pending(conn, host)
        self.handshaking[id(slot)] = slot
        try:
            result = await asyncio.wait_for(self._accept_handshake(conn), cfg.handshake_timeout)
        except (TimeoutError, ProtocolError, ConnectionClosed) as exc:
            if slot.shed:
                self.log.debug("shed pending handshake closed", peer=conn.peer_address)
            elif isinstance(exc, _ClosedBeforeHello):
                # nothing was sent: a port check (load balancer, Kubernetes tcpSocket probe)
                self.log.debug("connection closed before a handshake", peer=conn.peer_address)
            else:
                reason = "no complete handshake within the timeout" if isinstance(exc, TimeoutError) else str(exc)
                self.log.warning("handshake failed; closing connection", peer=conn.peer_address, error=reason)
                if isinstance(exc, ProtocolError) and not conn.closed:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.send([handshake.reject(reason)]), 1.0)
            await close_conn(conn)
            return
        finally:
            self.handshaking.pop(id(slot), None)
        if result is None or self._closing():
            await close_conn(conn)
            return
        hello, link, peers = result
        await self._register(conn, hello, link, outgoing=False, peers=peers)

    def _shed(self, slot: _Pending, key: str) -> None:
        """Close the oldest pending handshake to make room (one warning per _SHED_LOG_EVERY)."""
        self.handshaking.pop(id(slot), None)
        slot.shed = True
        try:  # tell a real dialer to try again, then close (flushing a few bytes does not wait)
            slot.conn.send_nowait([handshake.reject(f"busy: too many connections in handshake ({key})", retry=True)])
        except Exception:
            slot.conn.abort()
        else:
            self._spawn(close_conn(slot.conn), "aionet-shed")
        self._shed_count += 1
        now = time.monotonic()
        if now - self._shed_logged >= _SHED_LOG_EVERY:
            self._shed_logged = now
            self.log.warning(
                f"too many connections in handshake; shedding the oldest (limit {key})",
                peer=slot.conn.peer_address,
                shed_total=self._shed_count,
            )

    async def _accept_handshake(self, conn: Connection) -> tuple[handshake.Hello, Link, dict[str, list[str]]] | None:
        """Acceptor side. Keeps no state about the dialer until it proved the token: no peer
        entry, no stream id, nothing about the cluster in our HELLO."""
        try:
            frames = await conn.recv()
        except ConnectionClosed as exc:
            raise _ClosedBeforeHello(str(exc)) from exc
        if self._closing():
            # A stopping node opens no link: a handshake it completed now would give the dialer
            # a fresh link (a node already declared dead comes back to life there) only for this
            # node to close it. The dialer may retry: a restarted node answers.
            await self._refuse_stopping(conn)
            return None
        hs = self.handshake(
            handshake.Role.ACCEPTOR,
            self.config.link.handshake_timeout,
            local_peer=self._token is not None or is_local_address(conn.peer_address),
        )
        ev = hs.receive(frames)
        await self._flush(conn, hs)  # our HELLO (or, to a node that dialed itself, our identity)
        if isinstance(ev, (handshake.DialedSelf, handshake.Probed)):
            return None  # a seed list naming this node, or a membership probe: answered, no link
        proven = hs.receive(await conn.recv())  # the dialer's CONFIRM: its proof of the token
        hello = proven.hello
        if self._closing():  # it began stopping while the dialer proved the token
            await self._refuse_stopping(conn)
            return None
        # proven: from here on the dialer is a peer
        created = hello.name not in self._peers.table
        p = self._peers.peer(hello.name)
        if p.link is not None and p.link.dead is None:
            info = p.link.resume_info()
        else:
            old = p.link if p.link is not None and not p.link.left else None  # see _live_link
            # a link declared dead that still keeps our unacknowledged messages: promise the
            # same stream, so the peer keeps its place in it and they are replayed once
            keep = old.tx_id if old is not None and old.keeping else ""
            p.pending_tx = p.pending_tx or keep or uuid.uuid4().hex[:16]
            info = {"tx": p.pending_tx, "rx": old.rx_id if old else "", "recv": old.state.recv_seq if old else 0}
        try:
            hs.welcome(self._peers.proven_table(handshake.MAX_PEERS), info)
            await self._flush(conn, hs)
            resume = hs.receive(await conn.recv()).state
        except BaseException:
            if created and p.link is None and p.dialing is None and self._peers.get(hello.name) is p:
                del self._peers.table[hello.name]  # it never completed: leave nothing behind
            raise
        link = self._live_link(hello.name, p.pending_tx)
        p.pending_tx = ""
        for note in link.apply_resume(resume.link, hello.node_id):
            self.log.info("link resumed", peer=hello.name, note=note)
        return hello, link, resume.peers

    @staticmethod
    async def _refuse_stopping(conn: Connection) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.send([handshake.reject("the node is stopping", retry=True)]), 1.0)

    async def _register(
        self, conn: Connection, hello: handshake.Hello, link: Link, outgoing: bool, peers: dict[str, list[str]]
    ) -> PeerConn:
        p = self._peers.peer(hello.name)
        is_new_peer = p.link is not link or (not link.conns and link.state.next_seq == 1)
        p.since = time.monotonic()
        if hello.addresses:
            p.addresses = list(hello.addresses)
        self._next_conn_id += 1
        theirs = hello.features.get("compression", [])
        compress = self._compression and isinstance(theirs, list) and "lz4" in theirs
        c = PeerConn(self._next_conn_id, conn, hello.name, outgoing, compress)
        self.log.info(
            "peer connected", peer=hello.name, direction="out" if outgoing else "in", remote=conn.peer_address
        )
        self._peers.learn(peers)
        link.set_peer_limits(hello.features.get("limits"))
        link.set_batch_limit(hello.features.get(batch.FEATURE))
        link.set_rpc_batch_limit(hello.features.get(batch.RPC_FEATURE), hello.features.get(batch.RPC_WAIT_FEATURE))
        link.set_inline_services(hello.features.get(batch.RPC_INLINE_FEATURE))
        link.peer_takes_inline = batch.RPC_INLINE_FEATURE in hello.features
        link.peer_cancels = hello.features.get("cancel") is True
        self._start_reader(c, link)
        await link.attach(c, outgoing)
        self._peers.emit(hello.name, "connected", outgoing=outgoing, node_id=hello.node_id)
        if is_new_peer:
            self._peers.announce({hello.name: p.addresses}, exclude=hello.name)
        return c


def _explain_connect_error(url: str, exc: TransportError) -> TransportError:
    """Name the likely mistake when a tls:// dial is cut during the TLS handshake: a plain
    tcp:// listener reads the ClientHello as a bad frame and resets the connection, which the
    ssl module reports with no message at all."""
    cause = exc.__cause__
    if Address.parse(url).scheme != "tls" or not isinstance(
        cause, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)
    ):
        return exc
    return _WrongScheme(
        f"cannot connect to {url}: the connection was reset during the TLS handshake; the peer is "
        "not speaking TLS (a tcp:// listener?); check the scheme"
    )


def _worth_retrying(exc: BaseException) -> bool:
    """Whether a failed seed dial may succeed later (the seed is not up yet, is restarting, or
    shed our handshake), as opposed to a refusal that waiting cannot fix (wrong token, protocol
    version, duplicate name)."""
    if isinstance(exc, _HandshakeCut):
        return True
    if isinstance(exc, (HandshakeError, _WrongScheme)) or _tls_refusal(exc.__cause__):
        return False
    return isinstance(exc, (TransportError, OSError, TimeoutError, ConnectionClosed))


def _tls_refusal(exc: BaseException | None) -> bool:
    """A TLS error that another try would repeat (certificate not trusted, alert from the peer);
    an EOF mid-handshake may be a restart, so it is not one."""
    return isinstance(exc, ssl.SSLError) and not isinstance(exc, ssl.SSLEOFError)


def _seed_errors(errors: dict[str, BaseException]) -> str:
    return "; ".join(f"{url}: {exc or type(exc).__name__}" for url, exc in errors.items())


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a shared dial's failure as seen: its waiters get it through their shield."""
    if not task.cancelled():
        task.exception()
