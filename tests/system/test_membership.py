"""Membership over real transports: in-process nodes (inproc://, tcp://) and real
`aionet serve` processes killed with SIGKILL or frozen with SIGSTOP.

Bounds here are deliberately generous (this runs on a noisy shared 2-core machine): the tests
assert *that* detection, refutation and rejoin happen; how fast is measured by
benchmarks/failure_detection.py."""

import asyncio
import json
import os
import signal
import sys
import time

import pytest

from aionet import Node, PeerUnavailable
from aionet.config import Config
from aionet.membership import DEAD, SUSPECT, Update
from tests.conftest import listen_url, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMES = ["tcp", "inproc"]


def _cfg(**sections):
    return Config.from_dict(sections, env={})


@pytest.fixture(params=SCHEMES)
def scheme(request):
    return request.param


class Cluster:
    """In-process nodes, stopped (or cleaned up after a simulated crash) at the end."""

    def __init__(self, scheme: str):
        self.scheme = scheme
        self.nodes: dict[str, Node] = {}
        self.crashed: list[Node] = []

    async def add(self, name: str, join: str | None = None, **cfg) -> Node:
        seed = None if join is None else self.nodes[join].address
        n = Node(name=name, listen=listen_url(self.scheme), join=[seed] if seed else None, config=_cfg(**cfg))
        await n.start()
        self.nodes[name] = n
        return n

    async def converge(self, timeout: float = 15.0) -> None:
        names = set(self.nodes)

        def done():
            return all(
                set(n.members()) >= names and all(n.members()[x]["state"] == "alive" for x in names)
                for n in self.nodes.values()
            )

        await wait_for(done, timeout)

    async def crash(self, name: str) -> None:
        """Die like a killed process: no goodbye, listeners gone, every connection cut. Everything
        up to the first ``await`` cuts it off at once: given a loop pass with a connection still up,
        it would answer a heartbeat (with a goodbye attached, were its membership ``_leaving``),
        which no killed process does (a leaked goodbye made the crash read as a leave)."""
        node = self.nodes.pop(name)
        self.crashed.append(node)
        node._closing = True  # no BYE, no reconnect, no events; handshakes from now on are refused

        async def gone(*_a, **_k):
            raise PeerUnavailable("crashed")

        node._connector.dial = gone  # a dead process dials nobody
        for p in node._peers.values():
            if p.link is not None:
                p.link.left = True  # stops its reconnect loop
                if p.link._reconnect_task is not None:
                    p.link._reconnect_task.cancel()
                for c in list(p.link.conns):
                    c.conn.abort()
        ms = node.membership
        for t in list(ms._tasks):
            t.cancel()
        for t in list(node._tasks):
            t.cancel()
        # its liveness sidecar would go on answering for the (still running) test process,
        # reporting this loop's tick as merely stalled for up to heartbeat.max_loop_stall; a
        # killed process's sidecar sees it gone, and the silence of a stopped one says the same
        await ms.liveness.stop()
        for lst in node._listeners:
            await lst.close()
        await node.transports.aclose()

    async def close(self) -> None:
        for n in reversed(list(self.nodes.values())):
            await n.stop()
        for n in self.crashed:
            for t in list(n.membership._tasks):
                t.cancel()


@pytest.fixture
async def cluster(scheme):
    c = Cluster(scheme)
    yield c
    await c.close()


def _states(node: Node) -> dict[str, str]:
    return {k: v["state"] for k, v in node.members().items()}


