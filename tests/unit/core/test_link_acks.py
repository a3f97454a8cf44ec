"""The link's standalone ACKs, fed directly (no sockets, no sleeps: the timer's callback is
run by hand). A message is acknowledged within ack_delay of the timer that saw it; what arrived
after a send already carried an ack gets a timer of its own instead of an ACK frame, so a
two-way stream (requests and replies, a collective's rounds) sends few standalone ACKs."""

import logging
from types import SimpleNamespace
from typing import Any

from aionet.codecs.envelope import ACK
from aionet.core.link import Link


def _link() -> tuple[Link, list[Any]]:
    sent: list[Any] = []
    link = Link(
        "b",
        dumps=lambda obj, compress=False: [obj],
        max_inflight_bytes=1 << 20,
        give_up_after=30.0,
        log=logging.getLogger("test"),
    )
    link.current = SimpleNamespace(conn=SimpleNamespace(send_nowait=lambda frames: sent.append(frames[0])))
    return link, sent


def _receive(link: Link, n: int) -> None:
    for _ in range(n):
        assert link.state.on_receive(link.state.recv_seq + 1)
    link.received(64 * n)


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
