"""aionet.testing.cluster: N joined nodes, every one seen alive by every other, stopped on exit."""

import pytest

import aionet.testing


@pytest.mark.parametrize("transport", ["inproc", "tcp"])
async def test_cluster_starts_joined_nodes_and_stops_them(transport):
    async with aionet.testing.cluster(n=3, transport=transport, config={"heartbeat": {"interval": 0.1}}) as nodes:
        names = [n.name for n in nodes]
        assert names == ["n0", "n1", "n2"]
        for n in nodes:  # entered only once everyone sees everyone alive
            assert {k: v["state"] for k, v in n.members().items()} == dict.fromkeys(names, "alive")
            assert n.config.heartbeat.interval == 0.1
        scheme = "inproc://" if transport == "inproc" else "tcp://127.0.0.1:"
        assert all(n.address.startswith(scheme) for n in nodes)
        assert await nodes[2].request("n0", "aionet.echo", "hi", timeout=5) == "hi"
    assert all(not n._running for n in nodes)


async def test_cluster_rejects_an_unknown_transport():
    with pytest.raises(ValueError, match="inproc"):
        async with aionet.testing.cluster(transport="carrier-pigeon"):
            pass
