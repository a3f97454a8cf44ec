"""Accepting connections under attack (issue 11): handshake slots that a flood cannot hold,
a peer table that strangers cannot grow, a HELLO that discloses nothing, and the small
rough edges of accepting (port checks, tls:// dialed at a tcp:// node, aionet.info devices)."""

from __future__ import annotations

import asyncio
import socket
import uuid

import msgpack
import pytest
from structlog.testing import capture_logs

from aionet import Node, PeerUnavailable
from aionet.codecs import handshake
from aionet.config import Config
from aionet.errors import ConnectionClosed, HandshakeError
from aionet.security.keys import generate, tls_backend
from tests.conftest import wait_for

TOKEN = "right-token"


def _cfg(token: str | None = TOKEN, **sections) -> Config:
    data = dict(sections)
    if token:
        data["security"] = {**data.get("security", {}), "token": token}
    return Config.from_dict(data, env={})


def _hostport(url: str) -> tuple[str, int]:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


class _Sock(socket.socket):
    received = b""  # what the node sent (read by _closed_by_server)


def _silent(url: str, source: str = "127.0.0.1") -> _Sock:
    """A client socket that connects and never says anything (non-blocking connect)."""
    s = _Sock(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.bind((source, 0))
    s.connect_ex(_hostport(url))
    return s


def _closed_by_server(s: _Sock) -> bool:
    """Read what the node sent (into ``s.received``); True once it closed the connection."""
    while True:
        try:
            data = s.recv(65536)
        except BlockingIOError:
            return False
        except OSError:
            return True  # reset
        if not data:
            return True
        s.received += data


async def _raw_hello(node: Node, name: str, token: str | None) -> tuple[object, handshake.Hello, list, bytes, bytes]:
    """Dial ``node`` by hand and send a HELLO; returns (conn, reply, raw reply fields, our nonce, mac_d)."""
    conn = await node.transports.get(node.address).connect(node.address, timeout=5)
    nonce = handshake.new_nonce()
    await conn.send([handshake.Hello(handshake.PROTOCOL_VERSION, name, uuid.uuid4().hex, [], {}, {}, nonce).encode()])
    frames = await asyncio.wait_for(conn.recv(), 5)
    raw = msgpack.unpackb(frames[0])
    reply = handshake.parse(frames)
    key = token.encode() if token else None
    mac_d = handshake.mac(key, b"D", reply.nonce, nonce, name, reply.name)
    return conn, reply, raw, nonce, mac_d


# ---------------------------------------------------------------- 7: handshake slots


async def test_silent_flood_does_not_lock_out_legitimate_peers():
    """Hundreds of silent sockets (all from 127.0.0.1, like the peers) used to hold every
    handshake slot, so no node could join while the flood lasted. Now the oldest pending
    handshakes are shed: the flood only ever holds one host's share, and a real handshake
    (a round trip or two) completes while the flood keeps coming."""
    socks: list[socket.socket] = []
    async with Node(name="a", listen="tcp://127.0.0.1:0", config=_cfg()) as a:
        per_host = a.config.link.max_handshakes_per_host
        for _ in range(300):
            socks.append(_silent(a.address))
        await wait_for(lambda: sum(map(_closed_by_server, socks)) >= 300 - per_host, 20)
        assert len(a._connector.handshaking) <= per_host

        stop = asyncio.Event()

        async def keep_flooding() -> None:
            while not stop.is_set():
                socks.extend(_silent(a.address) for _ in range(5))
                await asyncio.sleep(0.02)  # the scenario: a steady flood, 250 silent dials a second

        flood = asyncio.ensure_future(keep_flooding())
        try:
            for i in range(3):
                async with Node(name=f"legit-{i}", listen="tcp://127.0.0.1:0", join=[a.address], config=_cfg()) as b:
                    assert await b.request("a", "aionet.echo", i, timeout=5) == i
            assert len(a._connector.handshaking) <= per_host
        finally:
            stop.set()
            await flood
            for s in socks:
                s.close()


@pytest.mark.skipif(tls_backend() == "none", reason="neither cryptography nor openssl available")
async def test_tls_peers_join_while_silent_tls_clients_hold_slots(tmp_path):
    """The same over tls://: clients that finish the TLS handshake and then stay silent."""
    import ssl

    keys = generate(tmp_path)
    sec = {"tls_cert": str(keys.node_cert), "tls_key": str(keys.node_key), "token": TOKEN}
    cfg = lambda: Config.from_dict({"security": sec, "link": {"max_handshakes_per_host": 4}}, env={})  # noqa: E731
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    writers = []
    async with Node(name="a", listen="tls://127.0.0.1:0", config=cfg()) as a:
        host, port = _hostport(a.address)
        for _ in range(12):
            _r, w = await asyncio.open_connection(host, port, ssl=ctx)
            writers.append(w)
        await wait_for(lambda: len(a._connector.handshaking) == 4, 10)
        try:
            async with Node(name="b", listen="tls://127.0.0.1:0", join=[a.address], config=cfg()) as b:
                assert await b.request("a", "aionet.echo", "tls", timeout=5) == "tls"
        finally:
            for w in writers:
                w.transport.abort()


async def test_slots_are_bounded_per_host_and_in_total_shedding_the_oldest():
    """Distinct source addresses (127.0.0.2 ...): one host keeps at most its share, the
    total is bounded, and it is always the oldest pending handshake that goes."""
    cfg = _cfg(link={"max_handshakes": 5, "max_handshakes_per_host": 2, "handshake_timeout": 30})
    async with Node(name="a", listen="tcp://127.0.0.1:0", config=cfg) as a:
        first = [_silent(a.address, "127.0.0.2") for _ in range(4)]
        await wait_for(lambda: _closed_by_server(first[0]) and _closed_by_server(first[1]), 10)
        await wait_for(lambda: len(a._connector.handshaking) == 2, 10)
        assert not any(map(_closed_by_server, first[2:]))  # the two newest of that host remain
        assert b"busy" in first[0].received  # a shed dialer is told to try again (a REJECT)
        others = []
        for i in range(3, 7):  # four more hosts, two sockets each: 10 > the total of 5
            for _ in range(2):
                others.append(_silent(a.address, f"127.0.0.{i}"))
        await wait_for(lambda: sum(map(_closed_by_server, others)) == 3, 10)
        await wait_for(lambda: len(a._connector.handshaking) == 5, 10)
        # the oldest went first: both remaining sockets of 127.0.0.2, then the oldest of .3
        assert all(map(_closed_by_server, first))
        assert _closed_by_server(others[0]) and not any(map(_closed_by_server, others[3:]))
        hosts = sorted(p.host for p in a._connector.handshaking.values())
        assert hosts == ["127.0.0.4", "127.0.0.5", "127.0.0.5", "127.0.0.6", "127.0.0.6"]
        # and a real peer still gets in
        async with Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address], config=_cfg()) as b:
            assert await b.request("a", "aionet.echo", 1, timeout=5) == 1
        for s in first + others:
            s.close()


