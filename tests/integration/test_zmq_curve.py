"""CurveZMQ on zmq+tcp://: nodes with `aionet keys` material talk encrypted, strangers stay out.

What is checked: two Nodes exchange send and request/reply over CURVE; a recording TCP relay
between them never sees the payload (and does see it without keys, so the check can fail);
plaintext peers, peers holding another key pair, and peers whose client key is not allowed
cannot get a message in, while the listener keeps serving a legitimate peer; a dial to a
listener with another key fails fast with a typed error; bad key files are ConfigErrors.
"""

from __future__ import annotations

import asyncio
import os
import time
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

import aionet
from aionet import Node
from aionet.config import Config
from aionet.errors import ConfigError, PeerUnavailable, TransportError, TransportUnavailable
from aionet.security.keys import KeygenError, KeySet, curve_keypair, generate
from aionet.transports.base import Connection
from aionet.transports.zmq import PROTOCOL, ZMQTransport

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq was built without CURVE (no libsodium)")

T = 10.0  # bound for any single wait
LISTEN = "zmq+tcp://127.0.0.1:0"


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------
def _keyset(directory: Path) -> KeySet:
    try:
        ks = generate(directory)
    except KeygenError as exc:  # neither `cryptography` nor `openssl` for the TLS half
        pytest.skip(f"aionet keys cannot run here: {exc}")
    assert ks.curve_public is not None and ks.curve_secret is not None
    return ks


def _zmq_opts(ks: KeySet, **extra: Any) -> dict[str, Any]:
    return {"curve_public_key_file": str(ks.curve_public), "curve_secret_key_file": str(ks.curve_secret), **extra}


def _node_config(ks: KeySet | None, **zmq_extra: Any) -> Config:
    """A node config; with keys, exactly the snippet `aionet keys` prints (token included)."""
    if ks is None:
        return Config.from_dict({"transport": {"zmq": dict(zmq_extra)}}, env={})
    data = tomllib.loads(ks.config_snippet())
    data["transport"]["zmq"].update(zmq_extra)
    return Config.from_dict(data, env={})


@pytest.fixture
def cluster(tmp_path: Path) -> KeySet:
    return _keyset(tmp_path / "cluster")


@pytest.fixture
def stranger(tmp_path: Path) -> KeySet:
    return _keyset(tmp_path / "stranger")