# ---------------------------------------------------------------- join, gossip, views
async def test_join_through_any_seed_and_gossip_converges(cluster):
    await cluster.add("a")
    await cluster.add("b", join="a")
    c = await cluster.add("c", join="b")  # joins through b, not the first node
    # c received the member list from its seed at once
    assert {"a", "b", "c"} <= set(c.members())
    await cluster.add("d", join="c")
    await cluster.converge()
    view = cluster.nodes["a"].members()
    me = view["a"]
    assert me["self"] and me["state"] == "alive" and me["age"] == 0.0
    for name in "bcd":
        m = view[name]
        assert m["self"] is False
        assert m["address"] == cluster.nodes[name].address
        assert m["node_id"] == cluster.nodes[name].node_id
        assert m["incarnation"] == cluster.nodes[name].membership.incarnation
    # load reports reach every member through heartbeats and gossip
    await wait_for(lambda: all(v["load"]["reported"] for n in cluster.nodes.values() for v in n.members().values()), 15)
    load = view["a"]["load"]
    assert load["memory_total"] > 0 and load["tasks"] > 0 and load["loop_lag_ms"] >= 0
    dev = cluster.nodes["b"].members()["d"]["devices"]
    assert dev["cpu_count"] >= 1 and isinstance(dev["gpus"], list)  # no GPU here: an empty list


async def test_graceful_leave_is_announced_and_is_not_a_failure(cluster):
    a = await cluster.add("a")
    await cluster.add("b", join="a")
    await cluster.add("c", join="a")
    await cluster.converge()
    seen = []
    a.on_member_change(seen.append)
    async with a.member_events() as stream:
        b = cluster.nodes.pop("b")
        await b.stop()
        ev = await stream.get(timeout=10)
        assert (ev.name, ev.kind, ev.state, ev.previous) == ("b", "left", "left", "alive")
    await wait_for(lambda: _states(cluster.nodes["c"]).get("b") == "left", 10)
    await asyncio.sleep(1.0)
    assert [e.kind for e in seen if e.name == "b"] == ["left"]  # never suspect or dead
    assert _states(a)["b"] == "left"


async def test_crash_is_detected_everywhere_and_fails_pending_requests(cluster):
    a = await cluster.add("a")
    for n in "bcd":
        await cluster.add(n, join="a")
    await cluster.converge()
    victim = cluster.nodes["d"]

    @victim.service("hang")
    async def hang(_):
        await asyncio.Event().wait()

    pending = asyncio.ensure_future(a.request("d", "hang"))
    await asyncio.sleep(0.05)
    t0 = time.monotonic()
    await cluster.crash("d")
    with pytest.raises(PeerUnavailable):
        await asyncio.wait_for(pending, 15)
    for n in cluster.nodes.values():
        await n.membership.wait_for("d", "dead", timeout=15)
    # well before the link layer's own 30 s give-up: membership is the primary signal
    assert time.monotonic() - t0 < 15
    with pytest.raises(PeerUnavailable):
        await a.request("d", "aionet.echo", 1, timeout=5)


async def test_a_leave_heard_only_by_gossip_fails_requests_over_a_down_link_at_once(cluster):
    """a's connection to b is cut (and stays cut) when b leaves gracefully: b's goodbye reaches a
    only by gossip, through c. a's request to b must fail then, not after link.give_up_after."""
    a = await cluster.add("a", link={"give_up_after": 120.0})
    b = await cluster.add("b", join="a", link={"give_up_after": 120.0})
    await cluster.add("c", join="a", link={"give_up_after": 120.0})
    await cluster.converge()

    @b.service("hang")
    async def hang(_):
        await asyncio.Event().wait()

    pending = asyncio.ensure_future(a.request("b", "hang"))
    await wait_for(lambda: b.router.stats().running_handlers >= 1, 10)

    async def cut(*_a, **_k):
        raise PeerUnavailable("cut by the test")

    for me, other in ((a, "b"), (b, "a")):  # neither side can reach the other again
        me._connector.dial_peer = cut
        link = me._peers[other].link
        for c in list(link.conns):
            c.conn.abort()
    await wait_for(lambda: a._peers["b"].link.current is None, 10)
    t0 = time.monotonic()
    cluster.nodes.pop("b")
    await b.stop()
    with pytest.raises(PeerUnavailable, match="left"):
        await asyncio.wait_for(pending, 15)
    assert time.monotonic() - t0 < 15  # far below link.give_up_after (120 s)
    assert a.members()["b"]["state"] == "left"