async def test_handshake_timeout_still_drops_a_silent_client():
    async with Node(name="a", listen="tcp://127.0.0.1:0", config=_cfg(link={"handshake_timeout": 0.3})) as a:
        s = _silent(a.address)
        await wait_for(lambda: _closed_by_server(s), 5)
        await wait_for(lambda: not a._connector.handshaking, 5)  # forgotten just after the close
        s.close()


# ---------------------------------------------------------------- 9: the peer table


async def test_unproven_dialers_leave_no_peer_state():
    """1,000 dialers with a wrong token or that never finish: the acceptor keeps nothing
    (it used to create a peer entry from the HELLO's name before checking the token)."""
    async with Node(name="a", listen="tcp://127.0.0.1:0", config=_cfg()) as a:

        async def wrong_token(i: int) -> None:
            conn, _reply, _raw, _nonce, mac_d = await _raw_hello(a, f"wrong-{i}", "not-the-token")
            await conn.send([handshake.Confirm(mac_d).encode()])
            with pytest.raises(HandshakeError, match="rejected"):
                handshake.parse_state(await asyncio.wait_for(conn.recv(), 5), handshake.WELCOME)
            await conn.close()

        async def never_confirms(i: int) -> None:
            conn, *_ = await _raw_hello(a, f"silent-{i}", None)
            await conn.close()

        for start in range(0, 1000, 10):
            await asyncio.gather(*((wrong_token if i % 2 else never_confirms)(i) for i in range(start, start + 10)))
        assert a._peers == {}
        assert a.peers() == {}
        await wait_for(lambda: not a._connector.handshaking, 5)


