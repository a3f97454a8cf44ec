"""The same application over every transport, chosen only by config: identical results.
And mixed clusters: nodes listening on several transports reach each other."""

import asyncio
import os

import numpy as np
import pytest

from aionet import Node
from tests.conftest import listen_url

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMES = ["tcp", "inproc", "zmq+tcp", "zmq+ipc"]


async def _app(config_a, config_b):
    """request/reply, mailboxes and a 64 MiB array; returns what a user would observe."""
    a = Node.from_config(config_a)
    await a.start()
    try:
        b = Node.from_config(config_b, join=[a.address])
        await b.start()
        try:

            @a.service("stats")
            async def stats(arr):
                return {"sum": float(arr.sum()), "shape": list(arr.shape), "dtype": str(arr.dtype)}

            out = {"echo": await b.request("a", "aionet.echo", {"k": (1, 2.5, "x", b"y")}, timeout=10)}
            for i in range(100):
                await b.send("a", "box", i)
            got = []
            while len(got) < 100:
                got += await a.recv_batch("box")
            out["box"] = got
            big = np.arange(8 * 2**20, dtype=np.float64)  # 64 MiB
            out["stats"] = await b.request("a", "stats", big, timeout=60)
            await a.send("b", "arr", big[::1024].copy())
            back = await b.recv("arr", timeout=30)
            out["back"] = back.tolist()
            return out
        finally:
            await b.stop()
    finally:
        await a.stop()


def _toml(tmp_path, name, url):
    p = tmp_path / f"{name}.toml"
    p.write_text(f'[node]\nname = "{name}"\nlisten = ["{url}"]\n')
    return p


async def test_same_app_same_results_over_every_transport(tmp_path):
    results = {}
    for scheme in SCHEMES:
        results[scheme] = await asyncio.wait_for(
            _app(
                _toml(tmp_path, "a", listen_url(scheme, tmp_path)),
                _toml(tmp_path, "b", listen_url(scheme, tmp_path)),
            ),
            120,
        )
    reference = results["tcp"]
    assert reference["echo"] == {"k": (1, 2.5, "x", b"y")}
    assert reference["box"] == list(range(100))
    assert reference["stats"]["shape"] == [8 * 2**20]
    for scheme, res in results.items():
        assert res == reference, f"{scheme} differs from tcp"


async def test_node_listening_on_two_transports_serves_both(tmp_path):
    async with Node(name="hub", listen=["tcp://127.0.0.1:0", "zmq+tcp://127.0.0.1:0"]) as hub:
        tcp_url, zmq_url = hub.addresses
        assert tcp_url.startswith("tcp://") and zmq_url.startswith("zmq+tcp://")
        info = await hub.request("hub", "aionet.info")
        assert info["transports"] == ["tcp", "zmq+tcp"]
        async with (
            Node(name="z", listen="zmq+tcp://127.0.0.1:0", join=[zmq_url]) as z,
            Node(name="t", listen="tcp://127.0.0.1:0", join=[tcp_url]) as t,
        ):
            assert await z.request("hub", "aionet.echo", "z", timeout=10) == "z"
            assert await t.request("hub", "aionet.echo", "t", timeout=10) == "t"
            # z and t learn each other through the hub and talk directly
            assert await z.request("t", "aionet.echo", 1, timeout=10) == 1
            assert await t.request("z", "aionet.echo", 2, timeout=10) == 2


@pytest.mark.timeout(120)
async def test_serve_processes_form_a_mixed_tcp_and_zmq_cluster(spawn):
    _p1, ready1 = spawn("--name", "zmq-node", "--listen", "zmq+tcp://127.0.0.1:0")
    _p2, ready2 = spawn("--name", "tcp-node", "--listen", "tcp://127.0.0.1:0", "--join", ready1["addresses"][0])
    async with Node(name="client", listen="tcp://127.0.0.1:0", join=ready2["addresses"]) as c:
        assert await c.request("tcp-node", "aionet.echo", "hi", timeout=10) == "hi"
        for _ in range(200):
            if "zmq-node" in c.peers():
                break
            await asyncio.sleep(0.05)
        assert await c.request("zmq-node", "aionet.echo", "hi", timeout=10) == "hi"
        info = await c.request("zmq-node", "aionet.info", timeout=10)
        assert info["transports"] == ["zmq+tcp"]
