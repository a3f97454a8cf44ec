"""When the link writes its acks (fed directly: no sockets). The sender of a message of
BIG_MESSAGE bytes or more waits for its ack before its next send, so that ack is written at
once, not at the end of the loop iteration (after the consumer its delivery woke has run)."""

import logging
from types import SimpleNamespace
from typing import Any

import msgpack

from aionet.codecs.envelope import ACK
from aionet.core.link import BIG_MESSAGE, Link


class Conn:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    def send_nowait(self, frames: list[bytes]) -> None:
        self.calls.append(msgpack.unpackb(frames[0]))

    def flush(self) -> None:
        self.calls.append("flush")


def _link() -> tuple[Link, Conn]:
    link = Link(
        "b",
        dumps=lambda obj, compress=False: [msgpack.packb(obj, use_bin_type=True)],
        max_inflight_bytes=1 << 30,
        give_up_after=30.0,
        log=logging.getLogger("test"),
    )
    conn = Conn()
    link.current = SimpleNamespace(conn=conn)
    return link, conn


async def test_a_big_delivery_is_acked_and_flushed_at_once() -> None:
    link, conn = _link()
    assert link.state.on_receive(1)
    link.received(BIG_MESSAGE)
    assert conn.calls == [[ACK, 1], "flush"]


async def test_small_deliveries_wait_for_the_ack_timer_and_the_batch() -> None:
    link, conn = _link()
    assert link.state.on_receive(1)
    link.received(100)
    assert conn.calls == []  # acked within ack_delay, riding on traffic meanwhile
    link.flush_ack()
    assert conn.calls == [[ACK, 1]]  # queued into this iteration's write, not flushed alone
