"""The reliable-link bookkeeping, fed sequences directly (no sockets)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.core.link_state import LinkState
from aionet.errors import ProtocolError


def test_in_order_dup_and_gap():
    s = LinkState(100)
    assert s.on_receive(1) and s.on_receive(2)
    assert not s.on_receive(1) and not s.on_receive(2)
    with pytest.raises(ProtocolError, match="gap"):
        s.on_receive(4)


def test_acks_free_bytes_and_backpressure():
    s = LinkState(max_inflight_bytes=100)
    for _ in range(3):
        seq, _ack = s.stamp()
        s.record(seq, [b"x"], 40)
    assert s.inflight_bytes == 120
    assert not s.can_send(1)
    assert s.on_ack(2) == 80
    assert s.can_send(60) and not s.can_send(61)
    assert s.on_ack(2) == 0  # stale ack
    with pytest.raises(ProtocolError):
        s.on_ack(10)
    assert [r[0] for r in s.replay()] == [3]


def test_oversized_message_passes_when_idle():
    s = LinkState(max_inflight_bytes=10)
    assert s.can_send(1000)


@settings(max_examples=300)
@given(n=st.integers(1, 100), actions=st.lists(st.sampled_from(["send", "deliver", "cut", "ack"]), max_size=400))
def test_exactly_once_in_order_across_cuts(n, actions):
    """Model: a sender, a receiver and a connection that may die at any moment, losing
    whatever it still carries. After replaying, the receiver has delivered 1..n once, in order."""
    tx, rx = LinkState(1 << 30), LinkState(1 << 30)
    delivered: list[int] = []
    wire: list[int] = []
    sent = 0

    def deliver_one():
        seq = wire.pop(0)
        if rx.on_receive(seq):
            delivered.append(seq)

    for action in actions:
        if action == "send" and sent < n:
            seq, _ = tx.stamp()
            tx.record(seq, [seq], 1)
            wire.append(seq)
            sent += 1
        elif action == "deliver" and wire:
            deliver_one()
        elif action == "cut":
            wire = [seq for seq, _f, _b in tx.replay()]  # lost in flight; resend unacked
        elif action == "ack":
            tx.on_ack(rx.acked_now())
    while sent < n:
        seq, _ = tx.stamp()
        tx.record(seq, [seq], 1)
        wire.append(seq)
        sent += 1
    while wire:
        deliver_one()
    assert delivered == list(range(1, n + 1))
    tx.on_ack(rx.acked_now())
    assert tx.inflight_bytes == 0 and not tx.replay()


def test_unreceive_gives_a_message_back_until_it_is_delivered():
    """A message that could not be delivered yet (full mailbox) is not counted, nor acknowledged."""
    s = LinkState(100)
    assert s.on_receive(1) and s.on_receive(2)
    s.unreceive(2)
    assert s.recv_seq == 1 and s.ack_owed == 1
    assert s.on_receive(2)  # delivered on the next try
    assert not s.on_receive(2)
