"""The link's standalone ACKs, fed directly (no sockets, no sleeps: the timer's callback is
run by hand). A message is acknowledged within ack_delay of the timer that saw it; what arrived
after a send already carried an ack gets a timer of its own instead of an ACK frame, so a
two-way stream (requests and replies, a collective's rounds) sends few standalone ACKs."""

import logging
from types import SimpleNamespace
from typing import Any

import msgpack

from aionet.codecs.envelope import ACK
from aionet.core.link import BIG_MESSAGE, STREAM_ACK_BYTES, Link


def _link(more_inbound: list[bool] | None = None) -> tuple[Link, list[Any]]:
    sent: list[Any] = []
    link = Link(
        "b",
        dumps=lambda obj, compress=False: [obj],
        max_inflight_bytes=1 << 20,
        give_up_after=30.0,
        log=logging.getLogger("test"),
    )
    # an ACK frame is packed by the link itself: read back, as the peer would
    conn = SimpleNamespace(send_nowait=lambda frames: sent.append(msgpack.unpackb(frames[0])))
    if more_inbound is not None:
        conn.more_inbound = lambda: more_inbound[0]
    link.current = SimpleNamespace(conn=conn)
    return link, sent


def _receive(link: Link, n: int, size: int = 64) -> None:
    for _ in range(n):
        assert link.state.on_receive(link.state.recv_seq + 1)
    link.received(size * n)


def _fire(link: Link) -> None:
    timer = link._ack_timer
    assert timer is not None, "no ack timer armed"
    timer.cancel()
    link._ack_due()


async def test_messages_nobody_acked_get_an_ack_frame_when_the_timer_fires() -> None:
    link, sent = _link()
    _receive(link, 3)
    assert sent == []  # not at once: a send may carry the ack first
    _fire(link)
    assert sent == [[ACK, 3]] and link._ack_timer is None and link.state.ack_owed == 0


async def test_what_arrived_after_a_piggybacked_ack_waits_for_a_timer_of_its_own() -> None:
    link, sent = _link()
    _receive(link, 1)  # arms the timer
    link.state.stamp()  # a send carried the ack of message 1
    _receive(link, 2)  # 2 and 3 came after the timer was armed
    _fire(link)
    assert sent == [] and link._ack_timer is not None  # re-armed, nothing written
    _fire(link)  # 2 and 3 have now waited a whole ack_delay: acked
    assert sent == [[ACK, 3]] and link._ack_timer is None


async def test_a_message_older_than_the_timer_is_acked_even_after_a_piggyback() -> None:
    link, sent = _link()
    _receive(link, 1)
    link.state.stamp()
    _receive(link, 1)
    _fire(link)  # re-armed: message 2 came after the timer
    _receive(link, 1)  # message 3 after the re-arm; 2 is older than the new timer
    _fire(link)
    assert sent == [[ACK, 3]]


async def test_nothing_owed_sends_nothing() -> None:
    link, sent = _link()
    _receive(link, 2)
    link.state.stamp()  # both acked by a send
    _fire(link)
    assert sent == [] and link._ack_timer is None


async def test_a_big_message_is_acked_at_once_when_nothing_more_is_arriving() -> None:
    """A big send that waits for its ack (a writable buffer) sends nothing more meanwhile."""
    link, sent = _link(more_inbound=[False])
    _receive(link, 1, BIG_MESSAGE)
    assert sent == [[ACK, 1]] and link._ack_timer is None


async def test_a_stream_of_big_messages_is_acked_once_per_few() -> None:
    more = [True]
    link, sent = _link(more_inbound=more)
    per = STREAM_ACK_BYTES // BIG_MESSAGE
    _receive(link, 1, BIG_MESSAGE)
    assert sent == [] and link._ack_timer is not None  # deferred, but bounded by the timer
    for _ in range(per - 2):
        _receive(link, 1, BIG_MESSAGE)
    assert sent == []
    _receive(link, 1, BIG_MESSAGE)  # STREAM_ACK_BYTES owed: acked although more is coming
    assert sent == [[ACK, per]] and link._ack_timer is None
    _receive(link, 1, BIG_MESSAGE)
    more[0] = False  # the stream paused: what is owed is acked with the next delivery
    _receive(link, 1, 64)
    assert sent == [[ACK, per], [ACK, per + 2]]
    assert link.acks_sent == 2  # what node.stats() reports (LinkStats.acks_sent)


async def test_a_deferred_ack_of_a_big_message_goes_out_when_the_timer_fires() -> None:
    link, sent = _link(more_inbound=[True])
    _receive(link, 1, BIG_MESSAGE)
    _fire(link)
    assert sent == [[ACK, 1]]


async def test_a_connection_without_the_hint_acks_big_messages_at_once() -> None:
    link, sent = _link()  # a transport (or double) without more_inbound()
    _receive(link, 1, BIG_MESSAGE)
    assert sent == [[ACK, 1]]
