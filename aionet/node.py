"""Node: the public object. Wires the transports, the core (peers, connect, dispatch, links,
router, device transfers) and the services, and delegates its public API to them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .cache import Cache
from .codecs import handshake
from .codecs.envelope import CONTROL_MIN, INLINE_SERVICES, REQ, SEND
from .codecs.serialize import Serializer
from .collectives import Collectives, Group
from .config import Config
from .core.busy_poll import BusyPoll
from .core.connect import Connector
from .core.device_transfer import DeviceTransfers, StagingRequired
from .core.dispatch import Dispatcher
from .core.peers import Peer, PeerDirectory
from .core.receive_targets import ReceiveTargets
from .core.router import Router
from .devices import Devices
from .errors import AionetError, NodeClosed, PeerUnavailable, RemoteError, SerializationError, WouldBlock
from .instrument import Instrument, Instruments
from .log import apply_level as apply_log_level
from .log import get_logger
from .membership import MemberEvent, MemberEventStream, Membership
from .scheduler import Scheduler, TaskRef  # tasks (issue 6)
from .security import is_local_address, load_token
from .stats import NodeStats
from .transports.base import Address, Listener
from .transports.registry import TransportRegistry

if TYPE_CHECKING:
    from .core.link import Link

_SERVICE_INFO = "aionet.info"
_SERVICE_ECHO = "aionet.echo"


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
        instruments: Sequence[Instrument] = (),
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
        self.instruments = Instruments(instruments, self.log)  # hooks for metrics and tracing
        self.serializer = Serializer.from_config(cfg)
        # what compute this node has: one Devices, handed to all that ask (transfers, load, scheduler)
        self.devices = Devices()
        # device arrays in messages (aionet/core/device_transfer.py); ``device_backend`` overrides the
        # array backend (tests and benchmarks pass aionet.devices.SimulatedDeviceBackend())
        self._device = DeviceTransfers(
            buffers=cfg.buffers,
            limits=cfg.limits,
            serializer=self.serializer,
            log=self.log,
            spawn=self._spawn,
            backend=device_backend,
            devices=self.devices,
            instruments=self.instruments,
        )
        self.transports = TransportRegistry(transports)
        self.router = Router(self.name, cfg.link, self.log, self.instruments)
        self.router.abandoned = self._abandoned
        self._token = load_token(cfg.security)
        self._listeners: list[Listener] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started_at = 0.0
        self._running = False
        self._closing = False
        self._starting: asyncio.Task[None] | None = None  # start()'s steps, while they run
        self._busy: BusyPoll | None = None  # node.busy_poll_us: made at start (it needs the loop)
        self._stopping: asyncio.Task[None] | None = None  # the one stop, once asked for
        self._control_handlers: dict[int, Callable[[str, list[Any]], None]] = {INLINE_SERVICES: self._on_inline}
        # the core, each part given the collaborators it needs (never the Node)
        self._directory = PeerDirectory(self.name, self.log, cfg.heartbeat.forget_after, self._spawn, self.instruments)
        self._peers: dict[str, Peer] = self._directory.table
        self._receive_targets = ReceiveTargets()  # receive-into for collectives' large segments
        self._dispatcher = Dispatcher(
            serializer=self.serializer,
            router=self.router,
            device=self._device,
            peers=self._directory,
            control_handlers=self._control_handlers,
            log=self.log,
            spawn=self._spawn,
            closing=lambda: self._closing,
            receive_targets=self._receive_targets,
        )
        self._connector = Connector(
            name=self.name,
            node_id=self.node_id,
            config=cfg,
            log=self.log,
            token=self._token,
            serializer=self.serializer,
            transports=self.transports,
            device=self._device,
            router=self.router,
            peers=self._directory,
            start_reader=self._dispatcher.start_reader,
            spawn=self._spawn,
            closing=lambda: self._closing,
            running=lambda: self._running,
            addresses=lambda: self.addresses,
        )
        self.router.add_service(_SERVICE_ECHO, _echo)
        self.router.add_service(_SERVICE_INFO, self._info_service)
        self.tracer: Any = None  # aionet.observe.trace.TraceRecorder while tracing ([trace], `aionet trace`)
        self.router.add_service("aionet.trace", self._trace_service)
        # the services, each on ports (aionet/core/ports.py): membership (gossip, failure detection, load)
        self.membership = Membership(
            cfg.heartbeat,
            messaging=self,
            control=self,
            peers=self._connector,
            join=bool(cfg.node.join),
            dumps=self.serializer.dumps,
            devices=self.devices,
            token=self._token,
            instruments=self.instruments,
        )
        # ... tasks (ownership table and executor), collectives (process groups)
        self.scheduler = Scheduler(
            cfg.scheduler,
            messaging=self,
            control=self,
            members=self.membership,
            dumps=self.serializer.dumps,
            load_fields=self.membership.load,
            devices=self.devices,
            instruments=self.instruments,
            task_node=self,  # task_context().node
            rank=cfg.node.rank,
        )
        self.cache = Cache(cfg.cache, messaging=self, members=self.membership)  # issue 14
        self.scheduler.locate = self.cache.owners  # cache_ref arguments: place tasks where the key is
        self._directory.member_state = self.membership.state_of
        self.collectives = Collectives(
            cfg.collectives,
            messaging=self,
            members=self.membership,
            instruments=self.instruments,
            device=self._device,
            inline_bytes=cfg.codec.oob_min_bytes,
            receive_into=self._receive_targets,
            native_endpoint=self._native_endpoint,
        )
        self.observer: Any = None  # aionet.observe.Observer while [http] port is set
        self._self_full: Any = None  # the own mailbox that last refused a send_nowait to this node
        # requests to this node itself still running (their deadlines, moved to now at stop)
        self._local_calls: set[asyncio.Timeout] = set()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, path: str | os.PathLike[str] | None = None, **overrides: Any) -> Node:
        """Build from a TOML or YAML (``.yaml``/``.yml``) file, or defaults when ``path`` is None; AIONET_* override."""
        cfg = Config.from_file(path) if path is not None else Config.from_dict({})
        return cls(config=cfg, **overrides)

    @classmethod
    def from_env(cls, path: str | os.PathLike[str] | None = None, **overrides: Any) -> Node:
        """Like :meth:`from_config`, plus what a launcher implies (mpirun, srun, torchrun, a
        Kubernetes StatefulSet, ``aionet launch``): name, rank, world size, listen and seeds."""
        from .launch.bootstrap import config_from_env  # pure detection; launch/ imports no Node

        return cls(config=config_from_env(path)[0], **overrides)

    @property
    def rank(self) -> int:
        """This node's rank in its launched world (-1 when not launched as part of one)."""
        return self.config.node.rank

    @property
    def world_size(self) -> int:
        """Ranks in the launched world (0 when not launched as part of one)."""
        return self.config.node.world_size

    def world(self) -> list[str] | None:
        """The launched world's node names in rank order, or None outside a launched world."""
        n = self.config.node
        names = [self.config.launch.name_format.format(rank=r) for r in range(n.world_size)]
        return names if n.world_size and names[n.rank] == self.name else None

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> Node:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Listen, join the seeds, start the services. A :meth:`stop` meanwhile ends it (the
        steps run in a task of their own, which stop cancels and waits for): start raises
        NodeClosed and leaves nothing running, however far it had got. A node starts once: a
        stopped (or stopping) one raises NodeClosed (its mailboxes and services are closed)."""
        if self._closing:
            raise NodeClosed(f"node {self.name!r} is stopped: a Node starts once (make a new Node)")
        if self._running:
            return
        self._started_at = time.time()
        self._running = True
        loop = asyncio.get_running_loop()
        self.router.bind_loop(loop)
        if self.config.node.busy_poll_us > 0:
            self._busy = BusyPoll(loop, self.config.node.busy_poll_us / 1e6)
            self._dispatcher.busy_poll = self._busy
        if self._token is None and not all(is_local_address(u) for u in self.config.node.listen):
            self.log.warning("no cluster token configured: accepting connections from this host only")
        self._starting = starting = asyncio.get_running_loop().create_task(self._start(), name="aionet-start")
        try:
            await starting  # (cancelling this call cancels the steps too)
        except BaseException as exc:
            current = asyncio.current_task()
            stopped = isinstance(exc, asyncio.CancelledError) and self._closing
            stopped = stopped and not (current is not None and current.cancelling())
            await self.stop()
            if stopped:
                raise NodeClosed(f"node {self.name!r} was stopped while starting") from None
            raise

    async def _start(self) -> None:
        for url in self.config.node.listen:
            transport = self._connector.transport(url)
            try:
                listener = await transport.listen(url, self._connector.on_accept)
            except OSError as exc:
                if not self._may_move(url, exc):
                    raise
                # a launched rank's computed port is taken on this host: any free one will do,
                # as this rank joins through the others (only the seeds' ports must be known)
                self.log.warning("launch port in use; listening on a free port instead", address=url)
                free = dataclasses.replace(Address.parse(url), port=0).url()
                listener = await transport.listen(free, self._connector.on_accept)
            self._listeners.append(listener)
            self.log.info("listening", address=listener.address)
        self._spawn(self._directory.prune_loop(lambda: self._closing), "aionet-peer-prune")
        if self.config.node.join:
            await self._connector.join(self.config.node.join)
        await self.membership.start()  # fetches the member table from the seeds joined above
        await self.scheduler.start()  # learns the members' resources
        await self.cache.start()
        if self.config.http.port:  # the top layer (aiohttp, prometheus-client), only when asked for
            from .observe import attach

            self.observer = await attach(self)
        if self.config.trace.enabled:
            await self._trace_service({"op": "start"})
        if self.world_size:
            await self.wait_members(self.world() or self.world_size, self.config.launch.wait_timeout)

    async def drain(self, timeout: float | None = None) -> int:
        """Leave gracefully with no work lost: take no new tasks, finish those accepted here (up
        to ``timeout``, default ``scheduler.drain_timeout``), then stop. Returns the number of
        tasks handed back (re-run elsewhere by their owners, not counted as retries)."""
        left = await self.scheduler.drain(self.config.scheduler.drain_timeout if timeout is None else timeout)
        await self.stop()
        return left

    def _may_move(self, url: str, exc: OSError) -> bool:
        """Whether a launched rank may listen elsewhere than ``url`` (one host, no advertised address)."""
        cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
        in_use = cause.errno == errno.EADDRINUSE or "address already in use" in str(exc)
        return bool(in_use and self.world_size and not self.config.node.advertise and self.config.node.join)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, let in-flight handlers answer (up to ``grace`` s), say BYE, close.

        The stop runs in a task of its own: every caller (a second stop, one from a task this
        node runs, which the stop itself cancels) waits for the same one, and none of them can
        cut it short. From a request handler it only begins the stop, which waits for that
        handler to answer (a "shutdown" service's caller gets its reply). A start still under
        way is ended first."""
        if self._stopping is None:
            if not self._running:
                return
            self._closing = True
            self._stopping = asyncio.get_running_loop().create_task(self._stop(grace), name="aionet-stop")
            self._stopping.add_done_callback(self._stopped)
        if asyncio.current_task() in self.router.tasks:  # waiting here would hold the stop up
            return
        await asyncio.shield(self._stopping)

    def _stopped(self, task: asyncio.Task[None]) -> None:
        """The stop task's failure is logged here, as no caller may be waiting for it (a
        handler's stop does not wait) to be told."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.log.error("stop failed", error=repr(exc))

    async def _stop(self, grace: float) -> None:
        starting = self._starting
        if starting is not None and not starting.done():
            starting.cancel()  # (start raises NodeClosed)
            await asyncio.wait([starting])
        if self.observer is not None:
            await self.observer.close()
            self.observer = None
        await self.membership.stop()  # announces a graceful leave before anything closes
        await self.scheduler.stop()  # fails tasks still owned here; drops queued work
        await self.collectives.close()  # pending collectives raise CollectiveError
        await self.cache.stop()
        for lst in self._listeners:
            with contextlib.suppress(Exception):
                await lst.close()
        await self.router.drain(grace)  # in-flight handlers answer, or are cancelled after grace
        for cm in list(self._local_calls):  # ... and so are requests to this node itself
            if not cm.expired():
                cm.reschedule(-1.0)  # a past deadline: expires at once
        await self._directory.close_links()  # BYE to each connected peer, then close
        self.router.fail_all("local node is shutting down")
        self.router.close_mailboxes()  # a recv waiting now (or later) raises NodeClosed
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2.0)
        await self.transports.aclose()
        self._device.close()
        self._running = False
        self.router.bind_loop(None)
        if self._busy is not None:
            self._busy.stop()
        self.log.info("stopped")

    def _native_endpoint(self) -> tuple[str, str] | str:
        """Where this node's groups listen for their native ring's streams: the host of its
        tcp:// listener, and the host peers dial it at. Why not, for a node without one."""
        for url in self.addresses:
            a = Address.parse(url)
            if a.scheme == "tcp":
                adv = Address.parse(self.address)
                return a.host, adv.host if adv.scheme == "tcp" and adv.host else a.host
        return (
            "the node does not listen on tcp:// (the native ring's streams are plain TCP: groups over "
            "tls://, zmq+tcp://, ucx://, rdma:// and inproc:// use the ring over their links)"
        )

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

    def peers(self) -> dict[str, dict[str, Any]]:
        """Known peers: name -> {addresses, connected}."""
        return self._directory.summary()

    # ------------------------------------------------------------------ membership, collectives
    def members(self) -> dict[str, dict[str, Any]]:
        """name -> state (alive/suspect/dead/left), address, incarnation, load, devices, age;
        this node included. Nodes that only connected (e.g. `aionet status`) are not members."""
        return self.membership.members()

    def group(self, members: Sequence[str] | None = None, name: str | None = None) -> Group:
        """A process group for collectives: ``members`` in rank order; by default the launched
        world in rank order, else every alive member sorted by name. Every member must create
        the same group. See aionet.collectives."""
        if members is None:
            members = self.world() or sorted(n for n, m in self.members().items() if m["state"] == "alive")
        return self.collectives.group(members, name)

    async def wait_workers(self, n: int, timeout: float | None = None) -> list[str]:
        """Wait until ``n`` nodes (this one included, if it runs tasks) take tasks from this
        node; returns their names. TimeoutError after ``timeout`` seconds names those there;
        NodeClosed when this node stops (or has stopped) first."""
        return await self.scheduler.wait_workers(n, timeout)

    async def wait_members(self, members: int | Sequence[str], timeout: float | None = None) -> list[str]:
        """Wait until ``members`` (names, or a count including this node) are alive; returns the
        alive names. Raises PeerUnavailable naming who is missing after ``timeout`` seconds,
        NodeClosed when this node stops (or has stopped) while some are missing."""

        def missing() -> list[str] | int:
            alive = {n for n, m in self.members().items() if m["state"] == "alive"}
            if isinstance(members, int):
                return max(0, members - len(alive))
            return [n for n in members if n not in alive]

        stopped = f"node {self.name!r} is stopped: no member can come up for it to see"
        async with self.member_events() as stream:
            try:
                async with asyncio.timeout(timeout):
                    while missing():
                        if self._closing:
                            raise NodeClosed(stopped)
                        await stream.get()
            except StopAsyncIteration:  # the stream ended: membership stopped with this node
                raise NodeClosed(stopped) from None
            except TimeoutError:
                left = missing()
                what = f"{left} more member(s)" if isinstance(left, int) else ", ".join(left)
                raise PeerUnavailable(
                    f"waited {timeout:g} s for {what} to be alive; check that every rank started and can reach a seed"
                ) from None
        return sorted(n for n, m in self.members().items() if m["state"] == "alive")

    def on_member_change(self, fn: Callable[[MemberEvent], Any]) -> Callable[[], None]:
        """Call ``fn(event)`` on every membership change; returns an unsubscribe function."""
        return self.membership.on_member_change(fn)

    def member_events(self, maxsize: int = 10_000) -> MemberEventStream:
        """``async for ev in node.member_events(): ...`` (subscribed from this call on)."""
        return self.membership.events(maxsize)

    def stats(self) -> NodeStats:
        """A typed snapshot of this node: peers, links, router, device transfers, membership,
        scheduler (:mod:`aionet.stats`); ``devices`` as of the last load report."""
        return NodeStats(
            name=self.name,
            node_id=self.node_id,
            pid=os.getpid(),
            version=__version__,
            protocol=handshake.PROTOCOL_VERSION,
            listen=tuple(self.addresses),
            advertise=self.config.node.advertise or None,
            transports=tuple(sorted({Address.parse(a).scheme for a in self.addresses})),
            uptime=time.time() - self._started_at if self._started_at else 0.0,
            peers=self._directory.stats(),
            router=self.router.stats(),
            device=self._device.stats(),
            membership=self.membership.stats(),
            scheduler=self.scheduler.stats(),
            devices=self.membership.load.last.devices(),
            busy_poll=self._busy.stats() if self._busy is not None else None,
        )

    def info(self) -> dict[str, Any]:
        """:meth:`stats` as plain data (what ``aionet info`` prints)."""
        return self.stats().as_dict()

    async def _trace_service(self, arg: Any) -> dict[str, Any]:
        from .observe.trace import handle_trace  # stdlib only; the top layer, loaded when asked

        return handle_trace(self, arg)

    async def _info_service(self, _arg: Any) -> dict[str, Any]:
        """``aionet.info``: :meth:`info` with devices probed afresh, off the loop (NVML can block)."""
        out = self.info()
        out["devices"] = await asyncio.to_thread(self.devices.discover)
        return out

    # ------------------------------------------------------------------ services & types
    def service(self, name: str, *, cancellable: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering a request handler: ``@node.service("echo") async def f(msg): ...``
        (``cancellable``: see :meth:`add_service`)."""

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add_service(name, fn, cancellable=cancellable)
            return fn

        return deco

    def add_service(self, name: str, fn: Callable[..., Any], *, cancellable: bool = True) -> None:
        """Register a request handler. An ``async def`` handler is cancelled when its caller
        gives up (timeout, cancelled task); ``cancellable=False`` lets it run to the end (a
        handler that must not stop half-way, and is not written to clean up on cancellation)."""
        self.router.add_service(name, fn, cancellable=cancellable)
        if any(p.link is not None for p in self._peers.values()):
            self._tell_inline_services()

    def _tell_inline_services(self) -> None:
        """Connected peers learned in our HELLO which services we answer inline (their requests
        to those take no slot); a service added since changes that list: tell them
        (INLINE_SERVICES, best effort: a peer that misses it counts those requests, which is
        safe, until the next connection's HELLO lists them)."""
        frames: list[Any] | None = None
        for p in self._peers.values():
            link = p.link
            if link is not None and link.peer_takes_inline and link.current is not None and link.dead is None:
                if frames is None:
                    frames = self.serializer.dumps([INLINE_SERVICES, self.router.inline_services()])
                link.send_control(list(frames))  # a list per connection: a transport may extend it

    def _on_inline(self, peer: str, env: list[Any]) -> None:
        """INLINE_SERVICES from ``peer``: the services it now answers inline (malformed: ignored)."""
        if (link := self._directory.live_link(peer)) is not None and len(env) == 2:
            link.set_inline_services(env[1])

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
        if (link := self._directory.live_link(peer)) is not None:
            link.send_control(self.serializer.dumps(envelope))
        return link is not None

    def on_connection_event(self, fn: Callable[[str, str, dict[str, Any]], None]) -> None:
        """``fn(peer, event, details)`` for event in "connected", "lost", "left", "dead".
        "lost" details carry ``reason`` and ``reset`` (True when the peer's socket was reset
        or refused: usually a killed process)."""
        self._directory.on_event(fn)

    def declare_dead(self, peer: str, reason: str) -> None:
        """Fail the link to ``peer`` now (membership decided it is dead): pending sends and
        requests raise PeerUnavailable; a later handshake from it starts a fresh link."""
        self._directory.declare_dead(peer, reason)

    def known_peers(self) -> dict[str, list[str]]:
        """name -> advertised addresses, for every peer this node has heard of."""
        return self._directory.known()

    # ------------------------------------------------------------------ messaging API
    def _poll_for(self, link: Link) -> None:
        """Busy-poll for what ``link`` brings next (a reply, an ack, room) where waiting for
        it would cost a wake-up: its connection's socket is read by this loop."""
        c = link.current
        if c is not None and c.conn.busy_polls:
            self._busy.kick()  # type: ignore[union-attr]

    async def send(self, peer: str, channel: str, obj: Any) -> None:
        """Send ``obj`` to ``peer``'s mailbox ``channel``: ordered, exactly once while both
        nodes live, back-pressured by ``link.max_inflight_bytes``. To this node's own name
        ``obj`` itself is queued, unserialized (do not change it after sending)."""
        if peer == self.name:
            self._check_running()
            if (fn := self.router.consumers.get(channel)) is not None:
                fn(self.name, obj)
                return
            await self.router.mailbox(channel).put((self.name, obj))
            return
        p = self._peers.get(peer)
        link = p.link if p is not None else None
        if link is None or link.dead is not None:
            link = await self._connector.link_to(peer)
        elif link.push(channel, obj):  # small and nothing to wait for: joins this iteration's batch
            return
        try:
            aw = link.post(SEND, [channel, obj])
            if aw is not None:
                if self._busy is not None:  # poll for the ack (or the room) rather than sleep
                    self._poll_for(link)
                await aw
            return
        except StagingRequired:  # device arrays: staged below, outside this handler (whose
            pass  # traceback would pin the first chunk's pool buffer for the whole transfer)
        await self._device.send(link, SEND, [channel, obj])

    def send_nowait(self, peer: str, channel: str, obj: Any) -> None:
        """:meth:`send` without waiting, for hot loops: the message takes its place in the
        stream now (same order, exactly-once and bounds as :meth:`send`), or nothing is sent
        and :class:`~aionet.WouldBlock` is raised when the send would have to wait (the
        link's window is full, the transport is busy, or the link is not up yet). Then
        ``await node.wait_space(peer)`` and send again. A peer no wait can reach (unknown,
        left, or this node stopped) raises PeerUnavailable, as :meth:`send` does. A large buffer you pass may be
        referenced until ``wait_space`` returns: do not modify it before. Device arrays need
        staging, which waits: send those with :meth:`send` (SerializationError here)."""
        if peer == self.name:
            self._check_running()
            if (fn := self.router.consumers.get(channel)) is not None:
                fn(self.name, obj)
                return
            mb = self.router.mailbox(channel)
            if not mb.put_nowait((self.name, obj)):
                self._self_full = mb
                raise WouldBlock(f"mailbox {channel!r} is full; await node.wait_space({peer!r}) and send again")
            return
        p = self._peers.get(peer)
        link = p.link if p is not None else None
        if link is None or link.dead is not None:
            self._connector.check_reachable(peer)  # never reachable: PeerUnavailable, not "wait"
            raise WouldBlock(f"no link to {peer!r} yet; await node.wait_space({peer!r}) (it connects) and send again")
        if link.push(channel, obj):
            return
        try:
            link.post_nowait(SEND, [channel, obj])
        except StagingRequired:
            raise SerializationError(
                f"a device array to {peer!r} needs staging, which waits: send it with await node.send()"
            ) from None

    def flush(self, peer: str | None = None) -> None:
        """Write now what this loop iteration queued for ``peer`` (every peer if None).

        Small messages sent in one iteration go out together when it ends, that is when the
        sending task next waits. Call this before running a while without awaiting (a long
        computation) so the peer is not kept waiting for what you sent before it."""
        for p in [self._peers.get(peer)] if peer is not None else list(self._peers.values()):
            if p is not None and p.link is not None:
                p.link.flush_now()

    async def wait_space(self, peer: str) -> None:
        """Wait until :meth:`send_nowait` to ``peer`` can take a message (connecting first if
        needed). Raises PeerUnavailable if the peer is gone."""
        if peer == self.name:
            self._check_running()
            mb, self._self_full = self._self_full, None
            if mb is not None and mb.qsize() >= self.router.mailbox_size:
                mb.check_open()  # stopping: nothing will take from it to wake us
                fut = mb.wait_room()
                try:
                    await fut
                except asyncio.CancelledError:
                    mb.give_up_room(fut)
                    raise
                mb.wake_putter()  # we put nothing ourselves: pass the wake-up on
            return
        p = self._peers.get(peer)
        link = p.link if p is not None else None
        if link is None or link.dead is not None:
            link = await self._connector.link_to(peer)
        await link.wait_space()

    async def send_many(self, peer: str, channel: str, objs: Sequence[Any]) -> None:
        """:meth:`send` each of ``objs`` in order (cheaper per message than a loop of sends);
        waits for window space as often as needed. One that cannot be sent (SerializationError,
        FrameTooLarge) raises: those before it are sent, none after it."""
        items = objs if isinstance(objs, list) else list(objs)
        if peer == self.name:
            for obj in items:
                await self.send(peer, channel, obj)
            return
        i, n = 0, len(items)
        while i < n:
            p = self._peers.get(peer)
            link = p.link if p is not None else None
            if link is None or link.dead is not None:
                link = await self._connector.link_to(peer)
            i = link.push_many(channel, items, i)
            if i < n:  # not batchable (or must wait): this one the slow way, then batch again
                await self.send(peer, channel, items[i])
                i += 1

    async def recv(self, channel: str, timeout: float | None = None) -> Any:
        """Next object from mailbox ``channel`` (any sender). See :meth:`recv_from`."""
        return (await self.recv_from(channel, timeout))[1]

    async def recv_from(self, channel: str, timeout: float | None = None) -> tuple[str, Any]:
        """Next (sender name, object) from mailbox ``channel``. Raises TimeoutError when
        nothing came within ``timeout`` s (a message waiting already is returned even with
        ``timeout=0``), NodeClosed once this node has stopped and the mailbox is empty."""
        mb = self.router.mailbox(channel)
        if timeout is None or mb.qsize():
            return await mb.get()
        return await _within(mb.get(), timeout, f"recv_from({channel!r})")

    def on_channel(self, channel: str, fn: Callable[[str, Any], None] | None) -> None:
        """Low-level, for services: hand each message for ``channel`` to ``fn(sender, obj)`` as
        it arrives instead of a mailbox (no mailbox bounds apply, so ``fn`` must not block and
        must bound what it keeps; ``None`` restores the mailbox, and a ``recv`` waiting on it
        meanwhile gets what arrives after). If ``fn`` raises, that message is dropped with an
        error log line; the connection goes on. Collectives use it."""
        self.router.on_channel(channel, fn)

    async def recv_batch(self, channel: str, limit: int = 65536, timeout: float | None = None) -> list[Any]:
        """At least one object, plus everything already waiting (up to ``limit``): cheap
        draining. ``timeout`` and errors as for :meth:`recv_from`."""
        if limit < 1:  # 0 would wait for a message, take none and return [] at once: a busy loop
            raise ValueError(f"recv_batch: limit must be at least 1 (got {limit})")
        mb = self.router.mailbox(channel)
        if timeout is None or mb.qsize():
            return [obj for _s, obj in await mb.get_batch(limit)]
        return [obj for _s, obj in await _within(mb.get_batch(limit), timeout, f"recv_batch({channel!r})")]

    async def request(self, peer: str, service: str, obj: Any = None, timeout: float | None = None) -> Any:
        """Call ``service`` on ``peer`` and return its reply. Raises RemoteError if the handler
        raised, PeerUnavailable if the peer is gone, asyncio.TimeoutError after ``timeout``."""
        if peer == self.name:
            return await self._request_self(service, obj, timeout)
        if timeout is None:
            return await self._request(peer, service, obj)
        p = self._peers.get(peer)
        link = p.link if p is not None else None
        if link is not None and link.dead is None and link.can_post():
            # a request to a service the peer answers inline takes none of its handler slots
            slots = None if service in link.inline_services else link.requests
            if slots is None or slots.out < slots.bound:
                # the usual case: nothing to wait for but the reply, whose future the router
                # fails with TimeoutError at the deadline (no timer per request, no asyncio.timeout)
                router = self.router
                rid, fut = router.new_request(peer, service)
                if slots is not None:
                    slots.out += 1
                sent = False
                try:
                    aw = link.post(REQ, [rid, service, obj])
                    sent = True
                    # the deadline is set once the request is written: its bookkeeping is then
                    # done while the peer works, not before the request leaves
                    router.expire_after(rid, service, timeout)
                    if aw is None:
                        return await fut
                except StagingRequired:
                    pass  # device arrays: the general path below stages them
                else:
                    # posted, but something must be waited for (a big message, a busy transport)
                    cm = asyncio.timeout(timeout)
                    try:
                        async with cm:
                            await aw
                            return await fut
                    except TimeoutError:
                        if not cm.expired():
                            raise
                        raise _expired(peer, service, timeout) from None
                finally:
                    router.forget(rid, sent)  # (its cancel goes before a waiting request takes the slot)
                    if slots is not None:
                        slots.release()
        # the timeout bounds the whole call: dialing, waiting for a request slot (the peer's
        # bound), for window space or for the transport to drain, staging, and the reply
        cm = asyncio.timeout(timeout)
        try:
            async with cm:
                return await self._request(peer, service, obj)
        except TimeoutError:
            if not cm.expired():
                raise
            raise _expired(peer, service, timeout) from None

    async def _request_self(self, service: str, obj: Any, timeout: float | None) -> Any:
        """A request to this node itself: the handler runs on the caller's task, within a
        deadline that :meth:`stop` moves to now, so that, like a remote caller, it is told
        (RemoteError ``asyncio.CancelledError``) rather than left waiting for a handler
        nothing will cancel. A timeout names the call, as a remote one's does."""
        self._check_running()
        cm = asyncio.timeout(timeout)
        self._local_calls.add(cm)
        try:
            async with cm:
                return await self.router.call_local(service, obj)
        except TimeoutError:
            if not cm.expired():
                raise
            if self._closing:
                raise RemoteError(
                    "asyncio.CancelledError", "handler cancelled (node shutting down)", "", self.name
                ) from None
            raise _expired(self.name, service, timeout or 0.0) from None
        finally:
            self._local_calls.discard(cm)

    def _check_running(self) -> None:
        """Messages to this node itself, once it has stopped, are refused as those to any peer
        are (its mailboxes take nothing more: a full one would make a sender wait for good)."""
        if self._closing and not self._running:  # (during stop, services may still ask)
            raise PeerUnavailable(f"{self.name}: local node is not running")

    async def _request(self, peer: str, service: str, obj: Any) -> Any:
        p = self._peers.get(peer)
        link = p.link if p is not None else None
        if link is None or link.dead is not None:
            link = await self._connector.link_to(peer)
        slots = None if service in link.inline_services else link.requests  # inline there: no slot
        if slots is not None:
            await slots.take()  # at the peer's bound: in line until one of ours ends
        router = self.router
        rid, fut = router.new_request(peer, service)
        sent = False
        try:
            staged = False
            try:
                aw = link.post(REQ, [rid, service, obj])
                sent = True
                if self._busy is not None:  # poll for the reply rather than sleep
                    self._poll_for(link)
                if aw is not None:
                    await aw
            except StagingRequired:  # device arrays: staged below, outside the handler
                staged = sent = True
            if staged:
                await self._device.send_request(link, [rid, service, obj], fut)
            return await fut
        finally:
            router.forget(rid, sent)
            if slots is not None:
                slots.release()

    def _abandoned(self, peer: str, rid: int) -> None:
        """Request ``rid`` to ``peer`` was given up unanswered (its caller cancelled, or its
        timeout passed): tell the peer, which cancels the handler if it still runs. Not sent
        when the link is gone (and with it the peer's handler) or the peer predates the feature."""
        p = self._peers.get(peer)
        link = p.link if p is not None else None
        if link is None or link.dead is not None or not link.peer_cancels:
            return
        try:
            link.post_cancel(rid)
        except AionetError as exc:  # the link just failed, ...
            self.log.debug("request cancel not sent", peer=peer, rid=rid, why=str(exc))
        except Exception as exc:  # never into the deadline timer or the caller's finally
            self.log.warning("request cancel failed", peer=peer, rid=rid, error=repr(exc))

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

    lock = property(lambda self: self.cache.lock, doc="``async with node.lock(name, ttl=10) as lease:`` (aionet.cache)")

    async def connect(self, url: str) -> str:
        """Dial ``url`` and return the peer's node name (also learns its peers)."""
        return (await self._connector.dial(url)).peer

    # ------------------------------------------------------------------ internals
    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        """Start a task this node owns (cancelled and awaited by :meth:`stop`)."""
        t = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t


def _echo(x: Any) -> Any:
    return x


async def _within(aw: Awaitable[Any], timeout: float, what: str) -> Any:
    """``await aw`` for at most ``timeout`` s, on the caller's task (no task per call, unlike
    ``asyncio.wait_for``); at the deadline raise a TimeoutError naming ``what``, so that the
    user reads which wait ran out, not an empty TimeoutError."""
    cm = asyncio.timeout(timeout)
    try:
        async with cm:
            return await aw
    except TimeoutError:
        if not cm.expired():
            raise
        raise TimeoutError(f"{what}: no message within {timeout} s") from None


def _expired(peer: str, service: str, timeout: float) -> TimeoutError:
    return TimeoutError(f"request {service!r} to {peer!r} timed out after {timeout} s")
