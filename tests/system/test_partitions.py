"""Partitions between network namespaces (issue 11's bar), with a cluster token.

Three `aionet serve` processes x, y, z run in network namespaces this test creates, joined by
veth pairs to a bridge in a fourth namespace (addresses 10.250.0.1-3 exist only there). x
streams sequenced messages to y and calls a service on y (tests/partition_app.py) while
iptables in x's and y's namespaces cut x <-> y: 2 s, 10 s both ways, 10 s one way, and 40 s
(marked slow). z reaches both sides throughout, so its indirect probes prove each side alive
to the other: nobody may be declared dead, and every message whose ``send`` returned arrives
exactly once, in order, after the cut heals.

Needs root and the ``ip`` and ``iptables`` commands (skipped otherwise). Everything it creates
(namespaces, and with them interfaces and rules; the three processes, by PID) is removed in
the fixture's teardown. The namespaces share one module-scoped cluster, so the cuts run in
sequence on one stream (the 40 s one last); the whole file takes about two minutes.
"""

from __future__ import annotations

import time

import pytest

from tests.netns import NetnsCluster, skip_reason, wait

TOKEN = "partition-test-token"
NODES = {"x": 1, "y": 2, "z": 3}  # name -> host part of its address
RECOVER = 60.0  # s allowed to catch up after a cut heals (TCP retransmission backs off)

_wait = wait


class Netns(NetnsCluster):
    """x, y and z on 10.250.0.1-3, running tests/partition_app.py."""

    def __init__(self, tmp):
        super().__init__(tmp, NODES, subnet="10.250.0", tag="part")

    def start(self, name: str, role: str, join: str | None = None) -> None:  # type: ignore[override]
        args = ["--app", "tests.partition_app:setup", *(["--join", self.url(join)] if join else [])]
        env = {"AIONET_SECURITY_TOKEN": TOKEN, "PARTITION_DIR": str(self.tmp), "PARTITION_ROLE": role}
        super().start(name, args, {**env, "PARTITION_PEER": "y"})

    def cut(self, both_ways: bool) -> None:
        """Drop x -> y (and y -> x when ``both_ways``) on arrival, inside the receiving namespace."""
        self.drop("y", "x")
        if both_ways:
            self.drop("x", "y")

    def heal(self) -> None:  # type: ignore[override]
        super().heal("x", "y")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if (reason := skip_reason()) is not None:
        pytest.skip(reason)
    c = Netns(tmp_path_factory.mktemp("partitions"))
    try:
        c.build()
        c.start("x", "producer")
        c.start("y", "consumer", join="x")
        c.start("z", "observer", join="x")
        _wait(lambda: all(c.status(n).get("members") == dict.fromkeys(NODES, "alive") for n in NODES), 30, "3 members")
        _wait(lambda: c.status("y").get("received", 0) > 100, 30, "the stream to start")
        yield c
    finally:
        c.close()


def _deaths(c: Netns) -> list:
    return [(n, e) for n in NODES for e in c.status(n).get("events", []) if e[2] == "dead"]


def _check_healthy(c: Netns) -> None:
    x, y = c.status("x"), c.status("y")
    assert not _deaths(c), f"deaths declared: {_deaths(c)}"
    assert all(c.status(n)["deaths_declared"] == 0 for n in NODES)
    assert not x["send_errors"] and not x["request_errors"], (x["send_errors"], x["request_errors"])
    assert y["duplicates"] == 0 and y["gaps"] == 0, f"consumer saw duplicates or lost/reordered messages: {y}"


def _partition(c: Netns, seconds: float, both_ways: bool = True) -> None:
    """Cut x <-> y for ``seconds`` while the stream runs, heal, then check nothing whose send
    returned was lost, duplicated or reordered, nobody was declared dead, and the stream and
    the requests flow again."""
    c.cut(both_ways)
    try:
        cut_end = time.monotonic() + seconds
        _wait(lambda: time.monotonic() >= cut_end, seconds + 1, "the cut", check=lambda: _check_healthy(c))
    finally:
        c.heal()
    sent = c.status("x")["sent"]
    reqs = c.status("x")["requests_ok"]
    healed = time.monotonic()
    # every message sent before the heal arrives; new ones and requests flow again
    healthy = lambda: _check_healthy(c)  # noqa: E731
    _wait(lambda: c.status("y")["received"] >= sent + 50, RECOVER, f"y to receive past {sent}", healthy)
    _wait(lambda: c.status("x")["requests_ok"] > reqs + 5, RECOVER, "requests to complete again", healthy)
    _wait(
        lambda: all(c.status(n)["members"] == dict.fromkeys(NODES, "alive") for n in NODES),
        RECOVER,
        "everyone to see everyone alive",
        healthy,
    )
    _check_healthy(c)
    x = c.status("x")
    print(
        f"cut {seconds} s {'both ways' if both_ways else 'one way'}: recovered in {time.monotonic() - healed:.1f} s;"
        f" sent {x['sent']}, requests {x['requests_ok']}, x suspected y {x['suspicions']} times,"
        f" asked others to probe {x['probes_sent']} times"
    )


@pytest.mark.timeout(180)
def test_partitions_of_2s_and_10s_both_ways_and_one_way_lose_nothing_and_kill_nobody(cluster):
    _partition(cluster, 2.0)
    _partition(cluster, 10.0)
    _partition(cluster, 10.0, both_ways=False)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_40s_partition_loses_nothing_and_kills_nobody_when_a_third_node_sees_both(cluster):
    _partition(cluster, 40.0)
    # the end: stop the stream; everything whose send returned was delivered exactly once
    (cluster.tmp / "stop").touch()
    _wait(lambda: cluster.status("x")["stopped"], 10, "the producer to stop")
    sent = cluster.status("x")["sent"]
    _wait(lambda: cluster.status("y")["received"] >= sent, RECOVER, "the last messages")
    assert cluster.status("y")["received"] == sent
    _check_healthy(cluster)