async def test_events_reach_sync_and_async_subscribers(cluster):
    a = await cluster.add("a")
    got_sync, got_async = [], []

    async def on_change(ev):
        await asyncio.sleep(0)
        got_async.append(ev)

    unsubscribe = a.on_member_change(got_sync.append)
    a.on_member_change(on_change)
    await cluster.add("b", join="a")
    await wait_for(lambda: got_sync and got_async, 10)
    assert got_sync[0].name == "b" and got_sync[0].kind == "joined" and got_sync[0].state == "alive"
    unsubscribe()
    await cluster.add("c", join="a")
    await wait_for(lambda: any(e.name == "c" for e in got_async), 10)
    assert not any(e.name == "c" for e in got_sync)


async def test_a_suspected_node_refutes_with_a_higher_incarnation(cluster):
    a = await cluster.add("a")
    b = await cluster.add("b", join="a")
    await cluster.add("c", join="a")
    await cluster.converge()
    inc = b.membership.incarnation
    # a hears a (false) rumour that b is suspect: it spreads, b hears it and refutes
    a.membership._apply(Update("b", b.node_id, inc, SUSPECT, tuple(b.addresses)), reason="test rumour")
    await wait_for(lambda: b.membership.incarnation > inc, 10)
    await wait_for(lambda: all(n.members()["b"]["state"] == "alive" for n in cluster.nodes.values()), 10)
    assert a.members()["b"]["incarnation"] == b.membership.incarnation
    assert b.membership.stats().refutations >= 1


async def test_blocked_event_loop_does_not_accuse_peers():
    """All nodes share this loop: block it far beyond the detection time. The silence was
    everyone's own stall, so nobody may be suspected or declared dead afterwards. The logic is
    tested on fed time (tests/unit/membership/test_timers.py); this checks the wiring (the
    lag-watch task notes real stalls), once: the transport plays no part."""
    cluster = Cluster("inproc")
    try:
        for n in "abc":
            await cluster.add(n, join=None if n == "a" else "a")
        await cluster.converge()
        events = []
        for n in cluster.nodes.values():
            n.on_member_change(events.append)
        time.sleep(2.5)
        await asyncio.sleep(1.0)  # detectors are evaluated every 50 ms: a miscount shows at once
        assert not [e for e in events if e.kind in ("dead", "suspect")], events
        assert all(set(_states(n).values()) == {"alive"} for n in cluster.nodes.values())
        assert all(n.membership.clock.stalled >= 2.0 for n in cluster.nodes.values())
    finally:
        await cluster.close()


async def test_one_bad_link_does_not_kill_a_healthy_node(cluster):
    """a cannot hear b at all (heartbeats and its own probes fail), but c and d can: the
    indirect probes keep b alive."""
    a = await cluster.add("a")
    for n in "bcd":
        await cluster.add(n, join="a")
    await cluster.converge()
    b = cluster.nodes["b"]
    ms = a.membership
    real_send = a.send_control

    def lossy_send(peer, env):
        return True if peer == "b" else real_send(peer, env)  # black hole toward b

    async def no_direct(url, name, node_id, deadline):
        if name == "b":
            await asyncio.sleep(max(deadline - ms.clock(), 0))
            return "hung"
        return await real_probe(url, name, node_id, deadline)

    real_probe = ms._probe_url
    a.send_control = lossy_send
    ms._probe_url = no_direct
    events = []
    a.on_member_change(events.append)
    await wait_for(lambda: ms.stats().probes_sent >= 2, 15)  # it did suspect b and ask others
    await asyncio.sleep(1.0)
    assert not [e for e in events if e.name == "b" and e.kind == "dead"]
    assert a.members()["b"]["state"] in ("alive", "suspect")
    a.send_control = real_send
    ms._probe_url = real_probe
    assert await a.request("b", "aionet.echo", "still here", timeout=5) == "still here"
    assert b.members()["b"]["state"] == "alive"


