"""The observability server on real nodes over tcp://127.0.0.1: /metrics passes `promtool check
metrics` and counts real traffic, /status shows the whole cluster, /health answers, /events
streams, a taken port fails start with a clear error, and stopping the node frees the port."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

pytest.importorskip("aiohttp", reason="aiohttp is not installed (pip install -e .[test])")
pytest.importorskip("prometheus_client", reason="prometheus-client is not installed (pip install -e .[test])")

from prometheus_client.parser import text_string_to_metric_families

from aionet import Node
from aionet.config import Config
from tests.conftest import wait_for
from tests.observe_util import free_port, get, get_json, need

pytestmark = pytest.mark.timeout(60)


def _node(name: str, port: int, join: str | None = None) -> Node:
    cfg = Config.from_dict({"http": {"port": port, "interval": 0.2}}, env={})
    return Node(name=name, listen="tcp://127.0.0.1:0", join=[join] if join else None, config=cfg)


async def _pair():
    a = _node("a", free_port())
    await a.start()
    b = _node("b", free_port(), a.address)
    await b.start()
    await wait_for(lambda: all(n.members().get(x, {}).get("state") == "alive" for n in (a, b) for x in "ab"), 15)
    return a, b


async def test_metrics_pass_promtool_and_count_real_traffic():
    a, b = await _pair()
    try:
        for i in range(50):
            await a.send("b", "inbox", b"x" * 64)
            await a.request("b", "aionet.echo", i)
        await wait_for(lambda: "b" in a.stats().membership.rtt_s, 10)  # a heartbeat to b was echoed
        status, body, ctype = await asyncio.to_thread(get, a.observer.url + "/metrics")
        assert status == 200 and ctype.startswith("text/plain")
        promtool = need("promtool", "prometheus")
        check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=30)
        assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode())
            for s in fam.samples
        }
        assert samples[("aionet_messages_sent_total", (("peer", "b"), ("transport", "tcp")))] >= 100
        assert samples[("aionet_sent_bytes_total", (("peer", "b"), ("transport", "tcp")))] >= 50 * 64
        ok = samples[("aionet_request_duration_seconds_count", (("outcome", "ok"), ("service", "aionet.echo")))]
        assert ok == 50
        assert samples[("aionet_members", (("state", "alive"),))] == 2
        # heartbeats are echoed: a real round trip on loopback, far under a heartbeat interval
        rtt = samples[("aionet_heartbeat_rtt_seconds", (("member", "b"),))]
        assert 0 < rtt < 0.5, rtt
        # an alive member is not suspected: its phi is under the threshold
        assert 0 <= samples[("aionet_heartbeat_phi", (("member", "b"),))] < a.config.heartbeat.phi_threshold
        # b handled those requests: its own histogram says so
        _, body_b, _ = await asyncio.to_thread(get, b.observer.url + "/metrics")
        assert 'aionet_handler_duration_seconds_count{outcome="ok",service="aionet.echo"} 50.0' in body_b.decode()
    finally:
        await b.stop()
        await a.stop()


async def test_status_health_and_live_stream():
    a, b = await _pair()
    try:
        st = await asyncio.to_thread(get_json, a.observer.url + "/status")
        assert st["node"] == "a" and set(st["members"]) == {"a", "b"}
        assert st["nodes"]["b"]["pid"] and st["nodes"]["b"]["latency"] is not None  # b answered with its summary
        h = await asyncio.to_thread(get_json, b.observer.url + "/health")
        assert h["status"] == "ok" and h["node"] == "b"
        status, page, ctype = await asyncio.to_thread(get, a.observer.url + "/")
        assert status == 200 and b"dashboard.js" in page and "html" in ctype
        status, js, _ = await asyncio.to_thread(get, a.observer.url + "/static/dashboard.js")
        assert status == 200 and b"EventSource" in js
        css = (await asyncio.to_thread(get, a.observer.url + "/static/dashboard.css"))[1]
        for asset in (page, js, css):  # works offline: nothing is fetched from another host
            assert b"http://" not in asset and b"https://" not in asset
        reader, writer = await asyncio.open_connection(a.observer.host, a.observer.port)
        writer.write(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert b"text/event-stream" in head
        line = await asyncio.wait_for(reader.readuntil(b"\n\n"), 5)
        data = line[line.index(b"data: ") + 6 :]
        assert set(json.loads(data)["members"]) == {"a", "b"}
        writer.close()
    finally:
        await b.stop()
        await a.stop()


async def test_taken_port_fails_start_and_stop_frees_the_port():
    a = _node("a", free_port())
    await a.start()
    port = a.observer.port
    clash = _node("c", port)
    with pytest.raises(OSError):
        await clash.start()
    await a.stop()  # the port must be free again
    again = _node("a2", port)
    await again.start()
    try:
        assert (await asyncio.to_thread(get, again.observer.url + "/health"))[0] == 200
    finally:
        await again.stop()


async def test_stop_with_a_page_open_is_prompt():
    a = _node("a", free_port())
    await a.start()
    reader, writer = await asyncio.open_connection(a.observer.host, a.observer.port)
    writer.write(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    await asyncio.wait_for(reader.readuntil(b"\n\n"), 5)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await a.stop()
    assert loop.time() - t0 < 3.0  # the open stream is ended, not waited on
    writer.close()


async def test_a_member_without_http_is_still_shown():
    """Only one node serves [http]; the other answers aionet.info, from which its summary is made."""
    a = _node("a", free_port())
    await a.start()
    b = Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address], config=Config.from_dict({}, env={}))
    await b.start()
    try:
        await wait_for(lambda: a.members().get("b", {}).get("state") == "alive", 15)
        for i in range(5):
            await a.send("b", "inbox", i)
        st = await asyncio.to_thread(get_json, a.observer.url + "/status")
        assert st["nodes"]["b"]["messages_received"] >= 5 and st["nodes"]["b"]["latency"] is None
        assert b.observer is None
    finally:
        await b.stop()
        await a.stop()
