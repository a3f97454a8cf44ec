"""Node: the public object. Owns listeners, per-peer reliable links, the router and services."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._version import __version__
from .codecs import handshake
from .codecs.envelope import ACK, BYE, CONTROL_MIN, ERR, PEERS, REP, REQ, SEND, XFER
from .codecs.serialize import DecodeDeferred, Serializer
from .config import Config
from .device_transfer import DeviceTransfers, StagingRequired
from .devices import Devices
from .errors import (
    AionetError,
    ConnectionClosed,
    HandshakeError,
    PeerUnavailable,
    ProtocolError,
    TransportError,
)
from .link import SIZE_LIMITS, Link, close_conn, nbytes_of
from .log import apply_level as apply_log_level
from .log import get_logger
from .membership import MemberEvent, MemberEventStream, Membership
from .router import Mailbox, Router
from .scheduler import Scheduler, TaskRef  # tasks (issue 6)
from .security import is_local_address, is_local_host, is_loopback_host, load_token
from .transports.base import Address, Connection, Listener
from .transports.registry import TransportRegistry

_SERVICE_INFO = "aionet.info"
_SERVICE_ECHO = "aionet.echo"
MAX_PEERS_PER_MESSAGE = 1024  # entries of a PEERS message / HELLO peer table acted on
MAX_HEARSAY_PEERS = 4096  # known peers beyond which names learned from others are ignored
DIAL_GAP = 0.1  # s between dials by name of one address (one at a time), however many names name it
_PRUNE_EVERY = 1.0  # s between sweeps of the peer table (departed clients, dead non-members)
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
class _Conn:
    """A live, handshaken connection to a peer."""

    id: int
    conn: Connection
    peer: str
    outgoing: bool
    compress: bool
    since: float = field(default_factory=time.monotonic)


@dataclass
class _Peer:
    """A peer this node knows: created only for peers that proved the token (a completed
    handshake) or that a proven peer told us about; pruned once it departs (see _prune_peers)."""

    name: str
    addresses: list[str] = field(default_factory=list)
    link: Link | None = None
    dialing: asyncio.Future[Link] | None = None
    pending_tx: str = ""  # stream id promised in a handshake before the link existed
    since: float = field(default_factory=time.monotonic)  # last learned or (re)connected


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


class Node:
    """An aionet node: ``async with aionet.Node(name="a", listen="tcp://127.0.0.1:0") as node: ...``"""

    def __init__(
        self,
        name: str | None = None,
        listen: str | Sequence[str] | None = None,
        join: str | Sequence[str] | None = None,
        advertise: str | None = None,
        *,
        config: Config | None = None,
        transports: dict[str, Any] | None = None,
        device_backend: Any = None,
    ):
        cfg = config if config is not None else Config.from_dict({})
        if name is not None:
            cfg.node.name = name
        if listen is not None:
            cfg.node.listen = [listen] if isinstance(listen, str) else list(listen)
        if join is not None:
            cfg.node.join = [join] if isinstance(join, str) else list(join)
        if advertise is not None:
            cfg.node.advertise = advertise
        cfg.validate()
        if not cfg.node.name:
            cfg.node.name = f"node-{uuid.uuid4().hex[:8]}"
        self.config = cfg
        self.name: str = cfg.node.name
        self.node_id = uuid.uuid4().hex
        apply_log_level(cfg.log.level)  # [log] level, when set: the "aionet" stdlib logger's level
        self.log = get_logger("aionet.node", node=self.name)
        self.serializer = Serializer.from_config(cfg)
        # what compute this node has: the node's one Devices, handed to everything that asks
        # (device transfers, membership's load reports, the scheduler's resources, aionet.info)
        self.devices = Devices()
        # device arrays in messages (aionet/device_transfer.py); ``device_backend`` overrides the
        # array backend (tests and benchmarks pass aionet.devices.SimulatedDeviceBackend())
        self._device = DeviceTransfers(
            buffers=cfg.buffers,
            limits=cfg.limits,
            serializer=self.serializer,
            log=self.log,
            spawn=lambda coro, name: self._spawn(coro, name=name),
            backend=device_backend,
            devices=self.devices,
        )
        self.transports = TransportRegistry(transports)
        self.router = Router(
            self.name,
            cfg.link.mailbox_size,
            self.log,
            cfg.link.mailbox_bytes,
            cfg.link.max_concurrent_requests,
            peer_mailbox_bytes=cfg.link.peer_mailbox_bytes,
            peer_mailbox_size=cfg.link.peer_mailbox_size,
        )
        self._token = load_token(cfg.security)
        self._peers: dict[str, _Peer] = {}
        self._listeners: list[Listener] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._next_conn_id = 0
        self._dial_turns: dict[str, list[Any]] = {}  # address -> [lock, users, next start]: _dial_turn
        # accepted connections still in their handshake, oldest first (dicts keep insertion order)
        self._handshaking: dict[int, _Pending] = {}
        self._shed_count = 0
        self._shed_logged = 0.0
        self._started_at = 0.0
        self._running = False
        self._closing = False
        self._compression = cfg.codec.compression != "none"
        self._control_handlers: dict[int, Callable[[str, list[Any]], None]] = {}
        self._conn_listeners: list[Callable[[str, str, dict[str, Any]], None]] = []
        self.router.add_service(_SERVICE_ECHO, _echo)
        self.router.add_service(_SERVICE_INFO, self._info_service)
        # membership (issue 5): gossip, heartbeats, failure detection, load reports
        self.membership = Membership(self, cfg.heartbeat, devices=self.devices)
        # tasks (issue 6): this node's ownership table and executor
        self.scheduler = Scheduler(self, devices=self.devices)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, path: str | os.PathLike[str] | None = None, **overrides: Any) -> Node:
        """Build from a TOML file (or defaults when ``path`` is None) plus AIONET_* overrides."""
        cfg = Config.from_file(path) if path is not None else Config.from_dict({})
        return cls(config=cfg, **overrides)

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> Node:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._running:
            return
        self._started_at = time.time()
        self._running = True
        if self._token is None and not all(is_local_address(u) for u in self.config.node.listen):
            self.log.warning("no cluster token configured: accepting connections from this host only")
        try:
            for url in self.config.node.listen:
                transport = self._transport(url)
                listener = await transport.listen(url, self._on_accept)
                self._listeners.append(listener)
                self.log.info("listening", address=listener.address)
            self._spawn(self._prune_loop(), name="aionet-peer-prune")
            if self.config.node.join:
                await self._join(self.config.node.join)
            await self.membership.start()  # fetches the member table from the seeds joined above
            await self.scheduler.start()  # learns the members' resources
        except BaseException:
            await self.stop()
            raise

    async def _join(self, seeds: Sequence[str]) -> None:
        """Dial the seeds until one answers, for up to ``node.join_timeout`` seconds.

        Clusters are started in parallel (StatefulSets, SLURM, scripts), so a seed that is not
        up yet is normal: every round dials all remaining seeds at once, and rounds repeat with
        jittered exponential backoff. Seeds naming this node itself are skipped (all nodes may
        share one seed list); if no other seed is left, this node starts the cluster. Errors
        that waiting cannot fix (a wrong token, another protocol version) fail at once."""
        timeout = self.config.node.join_timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pending = [url for url in dict.fromkeys(seeds) if not self._is_own_address(url)]
        delay = _JOIN_FIRST_DELAY
        rounds = 0
        while True:
            if not pending:
                self.log.info("this node is its only seed: starting a new cluster")
                return
            rounds += 1
            results = await asyncio.gather(*(self._dial(url) for url in pending), return_exceptions=True)
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
            left = deadline - loop.time()
            if left <= 0:
                waited = f"within node.join_timeout={timeout:g} s" if timeout else "(node.join_timeout = 0)"
                raise PeerUnavailable(
                    f"could not reach any seed {waited}: {_seed_errors(errors)}; start a seed first, "
                    "check node.join, or raise node.join_timeout"
                )
            pause = min(left, delay * random.uniform(0.5, 1.0))
            self.log.info(
                "waiting for seeds",
                seeds=pending,
                attempt=rounds,
                retry_in=round(pause, 2),
                gives_up_in=round(left, 1),
                error=str(next(iter(errors.values()))),
            )
            await asyncio.sleep(pause)
            delay = min(delay * 2, _JOIN_MAX_DELAY)

    def _is_own_address(self, url: str) -> bool:
        """True when ``url`` names one of this node's own listeners (same scheme and port, and
        the same host, a loopback host, or any host of a wildcard listener that is local)."""
        try:
            a = Address.parse(url)
        except AionetError:
            return False
        for own in [*self.addresses, *self._advertised()]:
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

    async def _prune_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(_PRUNE_EVERY)
            try:
                self._prune_peers()
            except Exception as exc:  # a bug here must not end the sweeps (nor surface unretrieved)
                self.log.error("peer table sweep failed", error=repr(exc))

    def _prune_peers(self) -> None:
        """Forget peers that are gone, so the table tracks the cluster, not its history:
        a peer that said goodbye (e.g. an ``aionet status`` client) once its connections closed;
        a dead peer that is not a cluster member (members stay while membership may revive
        them); an address learned from a peer but never connected, after
        ``heartbeat.forget_after``."""
        now = time.monotonic()
        forget = self.config.heartbeat.forget_after
        for name, p in list(self._peers.items()):
            if p.dialing is not None:
                continue
            link = p.link
            member = self.membership.state_of(name)
            if link is None:
                gone = member is None and now - p.since > forget
            elif link.left:
                gone = not link.conns and member in (None, "left")
            elif link.dead is not None:
                gone = not link.conns and member is None
            else:
                gone = False
            if gone:
                del self._peers[name]
                self.log.debug("forgot peer", peer=name)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, let in-flight handlers answer (up to ``grace`` s), say BYE, close."""
        if self._closing or not self._running:
            return
        self._closing = True
        await self.membership.stop()  # announces a graceful leave before anything closes
        await self.scheduler.stop()  # fails tasks still owned here; drops queued work
        for lst in self._listeners:
            with contextlib.suppress(Exception):
                await lst.close()
        handlers = list(self.router.tasks)
        if handlers:
            _done, pending = await asyncio.wait(handlers, timeout=grace)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        links = [p.link for p in self._peers.values() if p.link is not None and p.link.dead is None]
        byes = [asyncio.ensure_future(self._say_bye(link)) for link in links if link.current is not None]
        if byes:
            await asyncio.wait(byes, timeout=2.0)
        for link in links:
            link.left = True
            for c in list(link.conns):
                await close_conn(c.conn)
            link.fail(PeerUnavailable(f"{link.peer}: local node is shutting down"))
        self.router.fail_all("local node is shutting down")
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2.0)
        await self.transports.aclose()
        self._device.close()
        self._running = False
        self.log.info("stopped")

    async def _say_bye(self, link: Link) -> None:
        with contextlib.suppress(Exception):
            await link.send(BYE, [])
            await link.wait_acked(link.state.next_seq - 1)

    # ------------------------------------------------------------------ properties
    @property
    def addresses(self) -> list[str]:
        """Bound listen URLs (port 0 resolved); what peers dial unless ``advertise`` is set."""
        return [lst.address for lst in self._listeners]

    @property
    def address(self) -> str:
        if self.config.node.advertise:
            return self.config.node.advertise
        addrs = self.addresses
        if not addrs:
            raise AionetError("node is not listening (not started?)")
        return addrs[0]

    def _advertised(self) -> list[str]:
        adv = self.config.node.advertise
        return [adv] if adv else self.addresses

    def peers(self) -> dict[str, dict[str, Any]]:
        """Known peers: name -> {addresses, connected}."""
        return {
            n: {"addresses": list(p.addresses), "connected": p.link is not None and p.link.current is not None}
            for n, p in self._peers.items()
        }

    def _state(self, p: _Peer) -> str:
        link = p.link
        if link is None:
            return "unknown"
        if link.left:
            return "left"
        if link.dead is not None:
            return "dead"
        return "alive" if link.current is not None else "suspect"

    # --- membership (issue 5) ---------------------------------------------------------
    def members(self) -> dict[str, dict[str, Any]]:
        """name -> state (alive/suspect/dead/left), address, incarnation, load, devices, age;
        this node included. Nodes that only connected (e.g. `aionet status`) are not members."""
        return self.membership.members()

    def on_member_change(self, fn: Callable[[MemberEvent], Any]) -> Callable[[], None]:
        """Call ``fn(event)`` on every membership change; returns an unsubscribe function."""
        return self.membership.on_member_change(fn)

    def member_events(self, maxsize: int = 10_000) -> MemberEventStream:
        """``async for ev in node.member_events(): ...`` (subscribed from this call on)."""
        return self.membership.events(maxsize)

    # --- end membership ------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        peers: dict[str, Any] = {}
        for n, p in self._peers.items():
            link = p.link
            conns = [
                {
                    "outgoing": c.outgoing,
                    "local": c.conn.local_address,
                    "remote": c.conn.peer_address,
                    "compress": c.compress,
                    **c.conn.extra_info(),
                }
                for c in (link.conns if link else [])
                if not c.conn.closed
            ]
            peers[n] = {
                "state": self._state(p),
                "addresses": list(p.addresses),
                # unacknowledged bytes (the back-pressure window) and bytes waiting in our
                # transport buffers to be written / delivered, summed over connections
                "inflight_bytes": link.state.inflight_bytes if link else 0,
                "queued_send_bytes": sum(
                    c.get("write_buffer_size", 0) + c.get("pending_write_bytes", 0) for c in conns
                ),
                "queued_recv_bytes": sum(c.get("queued_recv_bytes", 0) for c in conns),
                "link": link.info() if link else None,
                "connections": conns,
            }
        return {
            "name": self.name,
            "node_id": self.node_id,
            "pid": os.getpid(),
            "version": __version__,
            "protocol": handshake.PROTOCOL_VERSION,
            "listen": self.addresses,
            "advertise": self.config.node.advertise or None,
            "transports": sorted({Address.parse(a).scheme for a in self.addresses}),
            "uptime": time.time() - self._started_at if self._started_at else 0.0,
            "peers": peers,
            "services": sorted(self.router.services),
            "mailboxes": {ch: mb.qsize() for ch, mb in self.router.mailboxes.items()},
            "mailbox_bytes": {ch: mb.nbytes for ch, mb in self.router.mailboxes.items()},
            "device": self._device.info(),
            # CPU, memory and GPUs as of the last load report (aionet.info reads them fresh)
            "devices": self.membership.load.last.devices(),
        }

    async def _info_service(self, _arg: Any) -> dict[str, Any]:
        """The built-in ``aionet.info``: :meth:`info` with a fresh device probe (off the loop:
        NVML and CUDA probes can block)."""
        out = self.info()
        out["devices"] = await asyncio.to_thread(self.devices.discover)
        return out

    # ------------------------------------------------------------------ services & types
    def service(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering a request handler: ``@node.service("echo") async def f(msg): ...``"""

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.router.add_service(name, fn)
            return fn

        return deco

    def add_service(self, name: str, fn: Callable[..., Any]) -> None:
        self.router.add_service(name, fn)

    def register_type(self, cls: type, name: str | None = None) -> type:
        """Register a dataclass so instances travel (do it on every node that sends or receives it)."""
        return self.serializer.register(cls, name)

    # ------------------------------------------------------------------ hooks for services
    def add_control_handler(self, kind: int, fn: Callable[[str, list[Any]], None]) -> None:
        """Handle unsequenced control envelopes ``[kind, ...]`` (kind >= 11) from peers,
        e.g. heartbeats: ``fn(peer_name, envelope)`` runs inline on the reader; keep it quick."""
        if kind < CONTROL_MIN or kind in self._control_handlers:
            raise ValueError(f"control kind {kind} is reserved or taken")
        self._control_handlers[kind] = fn

    def send_control(self, peer: str, envelope: list[Any]) -> bool:
        """Best-effort, unsequenced, not replayed (heartbeats, probes). False if not connected."""
        p = self._peers.get(peer)
        link = p.link if p is not None else None
        if link is None or link.current is None or link.dead is not None:
            return False
        link.send_control(self.serializer.dumps(envelope))
        return True

    def on_connection_event(self, fn: Callable[[str, str, dict[str, Any]], None]) -> None:
        """``fn(peer, event, details)`` for event in "connected", "lost", "left", "dead".
        "lost" details carry ``reason`` and ``reset`` (True when the peer's socket was reset
        or refused: usually a killed process)."""
        self._conn_listeners.append(fn)

    def _emit(self, peer: str, event: str, **details: Any) -> None:
        for fn in list(self._conn_listeners):
            try:
                fn(peer, event, details)
            except Exception as exc:  # a listener bug must not break the reader
                self.log.error("connection event listener failed", error=repr(exc))

    def declare_dead(self, peer: str, reason: str) -> None:
        """Fail the link to ``peer`` now (membership decided it is dead): pending sends and
        requests raise PeerUnavailable; a later handshake from it starts a fresh link."""
        p = self._peers.get(peer)
        if p is not None and p.link is not None and p.link.dead is None:
            p.link.fail(PeerUnavailable(f"{peer}: declared dead ({reason})"))

    def known_peers(self) -> dict[str, list[str]]:
        """name -> advertised addresses, for every peer this node has heard of."""
        return {n: list(p.addresses) for n, p in self._peers.items()}

    # ------------------------------------------------------------------ messaging API
    async def send(self, peer: str, channel: str, obj: Any) -> None:
        """Send ``obj`` to ``peer``'s mailbox ``channel``: ordered, exactly once while both
        nodes live, back-pressured by ``link.max_inflight_bytes``."""
        if peer == self.name:
            await self.router.mailbox(channel).put((self.name, obj))
            return
        p = self._peers.get(peer)
        link = p.link if p is not None else None
        if link is None or link.dead is not None:
            link = await self._link_to(peer)
        try:
            aw = link.post(SEND, [channel, obj])
            if aw is not None:
                await aw
            return
        except StagingRequired:  # device arrays: staged below, outside this handler (whose
            pass  # traceback would pin the first chunk's pool buffer for the whole transfer)
        await self._device.send(link, SEND, [channel, obj])

    async def recv(self, channel: str, timeout: float | None = None) -> Any:
        """Next object from mailbox ``channel`` (any sender)."""
        return (await self.recv_from(channel, timeout))[1]

    async def recv_from(self, channel: str, timeout: float | None = None) -> tuple[str, Any]:
        """Next (sender name, object) from mailbox ``channel``."""
        mb = self.router.mailbox(channel)
        if timeout is None:
            return await mb.get()
        return await asyncio.wait_for(mb.get(), timeout)

    async def recv_batch(self, channel: str, limit: int = 65536) -> list[Any]:
        """At least one object, plus everything already waiting (up to ``limit``): cheap draining."""
        return [obj for _s, obj in await self.router.mailbox(channel).get_batch(limit)]

    async def request(self, peer: str, service: str, obj: Any = None, timeout: float | None = None) -> Any:
        """Call ``service`` on ``peer`` and return its reply. Raises RemoteError if the handler
        raised, PeerUnavailable if the peer is gone, asyncio.TimeoutError after ``timeout``."""
        if peer == self.name:
            coro = self.router.call_local(service, obj)
            return await (asyncio.wait_for(coro, timeout) if timeout is not None else coro)
        if timeout is None:
            return await self._request(peer, service, obj)
        # the timeout bounds the whole call: dialing, waiting for window space or for the
        # transport to drain, staging, and the reply
        cm = asyncio.timeout(timeout)
        try:
            async with cm:
                return await self._request(peer, service, obj)
        except TimeoutError:
            if not cm.expired():
                raise
            raise _expired(peer, service, timeout) from None

    async def _request(self, peer: str, service: str, obj: Any) -> Any:
        p = self._peers.get(peer)
        link = p.link if p is not None else None
        if link is None or link.dead is not None:
            link = await self._link_to(peer)
        router = self.router
        rid, fut = router.new_request(peer)
        try:
            staged = False
            try:
                aw = link.post(REQ, [rid, service, obj])
                if aw is not None:
                    await aw
            except StagingRequired:  # device arrays: staged below, outside the handler
                staged = True
            if staged:
                await self._device.send_request(link, [rid, service, obj], fut)
            return await fut
        finally:
            router.forget(rid)

    # --- tasks (issue 6) ------------------------------------------------------------------
    def submit(self, fn: Any, *args: Any, **options: Any) -> TaskRef:
        """Run ``fn`` ("pkg.mod:fn") somewhere in the cluster; ``await`` the returned TaskRef.
        Options: resources, priority, retries, timeout, executor, key, preemptible, affinity,
        policy; other keyword arguments go to ``fn``, or pass them as ``kwargs={...}`` (then every
        other keyword is an option). The executing node must allow fn's module
        (``scheduler.allow_modules``). See aionet.scheduler."""
        return self.scheduler.submit(fn, *args, **options)

    async def map(self, fn: Any, *iterables: Any, **options: Any) -> list[Any]:
        """``[fn(*items) for items in zip(*iterables)]`` as tasks, results in order."""
        return await self.scheduler.map(fn, *iterables, **options)

    async def gather(self, refs: Any, return_exceptions: bool = False) -> list[Any]:
        """Results of TaskRefs, in order."""
        return await self.scheduler.gather(refs, return_exceptions=return_exceptions)

    # --- end tasks ------------------------------------------------------------------------

    async def connect(self, url: str) -> str:
        """Dial ``url`` and return the peer's node name (also learns its peers)."""
        return (await self._dial(url)).peer

    # ------------------------------------------------------------------ links
    async def _link_to(self, name: str) -> Link:
        """A live link to ``name``, dialing it if needed."""
        p = self._peers.get(name)
        if p is not None and p.link is not None and p.link.dead is None:
            return p.link
        if not self._running or self._closing:
            raise PeerUnavailable(f"{name}: local node is not running")
        if p is None or not p.addresses:
            known = ", ".join(sorted(self._peers)) or "none"
            raise PeerUnavailable(f"unknown peer {name!r} (known peers: {known})")
        if p.link is not None and p.link.left:
            raise PeerUnavailable(f"{name}: peer has left the cluster")
        if p.dialing is None or p.dialing.done():
            # on a task of its own, shared by every caller: a caller that gives up (its
            # request timed out, it was cancelled) stops waiting without cancelling the dial
            p.dialing = self._spawn(self._dial_link(p), name="aionet-dial")
        dialing = p.dialing
        try:
            return await asyncio.shield(dialing)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if dialing.cancelled() and not (task is not None and task.cancelling()):
                raise PeerUnavailable(f"{name}: dial cancelled (local node is shutting down)") from None
            raise

    async def _dial_link(self, p: _Peer) -> Link:
        try:
            await self._dial_peer(p.name)
            link = p.link
            assert link is not None
            return link
        finally:
            p.dialing = None

    async def _dial_peer(self, name: str) -> None:
        p = self._peers[name]
        errors: list[str] = []
        # A handshake cut short (both sides dialing each other as one restarts or joins) is
        # transient: retry briefly. A refused connection or a failed proof is not.
        for attempt in range(3):
            transient = False
            for url in list(p.addresses):
                try:
                    async with self._dial_turn(url):
                        await self._dial(url, expect=name)
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
            redial=lambda: self._dial_peer(name),
            on_dead=self._on_link_dead,
            limits=self.config.limits,
        )
        if tx_id:
            link.tx_id = tx_id
        return link

    def _on_link_dead(self, name: str, exc: BaseException) -> None:
        self._device.drop_peer(name, exc)
        self.router.fail_peer(name, exc if isinstance(exc, PeerUnavailable) else PeerUnavailable(str(exc)))
        link = self._peers[name].link if name in self._peers else None
        self._emit(name, "left" if link is not None and link.left else "dead", reason=str(exc))
        if not self._closing and not (link is not None and link.left):
            self.log.warning("peer link failed", peer=name, error=str(exc))

    def _peer(self, name: str) -> _Peer:
        p = self._peers.get(name)
        if p is None:
            p = self._peers[name] = _Peer(name)
        return p

    def _live_link(self, name: str, tx_id: str = "") -> Link:
        """The peer's link, replacing one that died (a fresh stream)."""
        p = self._peer(name)
        old = p.link
        if old is None or old.dead is not None:
            p.link = self._new_link(name, tx_id)
            if old is not None and not old.left:
                # Declared dead but maybe alive (a false suspicion): our outgoing stream is
                # gone, but remember how far we got in the peer's stream. If the peer kept it,
                # it replays what we have not acknowledged and we drop what we already
                # delivered; if it started a new one, the handshake resets this.
                p.link.inherit_rx(old)
        return p.link

    # ------------------------------------------------------------------ handshake
    def _transport(self, url: str) -> Any:
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
        return handshake.Hello(
            handshake.PROTOCOL_VERSION, self.name, self.node_id, self._advertised(), features, {}, nonce, mac, {}
        )

    def _peer_table(self) -> dict[str, list[str]]:
        """Live peers and their addresses, for a proven peer (WELCOME / RESUME)."""
        table = {
            n: list(p.addresses)
            for n, p in self._peers.items()
            if p.addresses and p.link is not None and not p.link.left and p.link.dead is None
        }
        if len(table) > handshake.MAX_PEERS:
            table = dict(list(table.items())[: handshake.MAX_PEERS])  # the rest spreads by gossip
        return table

    async def _dial(self, url: str, expect: str | None = None) -> _Conn:
        transport = self._transport(url)
        try:
            conn = await transport.connect(url, timeout=self.config.transport.connect_timeout)
        except TransportError as exc:
            better = _explain_connect_error(url, exc)
            if better is exc:
                raise
            raise better from exc
        timeout = self.config.link.handshake_timeout
        replied = False
        try:
            async with asyncio.timeout(timeout):
                nonce_d = handshake.new_nonce()
                await conn.send([self._hello(nonce_d, b"").encode()])
                hello = handshake.parse(await conn.recv())
                replied = True
                if hello.node_id == self.node_id:
                    raise _DialedSelf(f"{url} is this node itself")
                if expect is not None and hello.name != expect:
                    raise HandshakeError(f"{url} is node {hello.name!r}, expected {expect!r}")
                if hello.name == self.name:
                    raise HandshakeError(f"{url} is node {self.name!r} too; node names must be unique")
                if hello.features.get("auth") and not self._token:
                    raise HandshakeError(
                        f"{url}: peer {hello.name!r} requires a cluster token and none is configured "
                        "(set security.token or security.token_file)"
                    )
                expected = handshake.mac(self._token, b"A", nonce_d, hello.nonce, hello.name, self.name)
                if self._token and not handshake.verify(expected, hello.mac):
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.send([handshake.reject("authentication failed")]), 1.0)
                    raise HandshakeError(f"{url}: peer {hello.name!r} failed to prove the cluster token")
                mac_d = handshake.mac(self._token, b"D", hello.nonce, nonce_d, self.name, hello.name)
                await conn.send([handshake.Confirm(mac_d).encode()])
                welcome = handshake.parse_state(await conn.recv(), handshake.WELCOME)
                # a crossing dial from the peer may already have been promised a stream id in our
                # WELCOME: use it, or both sides reset each other's fresh stream (lost messages)
                pending = self._peer(hello.name)
                link = self._live_link(hello.name, pending.pending_tx)
                if pending.link is link:
                    pending.pending_tx = ""
                notes = link.apply_resume(welcome.link, hello.node_id)
                resume = handshake.State(handshake.RESUME, self._peer_table(), link.resume_info())
                await conn.send([resume.encode()])
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
        for note in notes:
            self.log.info("link resumed", peer=hello.name, note=note)
        return await self._register(conn, hello, link, outgoing=True, peers=welcome.peers)

    async def _on_accept(self, conn: Connection) -> None:
        """Run the acceptor's side of a handshake in a bounded slot.

        Slots are limited per remote host (``link.max_handshakes_per_host``) and in total
        (``link.max_handshakes``). When either is full the OLDEST pending handshake (of that
        host, or overall) is shed, not the newcomer: silent sockets cannot lock legitimate
        peers out, since a real handshake takes a round trip or two while a flood's sockets
        sit idle until shed or timed out (``link.handshake_timeout``)."""
        cfg = self.config.link
        host = _host_of(conn.peer_address)
        same_host = [h for h in self._handshaking.values() if h.host == host]
        if len(same_host) >= cfg.max_handshakes_per_host:
            self._shed(same_host[0], "link.max_handshakes_per_host")
        elif len(self._handshaking) >= cfg.max_handshakes:
            self._shed(next(iter(self._handshaking.values())), "link.max_handshakes")
        slot = _Pending(conn, host)
        self._handshaking[id(slot)] = slot
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
            self._handshaking.pop(id(slot), None)
        if result is None or self._closing:
            await close_conn(conn)
            return
        hello, link, peers = result
        await self._register(conn, hello, link, outgoing=False, peers=peers)

    def _shed(self, slot: _Pending, key: str) -> None:
        """Close the oldest pending handshake to make room (one warning per _SHED_LOG_EVERY)."""
        self._handshaking.pop(id(slot), None)
        slot.shed = True
        try:  # tell a real dialer to try again, then close (flushing a few bytes does not wait)
            slot.conn.send_nowait([handshake.reject(f"busy: too many connections in handshake ({key})", retry=True)])
        except Exception:
            slot.conn.abort()
        else:
            self._spawn(close_conn(slot.conn), name="aionet-shed")
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
        hello = handshake.parse(frames)
        if hello.node_id == self.node_id:  # we dialed ourselves (a seed list naming this node)
            await conn.send([self._hello(handshake.new_nonce(), b"").encode()])  # so the dialer sees it
            return None
        if hello.name == self.name:
            raise HandshakeError(f"peer uses this node's own name {self.name!r}; names must be unique")
        if self._token is None and not is_local_address(conn.peer_address):
            raise HandshakeError("this node has no cluster token and accepts local peers only")
        nonce_a = handshake.new_nonce()
        mac_a = handshake.mac(self._token, b"A", hello.nonce, nonce_a, self.name, hello.name)
        await conn.send([self._hello(nonce_a, mac_a).encode()])
        if hello.features.get("probe"):  # membership liveness probe: answered; no link
            return None
        confirm = handshake.parse_confirm(await conn.recv())
        expected = handshake.mac(self._token, b"D", nonce_a, hello.nonce, hello.name, self.name)
        if self._token and not handshake.verify(expected, confirm.mac):
            raise HandshakeError(f"peer {hello.name!r} failed to prove the cluster token (wrong token?)")
        # proven: from here on the dialer is a peer
        created = hello.name not in self._peers
        p = self._peer(hello.name)
        if p.link is not None and p.link.dead is None:
            info = p.link.resume_info()
        else:
            p.pending_tx = p.pending_tx or uuid.uuid4().hex[:16]
            old = p.link if p.link is not None and not p.link.left else None  # see _live_link
            info = {"tx": p.pending_tx, "rx": old.rx_id if old else "", "recv": old.state.recv_seq if old else 0}
        try:
            await conn.send([handshake.State(handshake.WELCOME, self._peer_table(), info).encode()])
            resume = handshake.parse_state(await conn.recv(), handshake.RESUME)
        except BaseException:
            if created and p.link is None and p.dialing is None and self._peers.get(hello.name) is p:
                del self._peers[hello.name]  # it never completed: leave nothing behind
            raise
        link = self._live_link(hello.name, p.pending_tx)
        p.pending_tx = ""
        for note in link.apply_resume(resume.link, hello.node_id):
            self.log.info("link resumed", peer=hello.name, note=note)
        return hello, link, resume.peers

    async def _register(
        self, conn: Connection, hello: handshake.Hello, link: Link, outgoing: bool, peers: dict[str, list[str]]
    ) -> _Conn:
        p = self._peer(hello.name)
        is_new_peer = p.link is not link or (not link.conns and link.state.next_seq == 1)
        p.since = time.monotonic()
        if hello.addresses:
            p.addresses = list(hello.addresses)
        self._next_conn_id += 1
        theirs = hello.features.get("compression", [])
        compress = self._compression and isinstance(theirs, list) and "lz4" in theirs
        c = _Conn(self._next_conn_id, conn, hello.name, outgoing, compress)
        self.log.info(
            "peer connected", peer=hello.name, direction="out" if outgoing else "in", remote=conn.peer_address
        )
        self._learn_peers(peers)
        link.set_peer_limits(hello.features.get("limits"))
        self._start_reader(c, link)
        await link.attach(c, outgoing)
        self._emit(hello.name, "connected", outgoing=outgoing, node_id=hello.node_id)
        if is_new_peer:
            self._announce({hello.name: p.addresses}, exclude=hello.name)
        return c

    def _learn_peers(self, table: dict[str, list[str]], hearsay: bool = True) -> None:
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
            if hearsay and name not in self._peers and len(self._peers) >= MAX_HEARSAY_PEERS:
                continue  # a full table: names only hearsay vouches for are not worth memory
            p = self._peer(name)
            if p.link is None or p.link.current is None:
                p.addresses = list(addrs)
                p.since = time.monotonic()

    def _announce(self, table: dict[str, list[str]], exclude: str) -> None:
        """Tell connected peers about a newly connected one (simple dissemination)."""
        for n, p in self._peers.items():
            link = p.link
            if n == exclude or link is None or link.current is None or link.dead is not None:
                continue
            self._spawn(_quiet(link.send(PEERS, [table])), name="aionet-announce")

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        t = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # ------------------------------------------------------------------ receiving
    def _start_reader(self, c: _Conn, link: Link) -> None:
        """Dispatch straight from the transport's read callback (push mode): no task wake-up
        per batch; a full mailbox or a reply that must wait pauses reading that connection."""

        def reply(kind: int, fields: list[Any]) -> Awaitable[None] | None:
            # Never block the reader on a reply: waiting for the transport to drain (or for
            # an ack, which this very reader must read) could deadlock two busy peers. The
            # reply's place in the stream is fixed by post(); finishing it runs on its own.
            if link.dead is not None:
                return None  # the caller is gone; nothing to tell
            try:
                aw = link.post(kind, fields, wait_ack=False)
            except PeerUnavailable:
                return None
            except StagingRequired:  # device arrays in the reply: staged on a task of its own
                self._spawn(self._device.send_reply(link, kind, fields), name="aionet-reply")
                return None
            except AionetError as exc:
                aw = link.post(ERR, [fields[0], "aionet.SerializationError", f"cannot send the reply: {exc}", ""])
            if aw is not None:
                self._spawn(self._finish_reply(aw, link, kind, fields), name="aionet-reply")
            return None

        def on_messages(batch: list[Any]) -> Awaitable[None] | None:
            return self._dispatch(c, link, reply, batch, 0)

        def on_closed(exc: BaseException) -> None:
            self._conn_closed(c, link, exc)

        c.conn.start_receiving(on_messages, on_closed)

    def _dispatch(self, c: _Conn, link: Link, reply: Any, batch: list[Any], start: int) -> Awaitable[None] | None:
        """Deliver ``batch[start:]``; returns an awaitable when delivery must pause (see _resume).

        A sequenced message counts as received (link.state.recv_seq, what we acknowledge)
        only once it is delivered; one that must wait for room is given back (unreceive) and
        dispatched again after the wait. So when the link fails while a batch is parked, the
        rest of the batch is simply dropped: a successor link (after a false death) starts at
        the last delivered message, and the peer replays the rest on it, once and in order."""
        if link.dead is not None:
            return None  # failed, or replaced by a successor: nothing more is delivered from here
        loads = self.serializer.loads
        loads_sized = self.serializer.loads_sized
        router = self.router
        deliver = router.deliver
        peer = c.peer
        nbytes = 0
        i = start
        n = len(batch)
        try:
            while i < n:
                frames = batch[i]
                i += 1
                if len(frames) > 1:
                    size = nbytes_of(frames)
                    nbytes += size
                else:
                    size = len(frames[0])
                try:
                    if len(frames) > 1:
                        # compressed frames only where negotiated; mailboxes and acks count the
                        # decompressed size (a compressed wire size says nothing about memory)
                        env, raw = loads_sized(frames, decompress=c.compress)
                        nbytes += raw - size
                        size = raw
                    else:
                        env = loads(frames)
                except DecodeDeferred as exc:  # a device array still arriving, or not deliverable here
                    wait = self._device.settle(exc, peer, link, reply, frames, router.on_reply)
                    if wait is None:
                        continue  # answered or logged by device_transfer.py
                    link.received(nbytes)
                    return self._resume(c, link, reply, batch, i - 1, wait)  # then decode it again
                if type(env) is not list or not env:
                    raise ProtocolError("envelope is not a non-empty list")
                kind = env[0]
                if kind >= ACK and kind != XFER:
                    if kind == ACK:
                        link.on_ack(env[1])
                    else:
                        handler = self._control_handlers.get(kind)
                        if handler is None:
                            raise ProtocolError(f"unknown control kind {kind!r}")
                        handler(peer, env)
                    continue
                if not link.state.on_receive(env[1]):
                    continue  # duplicate from a replay
                if env[2] > link.state.acked:
                    link.on_ack(env[2])
                if kind == SEND:
                    wait = deliver(peer, env[3], env[4], size)
                    if wait is not None:  # full mailbox, or this peer's share: stop reading until room
                        link.state.unreceive(env[1])
                        link.received(nbytes)
                        if type(wait) is Mailbox:
                            return self._resume(c, link, reply, batch, i - 1, wait.wait_room(), wait)
                        return self._resume(c, link, reply, batch, i - 1, wait)
                elif kind == REQ:
                    aw = router.on_request(env[3], env[4], env[5], reply, peer)
                    if aw is not None:  # too many of this peer's handlers running: stop reading
                        link.state.unreceive(env[1])
                        link.received(nbytes)
                        return self._resume(c, link, reply, batch, i - 1, aw)
                elif kind in (REP, ERR):
                    router.on_reply(kind, env[3], env[4:], peer)
                elif kind == PEERS:
                    self._learn_peers(env[3])
                elif kind == BYE:
                    self.log.info("peer left", peer=peer)
                    link.peer_left()
                elif kind == XFER:  # a chunk of a staged device array (device_transfer.py)
                    aw = self._device.on_chunk(peer, link, env)
                    if aw is not None:
                        link.received(nbytes)
                        return self._resume(c, link, reply, batch, i, aw)
                else:
                    raise ProtocolError(f"unknown envelope kind {kind!r}")
        except (ProtocolError, ValueError, TypeError, IndexError, KeyError) as exc:
            self.log.warning("bad message from peer; closing connection", peer=peer, error=str(exc))
            c.conn.abort()
            return None
        link.received(nbytes)
        return None

    async def _finish_reply(self, aw: Awaitable[None], link: Link, kind: int, fields: list[Any]) -> None:
        try:
            await aw
            return
        except StagingRequired:  # the reply waited for link space, then met a device array
            pass
        except Exception:
            return
        await self._device.send_reply(link, kind, fields)

    async def _resume(
        self, c: _Conn, link: Link, reply: Any, batch: list[Any], start: int, aw: Any, mb: Any = None
    ) -> None:
        """Wait for ``aw``, then deliver the rest of the batch (reading that connection stays
        paused until then). ``mb``: the mailbox whose room ``aw`` waits for."""
        try:
            await aw
        except PeerUnavailable:
            pass
        except asyncio.CancelledError:
            if mb is not None and aw.done() and not aw.cancelled():
                mb.wake_putter()  # woken, then cancelled: pass the wake-up on
            raise
        if link.dead is not None:
            if mb is not None:
                mb.wake_putter()  # we take no room after all: pass the wake-up on
            return
        more = self._dispatch(c, link, reply, batch, start)
        if more is not None:
            await more

    def _conn_closed(self, c: _Conn, link: Link, exc: BaseException) -> None:
        why = "connection closed"
        reset = False
        cause = exc.__cause__ if isinstance(exc, ConnectionClosed) else exc
        if link.left:
            why = "peer left the cluster"
        elif isinstance(cause, ProtocolError):
            why = f"protocol error: {cause}"
        elif cause is not None:
            why = f"connection lost: {cause}"
            reset = isinstance(cause, (ConnectionResetError, ConnectionRefusedError, BrokenPipeError))
        if not isinstance(exc, (ConnectionClosed, ProtocolError)):
            self.log.error("connection reader failed", peer=c.peer, error=repr(exc))
        if not c.conn.closed:
            c.conn.abort()
        if not self._closing:
            link.connection_lost(c)
            self.log.info("peer connection closed", peer=c.peer, reason=why)
            self._emit(c.peer, "lost", reason=why, reset=reset)


def _echo(x: Any) -> Any:
    return x


def _expired(peer: str, service: str, timeout: float) -> TimeoutError:
    return TimeoutError(f"request {service!r} to {peer!r} timed out after {timeout} s")


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


async def _quiet(aw: Any) -> None:
    with contextlib.suppress(Exception):
        await aw
