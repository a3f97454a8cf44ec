"""Batched SENDs in the link (issue 18), fed directly: no sockets. The open batch takes its
place in the stream before any other envelope, is kept across a death verdict like any
unacknowledged message, and never carries more payloads than the peer advertised."""

import logging

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.codecs.envelope import REQ, SEND
from aionet.core.link import Link
from aionet.errors import PeerUnavailable, WouldBlock


def _link(reports: list | None = None, window: int = 1 << 20, batch: int | None = 4096) -> Link:
    link = Link(
        "b",
        dumps=lambda obj, compress=False: [msgpack.packb(obj, use_bin_type=True)],
        max_inflight_bytes=window,
        give_up_after=30.0,
        log=logging.getLogger("test"),
        death_grace=30.0,
        on_undeliverable=lambda peer, n, why: (reports if reports is not None else []).append((peer, n, why)),
    )
    link.set_batch_limit(batch)
    return link


def _stream(link: Link) -> list[list]:
    """The envelopes in the replay buffer, decoded, in stream order."""
    return [msgpack.unpackb(frames[0]) for _seq, frames, _n in link.state.unacked]


async def test_pushed_messages_go_before_any_later_envelope():
    link = _link()
    assert link.push("c", 1) and link.push("c", 2)
    assert link.post(REQ, [7, "svc", "x"]) is None  # seals the batch first
    assert link.push("c", 3)
    assert link.push("d", 4)  # another channel: the batch for "c" is sealed
    link._seal()
    want = [[SEND, 1, 0, "c", 1, 2], [REQ, 2, 0, 7, "svc", "x"], [SEND, 3, 0, "c", 3], [SEND, 4, 0, "d", 4]]
    assert _stream(link) == want


payloads = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.binary(max_size=1500),
    st.text(max_size=5),
    # within msgpack's range: this link's stand-in dumps is plain msgpack (the serializer sends bigger ints as an ext)
    st.lists(st.integers(-(2**63), 2**64 - 1), max_size=3),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(payloads, max_size=40))
def test_any_mix_keeps_call_order_and_each_message_once(objs):
    """Whatever takes the batch and whatever does not (bytes of 1 KiB and more), the stream
    holds every message once, in call order, in batches of at most the peer's limit."""
    link = _link(batch=5)
    link._seal_scheduled = True  # sealing driven by hand: no event loop needed
    for x in objs:
        if not link.push("c", x):
            assert link.post(SEND, ["c", x]) is None
    if link._bitems:
        link._seal()
    got = []
    for env in _stream(link):
        assert env[0] == SEND and env[3] == "c" and 1 <= len(env) - 4 <= 5
        got.extend(env[4:])
    assert got == objs


async def test_a_death_verdict_keeps_the_open_batch_for_a_successor():
    reports: list = []
    old = _link(reports)
    assert old.push("c", 1) and old.push("c", 2)
    old.fail(PeerUnavailable("b: declared dead"), keep=True)
    assert old.keeping == 1 and reports == []  # one envelope holding both
    new = _link(reports)
    assert new.adopt_stream(old) == 1
    assert _stream(new) == [[SEND, 1, 0, "c", 1, 2]]


async def test_a_peer_that_left_gets_the_open_batch_reported():
    reports: list = []
    link = _link(reports)
    link.push("c", 1)
    link.push("c", 2)
    link.peer_left()
    assert reports == [("b", 1, "peer left the cluster")]  # one envelope (two messages) given up


async def test_without_the_peers_feature_nothing_is_batched():
    link = _link(batch=None)
    assert not link.push("c", 1)
    link.set_batch_limit(True)  # malformed: not an int
    assert not link.batching


async def test_full_window_refuses_push_and_post_nowait():
    link = _link(window=100)
    assert link.push("c", b"x" * 90)
    assert link.push("c", b"y" * 20)  # checked before, like post: the last one may pass the window
    assert not link.push("c", b"z")
    with pytest.raises(WouldBlock, match="wait_space"):
        link.post_nowait(SEND, ["c", b"z"])
    assert len(_stream(link)) == 0 and len(link._bitems) == 2  # nothing taken after the window filled
