"""tls:// transport: TLS 1.3, certificates from config, mutual TLS with a CA; ``aionet keys``."""

import asyncio
import os
import socket
import ssl
import stat
import tomllib

import numpy as np
import pytest
from click.testing import CliRunner

from aionet import Node, PeerUnavailable, TransportUnavailable
from aionet.cli import main as cli
from aionet.config import Config
from aionet.errors import ConfigError, ConnectionClosed, TransportError
from aionet.security import load_token
from aionet.security.keys import KeygenError, generate, tls_backend
from aionet.transports.registry import TransportRegistry
from aionet.transports.tls import TLSTransport

pytestmark = pytest.mark.skipif(tls_backend() == "none", reason="neither cryptography nor openssl available")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def other_keys(tmp_path_factory):
    """A second, unrelated CA and node certificate."""
    return generate(tmp_path_factory.mktemp("other"))


def _cfg(keys, *, ca=True, token=True, **extra):
    sec = {"tls_cert": str(keys.node_cert), "tls_key": str(keys.node_key)}
    if ca:
        sec["tls_ca"] = str(keys.ca_cert)
    if token:
        sec["token_file"] = str(keys.token_file)
    return Config.from_dict({"security": sec, **extra}, env={})


TLS = "tls://127.0.0.1:0"


async def test_nodes_talk_over_mutual_tls(keys):
    async with (
        Node(name="a", listen=TLS, config=_cfg(keys)) as a,
        Node(name="b", listen=TLS, join=[a.address], config=_cfg(keys)) as b,
    ):
        assert a.address.startswith("tls://127.0.0.1:")
        assert await b.request("a", "aionet.echo", {"x": 1}, timeout=5) == {"x": 1}
        arr = np.random.default_rng(1).integers(0, 255, size=8 << 20, dtype=np.uint8)
        await b.send("a", "big", arr)
        got = await a.recv("big", timeout=10)
        assert np.array_equal(got, arr)
        conns = a.info()["peers"]["b"]["connections"]
        assert conns and conns[0]["extra"]["tls_version"] == "TLSv1.3"
        assert conns[0]["remote"].startswith("tls://")
        assert conns[0]["extra"]["tls_peer_subject"] == "aionet node"


async def test_without_ca_is_encrypted_but_unverified(keys):
    async with (
        Node(name="a", listen=TLS, config=_cfg(keys, ca=False, token=False)) as a,
        Node(name="b", listen=TLS, join=[a.address], config=_cfg(keys, ca=False, token=False)) as b,
    ):
        assert await b.request("a", "aionet.echo", 5, timeout=5) == 5
        conns = b.info()["peers"]["a"]["connections"]
        assert conns[0]["extra"]["tls_version"] == "TLSv1.3"
        assert "tls_peer_subject" not in conns[0]["extra"]  # nothing verified, nothing reported


async def test_no_certificate_is_a_clear_error():
    node = Node(name="a", listen=TLS, config=Config.from_dict({}, env={}))
    with pytest.raises(TransportUnavailable, match=r"security\.tls_cert.*aionet keys"):
        await node.start()
    await node.stop()


def test_check_available_and_options(keys):
    TLSTransport.check_available()  # this Python has TLS 1.3
    with pytest.raises(TransportUnavailable, match="no cert and no key"):
        TLSTransport.check_available({})
    with pytest.raises(TransportUnavailable, match="no cert and no key"):
        TransportRegistry(use_entry_points=False).get(TLS, {"tls": {}})
    with pytest.raises(ConfigError, match="unknown transport.tls option.*bogus"):
        TLSTransport({"cert": str(keys.node_cert), "key": str(keys.node_key), "bogus": 1})
    with pytest.raises(TransportUnavailable, match="not found"):
        TLSTransport({"cert": "/nonexistent.pem", "key": str(keys.node_key)})
    with pytest.raises(TransportUnavailable, match="cannot load certificate"):
        TLSTransport({"cert": str(keys.ca_cert), "key": str(keys.node_key)})  # key does not match
    with pytest.raises(ConfigError, match="check_hostname needs a CA"):
        TLSTransport({"cert": str(keys.node_cert), "key": str(keys.node_key), "check_hostname": True})
    t = TLSTransport({"cert": str(keys.node_cert), "key": str(keys.node_key), "nodelay": False})
    assert t._opts["nodelay"] is False  # tcp options pass through