class Recorder:
    """A loopback TCP relay that forwards both ways and keeps every byte it forwarded."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.up = bytearray()  # dialer -> listener
        self.down = bytearray()
        self.connected = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.port = 0

    async def __aenter__(self) -> Recorder:
        self._server = await asyncio.start_server(self._on_client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def url(self) -> str:
        return f"zmq+tcp://127.0.0.1:{self.port}"

    async def _on_client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [cw, sw]
        for reader, writer, log in ((cr, sw, self.up), (sr, cw, self.down)):
            task = asyncio.ensure_future(self._pump(reader, writer, log))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self.connected.set()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, log: bytearray) -> None:
        try:
            while data := await reader.read(1 << 16):
                log += data
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


class Server:
    """A bare transport listener whose accepted connections land in a queue."""

    def __init__(self, transport: ZMQTransport) -> None:
        self.transport = transport
        self.accepted: asyncio.Queue[Connection] = asyncio.Queue()
        self.address = ""

    async def _handler(self, conn: Connection) -> None:
        self.accepted.put_nowait(conn)

    async def start(self, url: str = LISTEN) -> str:
        self.address = (await self.transport.listen(url, self._handler)).address
        return self.address

    async def accept(self) -> Connection:
        async with asyncio.timeout(T):
            return await self.accepted.get()


@pytest.fixture
async def transports() -> AsyncIterator[list[ZMQTransport]]:
    made: list[ZMQTransport] = []
    yield made
    async with asyncio.timeout(T):
        for t in made:
            await t.aclose()


async def _roundtrip(client: Connection, server: Connection, tag: bytes) -> None:
    async with asyncio.timeout(T):
        await client.send([tag, b"x" * 100_000])
        got = await server.recv()
        assert bytes(got[0]) == tag and len(got[1]) == 100_000
        await server.send([tag + b"-back"])
        assert await client.recv() == [tag + b"-back"]


# ------------------------------------------------------------------------------------------
# two nodes over CURVE
# ------------------------------------------------------------------------------------------
@pytest.mark.timeout(30)
async def test_two_curve_nodes_send_and_request(cluster: KeySet) -> None:
    a_cfg, b_cfg = _node_config(cluster), _node_config(cluster)
    async with Node(name="a", listen=LISTEN, config=a_cfg) as a, Node(name="b", listen=LISTEN, config=b_cfg) as b:
        await b.connect(a.address)

        @a.service("upper")
        async def upper(s: str) -> str:
            return s.upper()

        await b.send("a", "chan", {"n": 1, "blob": b"\x00" * 50_000})
        async with asyncio.timeout(T):
            got = await a.recv("chan")
        assert got == {"n": 1, "blob": b"\x00" * 50_000}
        assert await b.request("a", "upper", "curve", timeout=T) == "CURVE"
        assert await a.request("b", "aionet.echo", [1, 2, 3], timeout=T) == [1, 2, 3]
        # the snippet's options really reached the transport: the connections say CURVE
        for node, peer in ((a, "b"), (b, "a")):
            conns = node.stats().peers[peer].connections
            assert conns and all(c.extra["curve"] is True for c in conns), conns


@pytest.mark.timeout(40)
@pytest.mark.parametrize("curve", [True, False], ids=["curve", "plaintext"])
async def test_payload_is_not_visible_on_the_wire(cluster: KeySet, curve: bool) -> None:
    """A relay records every byte between two nodes. With keys the canary never appears;
    without keys it does (so this test would notice if encryption silently went away)."""
    canary = f"aionet-canary-{os.urandom(6).hex()}"
    reply_canary = f"aionet-reply-{os.urandom(6).hex()}"
    cfg = (lambda: _node_config(cluster)) if curve else (lambda: _node_config(None))
    async with Node(name="a", listen=LISTEN, config=cfg()) as a:

        @a.service("answer")
        async def answer(s: str) -> str:
            return reply_canary if s == canary else "?"

        port = int(a.address.rsplit(":", 1)[1])
        async with Recorder(port) as relay:
            # b has no listener, so every byte between the two goes through the relay
            async with Node(name="b", listen=[], join=[relay.url], config=cfg()) as b:
                await b.send("a", "chan", canary)
                async with asyncio.timeout(T):
                    assert await a.recv("chan") == canary
                assert await b.request("a", "answer", canary, timeout=T) == reply_canary
                assert await a.request("b", "aionet.echo", canary, timeout=T) == canary
            wire = bytes(relay.up) + bytes(relay.down)
    assert relay.connected.is_set() and len(relay.up) > 100 and len(relay.down) > 100
    if curve:
        assert canary.encode() not in wire and reply_canary.encode() not in wire
        assert b"aionet-" not in wire  # no other aionet plaintext either (names of services, ...)
    else:
        assert canary.encode() in bytes(relay.up) and reply_canary.encode() in bytes(relay.down)


# ------------------------------------------------------------------------------------------
# strangers cannot get in; the listener keeps serving its peers
# ------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
async def test_plaintext_and_foreign_nodes_are_refused(cluster: KeySet, stranger: KeySet) -> None:
    connect_timeout = 3.0
    a_cfg, b_cfg = _node_config(cluster), _node_config(cluster)
    async with Node(name="a", listen=LISTEN, config=a_cfg) as a, Node(name="b", listen=LISTEN, config=b_cfg) as b:
        await b.connect(a.address)
        got: list[Any] = []

        @a.service("store")
        async def store(x: Any) -> str:
            got.append(x)
            return "stored"

        # Every intruder holds the cluster token, so only CurveZMQ stands in its way.
        intruders = {
            # no keys at all
            "plain": _node_config(None),
            # its own pair: expects another server key and presents a key a does not allow
            "foreign": _node_config(stranger),
            # knows the cluster's public key (so the server proves itself) but not its secret
            "knows-server-key": _node_config(stranger, curve_server_key_file=str(cluster.curve_public)),
        }
        for name, cfg in intruders.items():
            cfg.security.token_file = str(cluster.token_file)
            cfg.transport.connect_timeout = connect_timeout
            cfg.node.listen = []
            cfg.node.join_timeout = 0  # the joiner below: a refusal over zmq looks like "no answer yet"
            async with Node(name=f"intruder-{name}", config=cfg) as x:
                t0 = time.monotonic()
                with pytest.raises(TransportError) as info:
                    await x.connect(a.address)
                assert time.monotonic() - t0 < connect_timeout, f"{name}: the dial did not fail fast"
                if name == "knows-server-key":
                    assert "refused this node's CurveZMQ key" in str(info.value)
                with pytest.raises(aionet.AionetError):
                    await x.request("a", "store", f"from {name}", timeout=2)
            # a joining intruder cannot start at all: its only seed refuses it
            cfg2 = intruders[name]
            with pytest.raises(PeerUnavailable, match="could not reach any seed"):
                async with Node(name=f"joiner-{name}", join=[a.address], config=cfg2):
                    pass
            # the legitimate peer is still served, over its existing link
            assert await b.request("a", "store", f"b after {name}", timeout=T) == "stored"
        assert got == [f"b after {n}" for n in intruders]
        assert not any(m.startswith(("intruder", "joiner")) for m in a.members())
        # and a new legitimate connection is still accepted
        async with Node(name="c", listen=[], join=[a.address], config=_node_config(cluster)) as c:
            assert await c.request("a", "store", "c", timeout=T) == "stored"


@pytest.mark.timeout(30)
async def test_transport_refuses_plaintext_and_unknown_keys(
    cluster: KeySet, stranger: KeySet, transports: list[ZMQTransport]
) -> None:
    """Below the Node (no token handshake to hide behind): nothing but allowed keys reaches
    the listener's connection handler."""
    srv_t = ZMQTransport(_zmq_opts(cluster))
    good_t = ZMQTransport(_zmq_opts(cluster))
    transports += [srv_t, good_t]
    srv = Server(srv_t)
    address = await srv.start()
    good = await good_t.connect(address, timeout=T)
    good_in = await srv.accept()

    # a raw plaintext zmq peer speaking aionet's own hello, then data
    ctx = zmq.asyncio.Context()
    try:
        raw = ctx.socket(zmq.DEALER)
        raw.linger = 0
        raw.connect(address.split("+", 1)[1])
        await raw.send_multipart([b"", b"H", PROTOCOL])
        await raw.send_multipart([b"smuggled"])
        # it never gets a welcome (the ZMTP handshake fails before any aionet message)
        assert await raw.poll(500, zmq.POLLIN) == 0
    finally:
        ctx.destroy(linger=0)

    for opts in (
        {},  # plaintext
        _zmq_opts(stranger),  # another pair
        _zmq_opts(stranger, curve_server_key_file=str(cluster.curve_public)),  # client key not allowed
    ):
        t = ZMQTransport({**opts, "connect_timeout": 3.0})
        transports.append(t)
        with pytest.raises(TransportError):
            await t.connect(address)
    assert srv.accepted.empty(), "a peer without an allowed key reached the connection handler"
    assert srv_t._zap is not None and srv_t._zap.rejected == 1 and srv_t._zap.accepted >= 1
    await _roundtrip(good, good_in, b"still-served")
    # new legitimate connections too
    again = await good_t.connect(address, timeout=T)
    await _roundtrip(again, await srv.accept(), b"new")


