"""Node: the public object. Owns listeners, connections to peers, the router and services."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__
from .codecs import handshake
from .codecs.serialize import Serializer
from .config import Config
from .errors import (
    AionetError,
    ConfigError,
    ConnectionClosed,
    HandshakeError,
    PeerUnavailable,
    ProtocolError,
    SerializationError,
    TransportError,
)
from .log import get_logger
from .router import BYE, ERR, PEERS, REP, REQ, SEND, Router
from .transports.base import Address, Connection, Listener
from .transports.registry import TransportRegistry

_SERVICE_INFO = "aionet.info"
_SERVICE_ECHO = "aionet.echo"


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
    name: str
    addresses: list[str] = field(default_factory=list)
    node_id: str = ""
    conns: list[_Conn] = field(default_factory=list)
    dialing: asyncio.Future[_Conn] | None = None
    left: bool = False

    def current(self) -> _Conn | None:
        for c in self.conns:
            if not c.conn.closed:
                return c
        return None


class Node:
    """An aionet node: ``async with aionet.Node(name="a", listen="tcp://127.0.0.1:0") as node: ...``"""

    def __init__(
        self,
        name: str | None = None,
        listen: str | Sequence[str] | None = None,
        join: Sequence[str] | None = None,
        advertise: str | None = None,
        *,
        config: Config | None = None,
        transports: dict[str, Any] | None = None,
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
        self.log = get_logger("aionet.node", node=self.name)
        self.serializer = Serializer.from_config(cfg)
        self.transports = TransportRegistry(transports)
        self.router = Router(self.name, cfg.link.mailbox_size, self.log)
        self._peers: dict[str, _Peer] = {}
        self._listeners: list[Listener] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._next_conn_id = 0
        self._started_at = 0.0
        self._running = False
        self._closing = False
        self._compression = cfg.codec.compression != "none"
        self.router.add_service(_SERVICE_ECHO, _echo)
        self.router.add_service(_SERVICE_INFO, lambda _arg: self.info())

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
        try:
            for url in self.config.node.listen:
                transport = self._transport(url)
                listener = await transport.listen(url, self._on_accept)
                self._listeners.append(listener)
                self.log.info("listening", address=listener.address)
            if self.config.node.join:
                await self._join(self.config.node.join)
        except BaseException:
            await self.stop()
            raise

    async def _join(self, seeds: Sequence[str]) -> None:
        errors = []
        results = await asyncio.gather(*(self._dial(url) for url in seeds), return_exceptions=True)
        for url, res in zip(seeds, results, strict=True):
            if isinstance(res, BaseException):
                errors.append(f"{url}: {res}")
        if len(errors) == len(seeds):
            raise PeerUnavailable("could not reach any seed: " + "; ".join(errors))
        for e in errors:
            self.log.warning("seed unreachable", error=e)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, let in-flight handlers answer (up to ``grace`` s), say BYE, close."""
        if self._closing or not self._running:
            return
        self._closing = True
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
        conns = [c for p in self._peers.values() for c in p.conns]
        bye = self.serializer.dumps([BYE])
        for c in conns:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.conn.send(bye), 1.0)
        for c in conns:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.conn.close(), 2.0)
        self.router.fail_all("local node is shutting down")
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2.0)
        await self.transports.aclose()
        self._running = False
        self.log.info("stopped")

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
            n: {"addresses": list(p.addresses), "connected": p.current() is not None, "left": p.left}
            for n, p in self._peers.items()
        }

    def members(self) -> dict[str, dict[str, Any]]:
        """name -> state and address, this node included (full membership comes with heartbeats)."""
        out: dict[str, dict[str, Any]] = {
            self.name: {"state": "alive", "addresses": self._advertised(), "self": True}
        }
        for n, p in self._peers.items():
            state = "left" if p.left else ("alive" if p.current() is not None else "unknown")
            out[n] = {"state": state, "addresses": list(p.addresses), "self": False}
        return out

    def info(self) -> dict[str, Any]:
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
            "peers": {
                n: {
                    "addresses": list(p.addresses),
                    "connections": [
                        {
                            "outgoing": c.outgoing,
                            "local": c.conn.local_address,
                            "remote": c.conn.peer_address,
                            "compress": c.compress,
                            **c.conn.extra_info(),
                        }
                        for c in p.conns
                        if not c.conn.closed
                    ],
                }
                for n, p in self._peers.items()
            },
            "services": sorted(self.router.services),
        }

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

    # ------------------------------------------------------------------ messaging API
    async def send(self, peer: str, channel: str, obj: Any) -> None:
        """Send ``obj`` to ``peer``'s mailbox ``channel``: ordered per peer, back-pressured."""
        if peer == self.name:
            await self.router.mailbox(channel).put((self.name, obj))
            return
        c = await self._conn_to(peer)
        try:
            frames = self.serializer.dumps([SEND, channel, obj], compress=c.compress)
            await c.conn.send(frames)
        except ConnectionClosed as exc:
            raise PeerUnavailable(f"{peer}: connection lost while sending: {exc}") from exc

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
        c = await self._conn_to(peer)
        router = self.router
        rid, fut = router.new_request(peer, c.id)
        try:
            frames = self.serializer.dumps([REQ, rid, service, obj], compress=c.compress)
            await c.conn.send(frames)
        except BaseException as exc:
            router.forget(rid)
            if isinstance(exc, ConnectionClosed):
                raise PeerUnavailable(f"{peer}: connection lost while sending: {exc}") from exc
            raise
        if timeout is None:
            return await fut
        handle = asyncio.get_running_loop().call_later(timeout, _expire, fut, peer, service, timeout)
        try:
            return await fut
        finally:
            handle.cancel()
            router.forget(rid)

    async def connect(self, url: str) -> str:
        """Dial ``url`` and return the peer's node name (also learns its peers)."""
        return (await self._dial(url)).peer

    # ------------------------------------------------------------------ connections
    def _transport(self, url: str) -> Any:
        return self.transports.get(url, self.config.transport.__dict__, self.config.limits)

    async def _conn_to(self, name: str) -> _Conn:
        p = self._peers.get(name)
        if p is not None:
            c = p.current()
            if c is not None:
                return c
        if not self._running or self._closing:
            raise PeerUnavailable(f"{name}: local node is not running")
        if p is None or not p.addresses:
            known = ", ".join(sorted(self._peers)) or "none"
            raise PeerUnavailable(f"unknown peer {name!r} (known peers: {known})")
        if p.left:
            raise PeerUnavailable(f"{name}: peer has left the cluster")
        if p.dialing is not None:
            return await asyncio.shield(p.dialing)
        loop = asyncio.get_running_loop()
        p.dialing = loop.create_future()
        try:
            errors = []
            for url in p.addresses:
                try:
                    c = await self._dial(url, expect=name)
                except (TransportError, HandshakeError, OSError, asyncio.TimeoutError) as exc:
                    errors.append(f"{url}: {exc}")
                    continue
                p.dialing.set_result(c)
                return c
            err = PeerUnavailable(f"{name}: unreachable ({'; '.join(errors)})")
            p.dialing.set_exception(err)
            p.dialing.exception()  # mark retrieved
            raise err
        finally:
            p.dialing = None

    async def _dial(self, url: str, expect: str | None = None) -> _Conn:
        transport = self._transport(url)
        timeout = self.config.transport.connect_timeout
        conn = await transport.connect(url, timeout=timeout)
        try:
            await conn.send([self._hello().encode()])
            frames = await asyncio.wait_for(conn.recv(), self.config.link.handshake_timeout)
            hello = handshake.parse(frames)
            if expect is not None and hello.name != expect:
                raise HandshakeError(f"{url} is node {hello.name!r}, expected {expect!r}")
            if hello.name == self.name:
                raise HandshakeError(f"{url} is this node itself ({self.name!r}); node names must be unique")
        except BaseException as exc:
            await _close_quietly(conn)
            if isinstance(exc, asyncio.TimeoutError):
                raise HandshakeError(f"{url}: no handshake reply within the handshake timeout") from None
            if isinstance(exc, ConnectionClosed):
                cause = exc.__cause__ or exc
                raise HandshakeError(f"{url}: connection closed during handshake ({cause})") from exc
            raise
        return self._register(conn, hello, outgoing=True)

    def _hello(self) -> handshake.Hello:
        peers = {n: p.addresses for n, p in self._peers.items() if p.addresses and not p.left}
        features = {"compression": ["lz4"] if self._compression else []}
        return handshake.Hello(
            handshake.PROTOCOL_VERSION, self.name, self.node_id, self._advertised(), features, peers
        )

    async def _on_accept(self, conn: Connection) -> None:
        try:
            frames = await asyncio.wait_for(conn.recv(), self.config.link.handshake_timeout)
            hello = handshake.parse(frames)
            if hello.name == self.name:
                raise HandshakeError(f"peer uses this node's own name {self.name!r}; names must be unique")
        except (ProtocolError, ConnectionClosed, asyncio.TimeoutError) as exc:
            reason = (
                "no handshake within the handshake timeout" if isinstance(exc, asyncio.TimeoutError) else str(exc)
            )
            self.log.warning("handshake failed; closing connection", peer=conn.peer_address, error=reason)
            if isinstance(exc, ProtocolError) and not conn.closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.send([handshake.reject(reason)]), 1.0)
            await _close_quietly(conn)
            return
        if self._closing:
            await _close_quietly(conn)
            return
        try:
            await conn.send([self._hello().encode()])
        except ConnectionClosed:
            await _close_quietly(conn)
            return
        self._register(conn, hello, outgoing=False)

    def _register(self, conn: Connection, hello: handshake.Hello, outgoing: bool) -> _Conn:
        p = self._peers.get(hello.name)
        if p is None:
            p = self._peers[hello.name] = _Peer(hello.name)
        is_new_peer = not p.conns and (p.node_id != hello.node_id)
        p.node_id = hello.node_id
        p.left = False
        if hello.addresses:
            p.addresses = list(hello.addresses)
        self._next_conn_id += 1
        theirs = hello.features.get("compression", [])
        compress = self._compression and isinstance(theirs, list) and "lz4" in theirs
        c = _Conn(self._next_conn_id, conn, hello.name, outgoing, compress)
        p.conns.append(c)
        self.log.info(
            "peer connected", peer=hello.name, direction="out" if outgoing else "in", remote=conn.peer_address
        )
        self._learn_peers(hello.peers)
        self._spawn(self._read_loop(c), name=f"aionet-read-{hello.name}")
        if is_new_peer:
            self._announce({hello.name: p.addresses}, exclude=hello.name)
        return c

    def _learn_peers(self, table: dict[str, list[str]]) -> None:
        for name, addrs in table.items():
            if name == self.name or not addrs:
                continue
            p = self._peers.get(name)
            if p is None:
                self._peers[name] = _Peer(name, list(addrs))
            elif not p.conns:
                p.addresses = list(addrs)

    def _announce(self, table: dict[str, list[str]], exclude: str) -> None:
        """Tell connected peers about a newly connected one (simple dissemination)."""
        for n, p in self._peers.items():
            if n == exclude:
                continue
            c = p.current()
            if c is None:
                continue
            frames = self.serializer.dumps([PEERS, table])
            self._spawn(_send_quietly(c.conn, frames), name="aionet-announce")

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        t = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    async def _read_loop(self, c: _Conn) -> None:
        conn = c.conn
        loads = self.serializer.loads
        router = self.router
        mailbox = router.mailbox
        peer = c.peer
        why = "connection closed"

        async def reply(env: list[Any]) -> None:
            try:
                frames = self.serializer.dumps(env, compress=c.compress)
            except SerializationError as exc:
                frames = self.serializer.dumps(
                    [ERR, env[1], "aionet.SerializationError", f"cannot serialize the reply: {exc}", ""]
                )
            await conn.send(frames)

        try:
            while True:
                batch = await conn.recv_many()
                for frames in batch:
                    env = loads(frames)
                    if type(env) is not list or not env:
                        raise ProtocolError("envelope is not a non-empty list")
                    kind = env[0]
                    if kind == SEND:
                        mb = mailbox(env[1])
                        item = (peer, env[2])
                        if not mb.put_nowait(item):
                            await mb.put(item)  # full mailbox: stop reading -> back-pressure
                    elif kind == REQ:
                        aw = router.on_request(env, reply)
                        if aw is not None:
                            await aw
                    elif kind == REP or kind == ERR:
                        router.on_reply(env, peer)
                    elif kind == PEERS:
                        self._learn_peers(env[1])
                    elif kind == BYE:
                        p = self._peers.get(peer)
                        if p is not None:
                            p.left = True
                        why = "peer left the cluster"
                        self.log.info("peer left", peer=peer)
                    else:
                        raise ProtocolError(f"unknown envelope kind {kind!r}")
        except ConnectionClosed as exc:
            cause = exc.__cause__
            if isinstance(cause, ProtocolError):
                why = f"protocol error: {cause}"
            elif cause is not None:
                why = f"connection lost: {cause}"
        except (ProtocolError, ValueError, TypeError, IndexError, KeyError) as exc:
            why = f"protocol error: {exc}"
            self.log.warning("bad message from peer; closing connection", peer=peer, error=str(exc))
            conn.abort()
        except asyncio.CancelledError:
            why = "local node is shutting down"
            raise
        finally:
            p = self._peers.get(peer)
            if p is not None and c in p.conns:
                p.conns.remove(c)
            router.fail_conn(c.id, peer, why)
            if not conn.closed:
                await _close_quietly(conn)
            if not self._closing:
                self.log.info("peer connection closed", peer=peer, reason=why)


def _echo(x: Any) -> Any:
    return x


def _expire(fut: asyncio.Future[Any], peer: str, service: str, timeout: float) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError(f"request {service!r} to {peer!r} timed out after {timeout} s"))


async def _close_quietly(conn: Connection) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close(), 2.0)


async def _send_quietly(conn: Connection, frames: list[Any]) -> None:
    with contextlib.suppress(Exception):
        await conn.send(frames)


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> Config:
    """Config from an optional file, with CLI-style overrides ``{"node.name": "a"}``."""
    cfg = Config.from_file(path) if path else Config.from_dict({})
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        section, _, key = dotted.partition(".")
        sec = getattr(cfg, section, None)
        if sec is None or not hasattr(sec, key):
            raise ConfigError(f"unknown setting {dotted}")
        setattr(sec, key, value)
    cfg.validate()
    return cfg