async def test_transport_level_roundtrip_and_hostname_check(keys):
    opts = {"cert": str(keys.node_cert), "key": str(keys.node_key), "ca": str(keys.ca_cert)}
    server_t = TLSTransport(opts)
    got: asyncio.Queue = asyncio.Queue()

    async def handler(conn):
        while True:
            try:
                msg = await conn.recv()
            except ConnectionClosed:
                return
            await conn.send(msg)
            await got.put(msg)

    lst = await server_t.listen(TLS, handler)
    port = lst.address.rsplit(":", 1)[1]
    try:
        for host, check in (("127.0.0.1", False), ("localhost", True)):
            client_t = TLSTransport({**opts, "check_hostname": check})
            conn = await client_t.connect(f"tls://{host}:{port}", timeout=5)
            assert conn.local_address.startswith("tls://")
            assert conn.peer_address.startswith("tls://") and conn.peer_address.endswith(f":{port}")
            await conn.send([b"hdr", bytearray(300_000)])
            echoed = await asyncio.wait_for(conn.recv(), 5)
            assert [bytes(f) for f in echoed] == [b"hdr", bytes(300_000)]
            await conn.close()
        await asyncio.wait_for(got.get(), 5)
    finally:
        await lst.close()


async def test_client_with_foreign_ca_certificate_is_rejected(keys, other_keys):
    async with Node(name="a", listen=TLS, config=_cfg(keys)) as a:
        # b presents a certificate from another CA (and distrusts a's): mutual TLS fails
        b = Node(name="b", listen=TLS, join=[a.address], config=_cfg(other_keys, token=False))
        with pytest.raises(PeerUnavailable, match="certificate|ssl|SSL|closed"):
            await b.start()
        await b.stop()
        # b trusts a's CA but has a foreign client certificate: a rejects it
        cfg = Config.from_dict(
            {
                "security": {
                    "tls_cert": str(other_keys.node_cert),
                    "tls_key": str(other_keys.node_key),
                    "tls_ca": str(keys.ca_cert),
                    "token_file": str(keys.token_file),
                }
            },
            env={},
        )
        c = Node(name="c", listen=TLS, join=[a.address], config=cfg)
        with pytest.raises(PeerUnavailable):
            await c.start()
        await c.stop()
        # a still serves legitimate peers
        async with Node(name="d", listen=TLS, join=[a.address], config=_cfg(keys)) as d:
            assert await d.request("a", "aionet.echo", "ok", timeout=5) == "ok"


async def test_plaintext_and_garbage_clients_do_not_hurt_the_listener(keys):
    async with Node(name="a", listen=TLS, config=_cfg(keys)) as a:
        host, port = a.address.removeprefix("tls://").rsplit(":", 1)

        def plaintext():
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(b"AN\x01\x00" + os.urandom(200))
                try:
                    return s.recv(100)
                except (ConnectionResetError, TimeoutError):
                    return b""

        await asyncio.to_thread(plaintext)
        plain = Node(name="p", join=[f"tcp://{host}:{port}"], config=Config.from_dict({}, env={}))
        with pytest.raises(PeerUnavailable):
            await plain.start()
        await plain.stop()
        async with Node(name="b", listen=TLS, join=[a.address], config=_cfg(keys)) as b:
            assert await b.request("a", "aionet.echo", 1, timeout=5) == 1


async def test_tls12_only_client_is_refused(keys):
    async with Node(name="a", listen=TLS, config=_cfg(keys, ca=False)) as a:
        host, port = a.address.removeprefix("tls://").rsplit(":", 1)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await asyncio.wait_for(asyncio.open_connection(host, int(port), ssl=ctx), 5)


async def test_connect_failure_is_a_transport_error(keys):
    t = TLSTransport({"cert": str(keys.node_cert), "key": str(keys.node_key)})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TransportError):
        await t.connect(f"tls://127.0.0.1:{port}", timeout=2)