@pytest.mark.timeout(30)
async def test_dial_with_wrong_server_key_fails_fast(
    cluster: KeySet, stranger: KeySet, transports: list[ZMQTransport]
) -> None:
    connect_timeout = 2.0
    srv = Server(ZMQTransport(_zmq_opts(cluster)))
    transports.append(srv.transport)
    address = await srv.start()
    wrong = ZMQTransport(
        _zmq_opts(cluster, curve_server_key_file=str(stranger.curve_public), connect_timeout=connect_timeout)
    )
    transports.append(wrong)
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="curve_server_key_file"):
        await wrong.connect(address)
    assert time.monotonic() - t0 < connect_timeout

    # a "server" that accepts TCP and never speaks: the dial ends at connect_timeout, typed
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    try:
        port = silent.sockets[0].getsockname()[1]
        client = ZMQTransport(_zmq_opts(cluster, connect_timeout=1.0))
        transports.append(client)
        t0 = time.monotonic()
        with pytest.raises(TransportError):
            await client.connect(f"zmq+tcp://127.0.0.1:{port}")
        assert time.monotonic() - t0 < 1.0 + 1.0
    finally:
        silent.close()


@pytest.mark.timeout(30)
async def test_allowed_clients_lists_per_node_keys(
    tmp_path: Path, cluster: KeySet, stranger: KeySet, transports: list[ZMQTransport]
) -> None:
    """A dial-only node with its own pair gets in once its public key is allowed, from a
    directory of `*.public` files or of zmq certificate files (zmq.auth format)."""
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "stranger.public").write_bytes(Path(str(stranger.curve_public)).read_bytes())
    zmq_certs = tmp_path / "zmq-certs"
    zmq_certs.mkdir()
    import zmq.auth

    pub_file, sec_file = zmq.auth.create_certificates(str(zmq_certs), "client")
    server_pub = str(cluster.curve_public)
    srv = Server(ZMQTransport(_zmq_opts(cluster, curve_allowed_clients=[str(allowed), str(zmq_certs)])))
    transports.append(srv.transport)
    address = await srv.start()
    clients = [
        ZMQTransport(_zmq_opts(stranger, curve_server_key_file=server_pub)),
        ZMQTransport(
            {"curve_public_key_file": pub_file, "curve_secret_key_file": sec_file, "curve_server_key_file": server_pub}
        ),
    ]
    transports += clients
    for i, t in enumerate(clients):
        conn = await t.connect(address, timeout=T)
        await _roundtrip(conn, await srv.accept(), b"c%d" % i)
    # the cluster key itself is not implied once an explicit list is given
    outsider = ZMQTransport({**_zmq_opts(cluster), "connect_timeout": 3.0})
    transports.append(outsider)
    with pytest.raises(TransportError, match="refused this node's CurveZMQ key"):
        await outsider.connect(address)