async def test_departed_clients_are_pruned():
    """Short-lived clients (what `aionet status` / `aionet info` do: connect, query, say
    bye) used to stay in the peer table forever; so did clients that vanished without a bye."""
    server_cfg = _cfg(token=None, link={"give_up_after": 0.5})
    async with Node(name="a", listen="tcp://127.0.0.1:0", config=server_cfg) as a:
        most = 0
        for start in range(0, 200, 10):

            async def client(i: int) -> None:
                async with Node(name=f"status-{i}", listen=[], config=_cfg(token=None)) as c:
                    peer = await c.connect(a.address)
                    assert (await c.request(peer, "aionet.info", timeout=5))["name"] == "a"

            await asyncio.gather(*(client(i) for i in range(start, start + 10)))
            most = max(most, len(a._peers))
        await wait_for(lambda: a._peers == {}, 10)
        assert most < 200  # pruned along the way, not only at the end

        # a client that completes the handshake, then vanishes without a bye: dead after
        # link.give_up_after, then forgotten (it is not a cluster member)
        conn, _reply, _raw, _nonce, mac_d = await _raw_hello(a, "vanishing", None)
        await conn.send([handshake.Confirm(mac_d).encode()])
        handshake.parse_state(await asyncio.wait_for(conn.recv(), 5), handshake.WELCOME)
        await conn.send([handshake.State(handshake.RESUME).encode()])
        await wait_for(lambda: a.peers().get("vanishing", {}).get("connected"), 5)
        conn.abort()
        await wait_for(lambda: "vanishing" not in a._peers, 10)


async def test_members_that_leave_are_pruned_but_live_ones_stay():
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0") as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]),
    ):
        async with Node(name="c", listen="tcp://127.0.0.1:0", join=[a.address]):
            await wait_for(lambda: set(a._peers) == {"b", "c"}, 5)
        await wait_for(lambda: set(a._peers) == {"b"}, 10)
        a._directory.prune()  # one more sweep, now rather than after PRUNE_EVERY: b is alive, it stays
        assert set(a._peers) == {"b"} and a.peers()["b"]["connected"]


# ---------------------------------------------------------------- 12: nothing before the proof


async def test_hello_discloses_nothing_before_the_dialer_proves_the_token():
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0", config=_cfg()) as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address], config=_cfg()),
    ):
        assert "b" in a.peers()
        b_stream = a._peers["b"].link.tx_id
        # a stranger: the HELLO has no peer table and no link (stream ids), and after a wrong
        # proof the node rejects it without sending anything more
        conn, reply, raw, _nonce, mac_d = await _raw_hello(a, "stranger", "wrong")
        assert reply.name == "a"
        assert raw[6] == {} and raw[9] == {}
        assert b"b" not in msgpack.packb(raw[6]) and b_stream.encode() not in msgpack.packb(raw)
        await conn.send([handshake.Confirm(mac_d).encode()])
        frames = await asyncio.wait_for(conn.recv(), 5)
        assert msgpack.unpackb(frames[0])[0] == handshake.REJECT
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(conn.recv(), 5)
        assert "stranger" not in a._peers

        # the same dialer with the token learns the peers, after its proof
        conn, reply, raw, _nonce, mac_d = await _raw_hello(a, "friend", TOKEN)
        assert raw[6] == {} and raw[9] == {}
        await conn.send([handshake.Confirm(mac_d).encode()])
        welcome = handshake.parse_state(await asyncio.wait_for(conn.recv(), 5), handshake.WELCOME)
        assert welcome.peers == {"b": a.peers()["b"]["addresses"]}
        assert welcome.link["tx"]
        conn.abort()