@pytest.mark.parametrize("token", [None, "s3cret"])
async def test_backpressured_peer_is_not_declared_dead(token):
    """b floods a mailbox a never reads, so a stops reading that connection and no heartbeat
    crosses it: the fresh-connection probe proves a is alive (also with a cluster token, where
    the probe must check the acceptor's proof of the token; issue 11 saw 16 deaths in 12 s)."""
    sec = {"security": {"token": token}} if token else {}
    hb = {"interval": 0.1}  # detection in ~0.5 s, re-verification every 1 s: 2 s is several of each
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0", config=_cfg(link={"mailbox_size": 4}, heartbeat=hb, **sec)) as a,
        Node(
            name="b",
            listen="tcp://127.0.0.1:0",
            join=[a.address],
            config=_cfg(link={"max_inflight_bytes": 1 << 20}, heartbeat=hb, **sec),
        ) as b,
    ):
        events = []
        a.on_member_change(events.append)
        b.on_member_change(events.append)
        payload = b"x" * 65536

        async def flood():
            while True:
                await b.send("a", "sink", payload)

        task = asyncio.ensure_future(flood())
        await asyncio.sleep(2.0)  # several detection times
        assert not [e for e in events if e.kind == "dead"], events
        # the heartbeats really were stuck (the scenario happened) and probes answered them
        assert a.membership.stats().suspicions + b.membership.stats().suspicions >= 1
        assert b.members()["a"]["state"] == "alive"
        task.cancel()
        for _ in range(4):
            await a.recv("sink", timeout=5)


async def test_heartbeat_traffic_per_node_does_not_grow_with_the_cluster():
    cfg = {"heartbeat": {"interval": 0.1}}
    nodes = [Node(name="n00", listen="inproc://", config=_cfg(**cfg))]
    await nodes[0].start()
    try:
        for i in range(1, 12):
            n = Node(name=f"n{i:02d}", listen="inproc://", join=[nodes[0].address], config=_cfg(**cfg))
            await n.start()
            nodes.append(n)
        await wait_for(lambda: all(len(n.members()) == 12 for n in nodes), 15)
        await asyncio.sleep(1.0)
        before = [n.membership.stats().sent_msgs for n in nodes]
        t0 = time.monotonic()
        await asyncio.sleep(2.0)
        intervals = (time.monotonic() - t0) / 0.1
        per_interval = [(n.membership.stats().sent_msgs - b) / intervals for n, b in zip(nodes, before, strict=True)]
        # fanout 3: 3 heartbeats + ~3 acks per interval per node; all-to-all would be 22
        assert max(per_interval) < 10, per_interval
        assert all(len(n.membership._detectors) == 3 for n in nodes)
    finally:
        for n in reversed(nodes):
            await n.stop()


async def test_status_command_prints_members_as_json_and_table():
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0") as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]),
    ):
        env = {**os.environ, "PYTHONPATH": REPO}

        async def run(*args):
            p = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "aionet",
                "status",
                "--connect",
                a.address,
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
            out, err = await asyncio.wait_for(p.communicate(), 60)
            assert p.returncode == 0, err.decode()[-2000:]
            return out.decode()

        snap = json.loads(await run("--json"))
        assert snap["node"] == "a"
        assert set(snap["members"]) == {"a", "b"}
        assert snap["members"]["b"]["state"] == "alive"
        assert snap["members"]["a"]["load"]["memory_total"] > 0
        table = await run()
        assert "alive" in table and " b " in table and "age" in table
        lines = (await run("--json", "--watch", "--count", "2", "--interval", "0.1")).strip().splitlines()
        assert len(lines) == 2 and all(json.loads(x)["node"] == "a" for x in lines)


async def test_status_command_reports_an_unreachable_node():
    p = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "aionet",
        "status",
        "--connect",
        "tcp://127.0.0.1:9",
        "--timeout",
        "2",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _out, err = await asyncio.wait_for(p.communicate(), 60)
    assert p.returncode != 0 and b"tcp://127.0.0.1:9" in err


# ---------------------------------------------------------------- real processes
def _serve(spawn, name, join=None):
    args = ["--name", name, "--listen", "tcp://127.0.0.1:0", "--app", "tests.apps:setup"]
    if join:
        args += ["--join", join]
    return spawn(*args, env={"PYTHONPATH": REPO})