# ---------------------------------------------------------------- aionet keys
@pytest.mark.parametrize("backend", ["cryptography", "openssl"])
def test_keys_command_writes_usable_material(tmp_path, backend):
    if backend == "cryptography":
        pytest.importorskip("cryptography")
    elif tls_backend() == "none" or not __import__("shutil").which("openssl"):
        pytest.skip("no openssl command")
    d = tmp_path / "k"
    res = CliRunner().invoke(
        cli, ["keys", str(d), "--host", "node-x.example", "--host", "10.1.2.3", "--backend", backend]
    )
    assert res.exit_code == 0, res.output
    for name, secret in [
        ("token", True),
        ("ca.pem", False),
        ("ca.key", True),
        ("node.pem", False),
        ("node.key", True),
        ("curve.public", False),
        ("curve.secret", True),
    ]:
        mode = stat.S_IMODE((d / name).stat().st_mode)
        assert mode == (0o600 if secret else 0o644), (name, oct(mode))
    assert len((d / "token").read_bytes().strip()) >= 32
    assert len((d / "curve.public").read_bytes().strip()) == 40  # Z85 of 32 bytes
    # the printed snippet is valid config that points at the files
    snippet = "\n".join(line for line in res.output.splitlines() if not line.startswith("#"))
    cfg = Config.from_dict(tomllib.loads(snippet), env={})
    assert cfg.security.tls_ca == str(d / "ca.pem")
    assert load_token(cfg.security) == (d / "token").read_bytes().strip()
    # the certificate verifies against the CA, for both roles and the requested names
    ctx = ssl.create_default_context(cafile=str(d / "ca.pem"))
    ctx.load_cert_chain(str(d / "node.pem"), str(d / "node.key"))
    der = ssl._ssl._test_decode_cert(str(d / "node.pem"))  # type: ignore[attr-defined]
    sans = {v for _k, v in der["subjectAltName"]}
    assert {"localhost", "127.0.0.1", "node-x.example", "10.1.2.3"} <= sans
    # refuses to overwrite, unless --force
    again = CliRunner().invoke(cli, ["keys", str(d)])
    assert again.exit_code != 0 and "--force" in again.output
    assert CliRunner().invoke(cli, ["keys", str(d), "--force"]).exit_code == 0


async def test_generated_keys_run_a_cluster(tmp_path):
    ks = generate(tmp_path)
    text = "\n".join(line for line in ks.config_snippet().splitlines() if not line.startswith("#"))
    text = text.replace("tls://0.0.0.0:7700", TLS)
    cfg_a = Config.from_dict(tomllib.loads(text), env={})
    cfg_b = Config.from_dict(tomllib.loads(text), env={})
    async with Node(name="a", config=cfg_a) as a, Node(name="b", join=[a.address], config=cfg_b) as b:
        assert await b.request("a", "aionet.echo", "hi", timeout=5) == "hi"


def test_keygen_errors(tmp_path):
    with pytest.raises(KeygenError, match="days"):
        generate(tmp_path, days=0)
    with pytest.raises(KeygenError, match="backend"):
        generate(tmp_path, backend="nope")


@pytest.mark.timeout(20)
async def test_silent_tls_client_is_dropped_after_the_handshake_timeout(keys):
    """A socket that never starts its TLS handshake is closed after link.handshake_timeout,
    not asyncio's 60 s default, and the node keeps serving."""
    cfg = _cfg(keys, link={"handshake_timeout": 0.5})
    async with Node(name="a", listen=TLS, config=cfg) as a:
        host, port = a.address.removeprefix("tls://").rsplit(":", 1)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        reader, writer = await asyncio.open_connection(host, int(port))  # plain TCP, no ClientHello
        try:
            assert await asyncio.wait_for(reader.read(100), 10) == b""  # closed by the server
        except ConnectionResetError:
            pass
        finally:
            writer.close()
        assert loop.time() - t0 < 5
        async with Node(name="b", listen=TLS, join=[a.address], config=_cfg(keys)) as b:
            assert await b.request("a", "aionet.echo", 1, timeout=5) == 1


@pytest.mark.timeout(20)
async def test_tls_dial_to_a_silent_server_fails_within_the_handshake_timeout(keys):
    """A server that accepts TCP but never answers the ClientHello fails the dial in time."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    t = TLSTransport({"cert": str(keys.node_cert), "key": str(keys.node_key), "handshake_timeout": 0.5})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        with pytest.raises((TransportError, TimeoutError)):
            await t.connect(f"tls://127.0.0.1:{port}", timeout=None)
        assert loop.time() - t0 < 5
    finally:
        server.close()
        await t.aclose()


def test_handshake_timeout_option_is_checked(keys):
    base = {"cert": str(keys.node_cert), "key": str(keys.node_key)}
    for bad in (0, -1, "soon"):
        with pytest.raises(ConfigError, match="handshake_timeout"):
            TLSTransport({**base, "handshake_timeout": bad})
