"""The link's rules after a death verdict (issue 13), fed directly: no sockets, no sleeps.

A link declared dead keeps its unacknowledged messages for ``death_grace``; a successor
adopts them (same stream id, same sequence numbers); anything given up is reported once,
with its count."""

import logging

from aionet.core.link import Link
from aionet.errors import PeerUnavailable


def _link(grace: float, reports: list) -> Link:
    return Link(
        "b",
        dumps=lambda obj, compress=False: [repr(obj).encode()],
        max_inflight_bytes=1 << 20,
        give_up_after=30.0,
        log=logging.getLogger("test"),
        death_grace=grace,
        on_undeliverable=lambda peer, n, why: reports.append((peer, n, why)),
    )


def _post(link: Link, n: int) -> None:
    for i in range(n):
        assert link.post(7, ["ch", i]) is None  # no connection: recorded for replay


async def test_a_dead_link_keeps_its_stream_for_a_successor_to_adopt():
    reports: list = []
    old = _link(30.0, reports)
    _post(old, 5)
    old.on_ack(2)
    old.fail(PeerUnavailable("b: declared dead"), keep=True)
    assert old.keeping == 3 and reports == []
    new = _link(30.0, reports)
    assert new.adopt_stream(old) == 3
    assert new.tx_id == old.tx_id
    assert [seq for seq, _f, _n in new.state.unacked] == [3, 4, 5]
    assert new.state.next_seq == 6 and new.state.acked == 2
    assert old.keeping == 0 and new.adopt_stream(old) == 0  # adopted once
    # the peer kept our stream and had received up to 4: only 5 is left to replay
    new.apply_resume({"tx": "x", "rx": new.tx_id, "recv": 4}, "node-1")
    assert [seq for seq, _f, _n in new.state.unacked] == [5]
    assert reports == []


async def test_a_peer_back_as_a_new_process_gets_the_adopted_messages_reported():
    reports: list = []
    old = _link(30.0, reports)
    old.apply_resume({"tx": "s1"}, "node-1")
    _post(old, 4)
    old.fail(PeerUnavailable("b: declared dead"), keep=True)
    new = _link(30.0, reports)
    new.inherit_rx(old)
    new.adopt_stream(old)
    new.apply_resume({"tx": "s2", "rx": "", "recv": 0}, "node-2")
    assert reports == [("b", 4, "b: peer restarted; in-flight messages to it are lost")]
    assert new.undeliverable == 4 and not new.state.unacked and new.state.next_seq == 1


async def test_without_keep_or_grace_the_messages_are_given_up_and_reported_at_once():
    for grace, keep in ((30.0, False), (0.0, True)):
        reports: list = []
        link = _link(grace, reports)
        _post(link, 3)
        link.fail(PeerUnavailable("b: gone"), keep=keep)
        assert reports == [("b", 3, "b: gone")] and link.keeping == 0
        assert link.give_up("again") == 0 and len(reports) == 1  # reported once


async def test_grace_expiry_gives_up_exactly_what_was_kept():
    reports: list = []
    link = _link(30.0, reports)
    _post(link, 6)
    link.on_ack(1)
    link.fail(PeerUnavailable("b: declared dead"), keep=True)
    timer = link._grace_timer
    assert timer is not None
    timer._run()  # what the loop does after death_grace seconds
    assert reports and reports[0][:2] == ("b", 5) and "death_grace" in reports[0][2]