@pytest.mark.timeout(120)
async def test_sigkilled_process_is_seen_dead_by_every_member(spawn):
    p1, r1 = _serve(spawn, "p1")
    _p2, _r2 = _serve(spawn, "p2", r1["addresses"][0])
    victim, _rv = _serve(spawn, "victim", r1["addresses"][0])
    async with Node(name="t", listen="tcp://127.0.0.1:0", join=r1["addresses"]) as t:
        await wait_for(lambda: {"p1", "p2", "victim"} <= set(t.members()), 20)
        assert await t.request("victim", "test.pid", timeout=10) == victim.pid
        pending = asyncio.ensure_future(t.request("victim", "test.hang"))
        await asyncio.sleep(0.1)
        os.kill(victim.pid, signal.SIGKILL)
        await t.membership.wait_for("victim", "dead", timeout=20)
        with pytest.raises(PeerUnavailable):
            await asyncio.wait_for(pending, 20)
        for peer in ("p1", "p2"):  # the other processes agree

            async def dead_there(peer=peer):
                snap = await t.request(peer, "aionet.members", timeout=10)
                return snap["members"]["victim"]["state"] == "dead"

            deadline = time.monotonic() + 20
            while not await dead_there():
                assert time.monotonic() < deadline, f"{peer} never saw the victim dead"
                await asyncio.sleep(0.1)
        assert p1.poll() is None


@pytest.mark.timeout(120)
async def test_sigstopped_process_is_declared_dead_and_rejoins_after_sigcont(spawn):
    _p1, r1 = _serve(spawn, "p1")
    _serve(spawn, "p2", r1["addresses"][0])
    victim, _rv = _serve(spawn, "victim", r1["addresses"][0])
    async with Node(name="t", listen="tcp://127.0.0.1:0", join=r1["addresses"]) as t:
        await wait_for(lambda: {"p1", "p2", "victim"} <= set(t.members()), 20)
        await wait_for(lambda: t.members()["victim"]["state"] == "alive", 20)
        inc = t.members()["victim"]["incarnation"]
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            await t.membership.wait_for("victim", "dead", timeout=20)
        finally:
            os.kill(victim.pid, signal.SIGCONT)
        await t.membership.wait_for("victim", "alive", timeout=30)
        m = t.members()["victim"]
        assert m["incarnation"] > inc  # it refuted its death with a new incarnation
        assert await t.request("victim", "test.pid", timeout=10) == victim.pid
        snap = await t.request("p1", "aionet.members", timeout=10)
        deadline = time.monotonic() + 20
        while snap["members"]["victim"]["state"] != "alive":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
            snap = await t.request("p1", "aionet.members", timeout=10)


@pytest.mark.timeout(120)
async def test_restarted_process_with_the_same_name_joins_as_a_new_incarnation(spawn):
    _p1, r1 = _serve(spawn, "p1")
    victim, _rv = _serve(spawn, "victim", r1["addresses"][0])
    async with Node(name="t", listen="tcp://127.0.0.1:0", join=r1["addresses"]) as t:
        await wait_for(lambda: t.members().get("victim", {}).get("state") == "alive", 20)
        old = t.members()["victim"]
        events = t.member_events()
        os.kill(victim.pid, signal.SIGKILL)
        await t.membership.wait_for("victim", "dead", timeout=20)
        victim2, _ = _serve(spawn, "victim", r1["addresses"][0])
        await t.membership.wait_for("victim", "alive", timeout=30)
        new = t.members()["victim"]
        assert new["node_id"] != old["node_id"] and new["incarnation"] > old["incarnation"]
        assert await t.request("victim", "test.pid", timeout=10) == victim2.pid
        kinds = []
        while True:
            try:
                ev = await events.get(timeout=0.5)
            except TimeoutError:
                break
            if ev.name == "victim":
                kinds.append(ev.kind)
        assert "dead" in kinds and kinds[-1] in ("joined", "restarted")
        events.close()