@pytest.mark.timeout(30)
async def test_curve_over_ipc(tmp_path: Path, cluster: KeySet, transports: list[ZMQTransport]) -> None:
    """zmq+ipc:// of a transport with keys is CURVE too (documented), so plaintext is refused."""
    srv = Server(ZMQTransport(_zmq_opts(cluster)))
    client = ZMQTransport(_zmq_opts(cluster))
    plain = ZMQTransport({"connect_timeout": 3.0})
    transports += [srv.transport, client, plain]
    address = await srv.start(f"zmq+ipc://{tmp_path}/curve.sock")
    conn = await client.connect(address, timeout=T)
    await _roundtrip(conn, await srv.accept(), b"ipc")
    with pytest.raises(TransportError):
        await plain.connect(address)


# ------------------------------------------------------------------------------------------
# configuration errors
# ------------------------------------------------------------------------------------------
def _bad_files(tmp_path: Path, ks: KeySet) -> dict[str, tuple[dict[str, Any], str]]:
    """case -> (zmq options, text the ConfigError must contain)."""
    pub, sec = str(ks.curve_public), str(ks.curve_secret)
    tmp_path.mkdir()
    garbage = tmp_path / "garbage.public"
    garbage.write_text("this is not a key\n")
    short = tmp_path / "short.public"
    short.write_text("abc\n")
    binary = tmp_path / "binary.public"
    binary.write_bytes(os.urandom(32))
    two = tmp_path / "two.public"
    two.write_bytes(Path(pub).read_bytes() * 2)
    other = curve_keypair()
    assert other is not None
    other_pub = tmp_path / "other.public"
    other_pub.write_bytes(other[0] + b"\n")
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    missing = str(tmp_path / "nope.public")
    return {
        "missing public": ({"curve_public_key_file": missing, "curve_secret_key_file": sec}, missing),
        "missing secret": ({"curve_public_key_file": pub, "curve_secret_key_file": missing}, missing),
        "directory as key": ({"curve_public_key_file": str(tmp_path), "curve_secret_key_file": sec}, str(tmp_path)),
        "garbage": ({"curve_public_key_file": str(garbage), "curve_secret_key_file": sec}, str(garbage)),
        "short": ({"curve_public_key_file": str(short), "curve_secret_key_file": sec}, str(short)),
        "binary": ({"curve_public_key_file": str(binary), "curve_secret_key_file": sec}, str(binary)),
        "two keys": ({"curve_public_key_file": str(two), "curve_secret_key_file": sec}, str(two)),
        "pair mismatch": ({"curve_public_key_file": str(other_pub), "curve_secret_key_file": sec}, str(other_pub)),
        "only public": ({"curve_public_key_file": pub}, "curve_secret_key_file"),
        "only server key": ({"curve_server_key_file": pub}, "curve_public_key_file"),
        "bad server key": (
            {"curve_public_key_file": pub, "curve_secret_key_file": sec, "curve_server_key_file": str(garbage)},
            str(garbage),
        ),
        "bad allowed file": (
            {"curve_public_key_file": pub, "curve_secret_key_file": sec, "curve_allowed_clients": str(binary)},
            str(binary),
        ),
        "empty allowed dir": (
            {"curve_public_key_file": pub, "curve_secret_key_file": sec, "curve_allowed_clients": str(empty_dir)},
            str(empty_dir),
        ),
        "allowed not a path": (
            {"curve_public_key_file": pub, "curve_secret_key_file": sec, "curve_allowed_clients": 7},
            "curve_allowed_clients",
        ),
        "typo": ({"curve_public_keyfile": pub}, "curve_public_keyfile"),
    }