async def test_cluster_of_three_forms_through_one_seed_with_a_token():
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0", config=_cfg()) as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address], config=_cfg()) as b,
        Node(name="c", listen="tcp://127.0.0.1:0", join=[a.address], config=_cfg()) as c,
    ):
        assert "b" in c.peers()  # from a's WELCOME
        await wait_for(lambda: "c" in b.peers(), 5)
        assert await b.request("c", "aionet.echo", "b->c", timeout=5) == "b->c"
        assert await c.request("b", "aionet.echo", "c->b", timeout=5) == "c->b"
        for n in (a, b, c):
            await wait_for(lambda n=n: set(n.members()) == {"a", "b", "c"}, 10)


# ---------------------------------------------------------------- 19: rough edges


async def test_bare_connect_and_close_is_not_a_warning():
    """A load balancer or Kubernetes tcpSocket probe connects and closes without a byte."""
    async with Node(name="a", listen="tcp://127.0.0.1:0", config=_cfg()) as a:
        with capture_logs() as logs:
            for _ in range(3):
                s = socket.create_connection(_hostport(a.address))
                await wait_for(lambda: len(a._connector.handshaking) == 1, 5)
                s.close()
                await wait_for(lambda: not a._connector.handshaking, 5)
        assert not [e for e in logs if e["log_level"] in ("warning", "error", "critical")], logs
        # garbage is still worth a warning
        with capture_logs() as logs:
            s = socket.create_connection(_hostport(a.address))
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            await wait_for(lambda: any(e["log_level"] == "warning" for e in logs), 5)
            s.close()


@pytest.mark.skipif(tls_backend() == "none", reason="neither cryptography nor openssl available")
async def test_tls_dial_to_a_tcp_node_names_the_scheme(tmp_path):
    keys = generate(tmp_path)
    sec = {"tls_cert": str(keys.node_cert), "tls_key": str(keys.node_key)}
    async with Node(name="a", listen="tcp://127.0.0.1:0") as a:
        host, port = _hostport(a.address)
        b = Node(
            name="b",
            listen="tls://127.0.0.1:0",
            join=[f"tls://{host}:{port}"],
            config=Config.from_dict({"security": sec}, env={}),
        )
        with pytest.raises(PeerUnavailable, match="not speaking TLS.*check the scheme"):
            await asyncio.wait_for(b.start(), 10)  # fails at once: retrying cannot help
    # and the other way round: tcp:// dialed at a tls:// node
    async with Node(name="t", listen="tls://127.0.0.1:0", config=Config.from_dict({"security": sec}, env={})) as t:
        host, port = _hostport(t.address)
        c = Node(name="c", listen="tcp://127.0.0.1:0", join=[f"tcp://{host}:{port}"])
        with pytest.raises(PeerUnavailable, match="tls:// dialed as tcp://.*check the scheme"):
            await asyncio.wait_for(c.start(), 10)


async def test_info_includes_devices():
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0") as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b,
    ):
        info = await b.request("a", "aionet.info", timeout=10)
        dev = info["devices"]
        assert dev["cpu_count"] >= 1 and dev["memory_total"] > 0 and isinstance(dev["gpus"], list)
        assert "cuda_available" in dev
        assert a.info()["devices"]["cpu_count"] >= 1