async def test_a_live_node_declared_dead_refutes_and_comes_back(cluster):
    """A false death (say, after a partition) is not permanent: the node hears about it,
    refutes with a new incarnation, and every member takes it back."""
    a = await cluster.add("a")
    await cluster.add("b", join="a")
    c = await cluster.add("c", join="a")
    await cluster.converge()
    for i in range(5):  # both directions have streams in progress when the false death hits
        assert await a.request("c", "aionet.echo", i, timeout=5) == i
        assert await c.request("a", "aionet.echo", i, timeout=5) == i
    inc = c.membership.incarnation
    a.membership._apply(Update("c", c.node_id, inc, DEAD, tuple(c.addresses)), reason="test: false death")
    b = cluster.nodes["b"]
    # b hears of the death from a, or first of c's refutation (c may hear of its death, from a,
    # before b does, and then the older rumour is stale at b): either way, b has heard of it
    await wait_for(
        lambda: _states(b)["c"] == "dead" or b.members()["c"]["incarnation"] > inc,
        10,
        describe=lambda: f"b's view of c: {b.members()['c']}, c's incarnation {c.membership.incarnation} (was {inc})",
    )
    await wait_for(lambda: c.membership.incarnation > inc, 15)
    await wait_for(lambda: all(_states(n)["c"] == "alive" for n in (a, cluster.nodes["b"])), 15)
    # the links replaced after the false death carry traffic both ways (no flapping)
    for x in cluster.nodes.values():
        for y in cluster.nodes:
            if y != x.name:
                for i in range(20):
                    assert await x.request(y, "aionet.echo", i, timeout=5) == i


# ---------------------------------------------------------------- cluster token (issue 11, item 1)
def _token(token):
    return _cfg(security={"token": token})


async def test_a_probe_proves_life_only_with_the_right_cluster_token():
    """The probe checks the acceptor's MAC with the names in the order the acceptor signs them
    (acceptor, dialer); with them swapped every probe of a token cluster failed."""
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0", config=_token("s3cret")) as a,
        Node(name="b", listen="tcp://127.0.0.1:0", config=_token("s3cret")) as b,
        Node(name="c", listen="tcp://127.0.0.1:0", config=_token("wrong")) as c,
    ):
        ms = a.membership
        assert await ms._direct_probe("b", b.node_id, b.addresses, 2.0) == "alive"
        assert await ms._probe_url(b.address, "b", "another-process", ms.clock() + 2.0) == "replaced"
        # c answers, but cannot prove our token: no proof of life
        assert await ms._probe_url(c.address, "c", c.node_id, ms.clock() + 2.0) == "error"
        assert await ms._direct_probe("c", c.node_id, c.addresses, 0.5) != "alive"


@pytest.mark.parametrize("direct", ["works", "blocked"])
async def test_with_a_token_a_suspected_but_alive_peer_is_refuted_by_probes(direct):
    """a stops hearing b's heartbeat replies; with a token, the direct probe (or, when a cannot
    reach b at all, the indirect probes through c and d) proves b alive: never declared dead."""
    cluster = Cluster("tcp")
    try:
        a = await cluster.add("a", security={"token": "s3cret"})
        for n in "bcd":
            await cluster.add(n, join="a", security={"token": "s3cret"})
        await cluster.converge()
        ms = a.membership
        real_send, real_probe = a.send_control, ms._probe_url

        def lossy_send(peer, env):
            return True if peer == "b" else real_send(peer, env)  # black hole toward b

        async def no_direct(url, name, node_id, deadline):
            if name == "b":
                await asyncio.sleep(max(deadline - ms.clock(), 0))
                return "unreachable"
            return await real_probe(url, name, node_id, deadline)

        a.send_control = lossy_send
        if direct == "blocked":
            ms._probe_url = no_direct
        events = []
        for n in cluster.nodes.values():
            n.on_member_change(events.append)
        await wait_for(lambda: ms.stats().suspicions >= 2, 15)  # suspected, verified, suspected again
        await asyncio.sleep(1.0)
        assert not [e for e in events if e.kind == "dead"], events
        assert ms.stats().deaths_declared == 0
        assert a.members()["b"]["state"] in ("alive", "suspect")
        a.send_control, ms._probe_url = real_send, real_probe
        assert await a.request("b", "aionet.echo", "still here", timeout=5) == "still here"
    finally:
        await cluster.close()