@pytest.mark.timeout(30)
def test_bad_key_files_are_config_errors(tmp_path: Path, cluster: KeySet) -> None:
    for case, (opts, needle) in _bad_files(tmp_path / "bad", cluster).items():
        with pytest.raises(ConfigError) as info:
            ZMQTransport(opts)
        assert needle in str(info.value), f"{case}: {info.value}"


@pytest.mark.timeout(30)
async def test_node_with_bad_key_file_refuses_to_start(tmp_path: Path, cluster: KeySet) -> None:
    missing = str(tmp_path / "gone.secret")
    cfg = _node_config(cluster, curve_secret_key_file=missing)
    with pytest.raises(ConfigError, match="gone.secret"):
        async with Node(name="a", listen=LISTEN, config=cfg):
            pass


@pytest.mark.timeout(30)
def test_libzmq_without_curve_is_transport_unavailable(cluster: KeySet, monkeypatch: pytest.MonkeyPatch) -> None:
    real_has = zmq.has
    monkeypatch.setattr(zmq, "has", lambda feature: False if feature == "curve" else real_has(feature))
    with pytest.raises(TransportUnavailable, match="CURVE"):
        ZMQTransport(_zmq_opts(cluster))
    ZMQTransport({})  # without keys nothing needs CURVE


# ------------------------------------------------------------------------------------------
# aionet keys
# ------------------------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_keys_snippet_configures_curve(cluster: KeySet) -> None:
    snippet = cluster.config_snippet()
    assert "uncomment" not in snippet
    zmq_opts = tomllib.loads(snippet)["transport"]["zmq"]
    assert zmq_opts == _zmq_opts(cluster)
    assert ZMQTransport(zmq_opts).curve