# ---------------------------------------------------------------- members() load (item 19)
async def test_members_load_is_a_zero_report_before_the_first_report(cluster):
    a = await cluster.add("a")
    a.membership._apply(Update("ghost", "x" * 32, 1, DEAD, ()), reason="test")
    ghost = a.members()["ghost"]
    assert ghost["load"]["reported"] is False
    assert ghost["load"]["cpu_percent"] == 0.0 and ghost["load"]["memory_total"] == 0
    assert ghost["devices"] == {"cpu_count": 0, "memory_total": 0, "gpus": []}
    assert a.members()["a"]["load"]["reported"] is True


# ---------------------------------------------------------------- owned tasks (item 16)
async def test_a_cancelled_probe_leaves_no_unretrieved_task_exception():
    """Probes given up on while their recv() is pending (the asker cancelled, then the node
    stopped): the connections are closed, recv() ends in ConnectionClosed, and nobody may leave
    that exception unretrieved (issue 11 item 16)."""
    import gc

    loop = asyncio.get_running_loop()
    errors = []
    old_handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    held = []

    async def silent(reader, writer):  # accepts, reads the HELLO, never answers
        held.append(writer)
        await reader.read(1 << 16)

    servers = [await asyncio.start_server(silent, "127.0.0.1", 0) for _ in range(3)]
    urls = [f"tcp://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers]
    try:
        async with Node(name="a", listen="tcp://127.0.0.1:0") as a:
            ms = a.membership
            for i, url in enumerate(urls):
                probe = asyncio.ensure_future(ms._direct_probe("x", "nid", [url], 30.0))
                await wait_for(lambda i=i: len(held) > i, 5)
                await asyncio.sleep(0.05)
                probe.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await probe
            assert len(ms._exchanges) == 3  # the shared probe connections still wait for answers
        for _ in range(5):
            await asyncio.sleep(0.02)
            gc.collect()
    finally:
        for s in servers:
            s.close()
        loop.set_exception_handler(old_handler)
    assert not [e for e in errors if "never retrieved" in str(e.get("message", ""))], errors


# ---------------------------------------------------------------- amplification (item 11)
class _CountingListener:
    """A TCP listener this test owns: counts connections (and the most open at once). It
    closes each at once (the cheapest answer for the dialer, so the worst case for a dial
    loop), or with ``hang`` holds it open without a word until the dialer gives up."""

    def __init__(self, hang: bool = False):
        self.hang = hang
        self.connections = 0
        self.open = self.max_open = 0
        self.server = None

    async def __aenter__(self):
        async def handle(reader, writer):
            self.connections += 1
            self.open += 1
            self.max_open = max(self.max_open, self.open)
            try:
                if self.hang:
                    while await reader.read(65536):
                        pass
            finally:
                self.open -= 1
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.url = f"tcp://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.server.close()


async def _attacker_and_victim():
    victim = Node(name="victim", listen="tcp://127.0.0.1:0", config=_cfg())
    await victim.start()
    evil = Node(name="evil", listen="tcp://127.0.0.1:0", join=[victim.address], config=_cfg())
    await evil.start()
    evil.membership._apply_wire = lambda *_a, **_k: None  # the attacker keeps out of membership
    return victim, evil


def _send_peers(evil, table):
    from aionet.codecs.envelope import PEERS

    return evil._peers["victim"].link.send(PEERS, [table])


async def test_peers_and_probe_requests_do_not_make_a_node_dial_an_address_for_them():
    """Issue 11: a PEERS message naming any address plus ten 30-byte PROBE_REQs made a node open
    1,561 connections to that address. Now: PROBE_REQ about a name that is not a member is
    answered "could not try" without dialing anything."""
    from aionet.codecs.envelope import PROBE_REQ

    victim, evil = await _attacker_and_victim()
    try:
        async with _CountingListener() as target:
            await _send_peers(evil, {"fake": [target.url]})
            await wait_for(lambda: "fake" in victim._peers, 5)
            for pid in range(10):
                assert evil.send_control("victim", [PROBE_REQ, 10_000 + pid, "fake", "nid", 2.0])
            await asyncio.sleep(2.5)
            assert target.connections == 0
            assert await evil.request("victim", "aionet.echo", 1, timeout=5) == 1  # still connected
    finally:
        await evil.stop()
        await victim.stop()


@pytest.mark.parametrize("hang", [False, True], ids=["closes", "hangs"])
async def test_probe_requests_about_members_share_one_spaced_out_probe(hang):
    """Even for members (a hostile peer can gossip made-up members), many PROBE_REQs cause one
    probe at a time per member, with backing-off retries, at most MAX_SERVED_PROBES members at
    once, and no more than one connection per PROBE_REUSE s to any one address."""
    from aionet.codecs.envelope import GOSSIP, PROBE_REQ
    from aionet.core.connect import DIAL_GAP
    from aionet.membership import ALIVE, MAX_SERVED_PROBES, PROBE_REUSE

    victim, evil = await _attacker_and_victim()
    try:
        async with _CountingListener(hang) as target:
            fakes = [f"zz-fake-{i:02d}" for i in range(40)]  # sort after the real nodes on the ring
            ups = [Update(f, f"id-{f}", 1, ALIVE, (target.url,)).to_wire() for f in fakes]
            assert evil.send_control("victim", [GOSSIP, ups, []])
            await wait_for(lambda: all(f in victim.members() for f in fakes), 5)
            t0 = time.monotonic()
            for rnd in range(5):
                for i, f in enumerate(fakes):
                    assert evil.send_control("victim", [PROBE_REQ, rnd * 100 + i, f, f"id-{f}", 2.0])
                await asyncio.sleep(0)
                assert len(getattr(victim.membership, "_served", {})) <= MAX_SERVED_PROBES
            await asyncio.sleep(2.5)
            elapsed = time.monotonic() - t0
            # the fakes are also dialed as members (heartbeats, the scheduler): by name, spaced
            # DIAL_GAP apart per address; probes PROBE_REUSE apart. 200 unbounded probe loops
            # (and a dial per made-up name) made thousands.
            assert target.connections <= elapsed / PROBE_REUSE + elapsed / DIAL_GAP + 5, target.connections
            assert target.max_open <= 2  # one probe and one dial at a time
            assert await evil.request("victim", "aionet.echo", 1, timeout=5) == 1
    finally:
        await evil.stop()
        await victim.stop()


async def test_peer_tables_from_peers_are_bounded():
    """Issue 11: 300,007 made-up peers in PEERS cost 111 MiB. A PEERS message is read up to
    MAX_PEERS_PER_MESSAGE entries and names learned from others stop at MAX_HEARSAY_PEERS."""
    from aionet.core.peers import MAX_HEARSAY_PEERS, MAX_PEERS_PER_MESSAGE

    victim, evil = await _attacker_and_victim()
    try:
        await _send_peers(evil, {f"big-{i}": ["tcp://peer.example:1"] for i in range(3 * MAX_PEERS_PER_MESSAGE)})
        await wait_for(lambda: f"big-{MAX_PEERS_PER_MESSAGE - 1}" in victim._peers, 10)
        assert f"big-{MAX_PEERS_PER_MESSAGE}" not in victim._peers
        for batch in range(8):
            table = {f"p{batch}-{i}": ["tcp://peer.example:1"] for i in range(MAX_PEERS_PER_MESSAGE)}
            await _send_peers(evil, table)
        assert await evil.request("victim", "aionet.echo", 1, timeout=10) == 1  # in order: all read
        assert MAX_HEARSAY_PEERS <= len(victim._peers) <= MAX_HEARSAY_PEERS + 2
        assert "evil" in victim._peers
    finally:
        await evil.stop()
        await victim.stop()
