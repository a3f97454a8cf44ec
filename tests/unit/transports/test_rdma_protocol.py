"""The sans-I/O RDMA protocol on the CPU: credits, segmentation, reassembly, back-pressure.

A tiny wire model plays the QPs: every segment lands in one of the receiver's posted buffers,
and sending with no buffer posted is the RNR error real RC hardware would raise, so these
tests prove the credit scheme never lets a sender overrun its peer.
"""

from __future__ import annotations

import random
import struct

import pytest

from aionet.errors import DecodeError, FrameTooLarge, ProtocolError, TooManyFrames
from aionet.transports.rdma.protocol import SEG_HEADER, RdmaProtocol, SegmentFlags


class RNRError(AssertionError):
    pass


class Side:
    def __init__(self, proto: RdmaProtocol, posted: int, seg: int) -> None:
        self.p = proto
        self.posted = posted  # receive buffers currently posted on this side's QP
        self.seg = seg
        self.inbox: list[bytes] = []  # segments in flight towards this side
        self.finished: list[int] = []
        self.got: list[list[bytes]] = []


def pair(n_a=8, n_b=8, seg=64, **kw):
    a = Side(RdmaProtocol(recv_buffers=n_a, peer_recv_buffers=n_b, segment_bytes=seg, **kw), n_a, seg)
    b = Side(RdmaProtocol(recv_buffers=n_b, peer_recv_buffers=n_a, segment_bytes=seg, **kw), n_b, seg)
    return a, b


def transmit(src: Side, dst: Side, data: bytes) -> None:
    if dst.posted == 0:
        raise RNRError("send with no receive buffer posted at the peer")
    dst.posted -= 1
    dst.inbox.append(data)


def pump_send(src: Side, dst: Side) -> int:
    """Post every segment the protocol allows now. Returns segments posted."""
    n = 0
    buf = bytearray(src.seg)
    while True:
        r = src.p.fill(memoryview(buf))
        if r is None:
            ln = src.p.fill_control(memoryview(buf))
            if ln is None:
                return n
        else:
            ln, done = r
            if done is not None:
                src.finished.append(done)
        transmit(src, dst, bytes(buf[:ln]))
        n += 1


def deliver(dst: Side, read: bool = True, limit: int | None = None) -> int:
    n = 0
    while dst.inbox and (limit is None or n < limit):
        data = dst.inbox.pop(0)
        dst.p.on_receive(memoryview(data))
        dst.posted += 1  # reposted right after the payload was copied out
        n += 1
    if read:
        while (m := dst.p.next_message()) is not None:
            dst.got.append([bytes(f) for f in m])
            n += 1
    return n


def run(a: Side, b: Side, read_a=True, read_b=True, rounds=10_000) -> None:
    for _ in range(rounds):
        moved = pump_send(a, b) + pump_send(b, a) + deliver(b, read_b) + deliver(a, read_a)
        if not moved:
            return
    raise AssertionError("did not settle")


def test_small_and_empty_messages_round_trip():
    a, b = pair()
    msgs = [[b"hello"], [], [b""], [b"a", b"", b"bc"], [bytes(range(256)) * 3]]
    for m in msgs:
        a.p.queue(m)
    run(a, b)
    assert b.got == msgs
    assert a.finished == list(range(len(msgs)))


def test_large_message_is_segmented_and_reassembled():
    a, b = pair(seg=128)
    big = random.Random(1).randbytes(100_000)
    a.p.queue([b"hdr", big, memoryview(big)[7:5000]])
    run(a, b)
    assert b.got == [[b"hdr", big, big[7:5000]]]
    assert b.p.counts["segments_received"] > 100_000 // 128


def test_received_frames_are_writable_views():
    a, b = pair()
    a.p.queue([b"xyz" * 40])
    pump_send(a, b)
    deliver(b, read=False)
    (f,) = b.p.next_message()
    assert isinstance(f, memoryview) and not f.readonly


@pytest.mark.parametrize("seed", range(20))
def test_bidirectional_random_traffic_never_overruns(seed):
    rng = random.Random(seed)
    a, b = pair(n_a=rng.randint(3, 9), n_b=rng.randint(3, 9), seg=rng.choice([32, 64, 200]))
    sent_ab, sent_ba = [], []
    for _ in range(60):
        if rng.random() < 0.5:
            m = [rng.randbytes(rng.randint(0, 500)) for _ in range(rng.randint(0, 3))]
            a.p.queue(m)
            sent_ab.append(m)
        if rng.random() < 0.5:
            m = [rng.randbytes(rng.randint(0, 500)) for _ in range(rng.randint(0, 3))]
            b.p.queue(m)
            sent_ba.append(m)
        # partial, interleaved progress
        pump_send(a, b)
        deliver(b, read=rng.random() < 0.7, limit=rng.randint(0, 4))
        pump_send(b, a)
        deliver(a, read=rng.random() < 0.7, limit=rng.randint(0, 4))
    run(a, b)
    assert b.got == sent_ab
    assert a.got == sent_ba


def test_sender_stops_when_receiver_does_not_read_and_resumes():
    # recv_queue_bytes small: credits are withheld while unread messages pile up
    a, b = pair(n_a=4, n_b=4, seg=64, recv_queue_bytes=100)
    for i in range(50):
        a.p.queue([bytes([i]) * 50])
    run(a, b, read_b=False)
    assert a.p.has_pending_data  # back-pressured, not overrun (no RNRError raised)
    queued = len(b.p._ready)
    assert queued < 50
    run(a, b, read_b=True)
    assert len(b.got) == 50 and b.got[49] == [bytes([49]) * 50]


def test_one_way_stream_returns_credits_with_control_segments():
    a, b = pair(n_a=4, n_b=4)
    for i in range(200):
        a.p.queue([bytes([i % 256]) * 10])
    run(a, b)
    assert len(b.got) == 200
    assert b.p.counts["control_sent"] > 0
    # control updates are not answered by updates (no ping-pong)
    assert a.p.counts["control_sent"] <= 1


def test_fin_after_data():
    a, b = pair()
    a.p.queue([b"last words"])
    pump_send(a, b)
    buf = bytearray(64)
    ln = a.p.fill_fin(memoryview(buf))
    assert ln == SEG_HEADER.size
    transmit(a, b, bytes(buf[:ln]))
    deliver(b)
    assert b.got == [[b"last words"]] and b.p.fin_received
    with pytest.raises(ProtocolError):
        a.p.queue([b"more"])


def test_fin_waits_for_queued_data():
    a, b = pair(n_b=3)
    for _ in range(5):
        a.p.queue([b"x" * 60])
    pump_send(a, b)
    assert a.p.fill_fin(memoryview(bytearray(64))) is None  # data still queued


def seg(flags, credits=0, seq=0, payload=b""):
    return memoryview(SEG_HEADER.pack(flags, 1, credits, seq) + payload)


@pytest.mark.parametrize(
    "data, exc",
    [
        (memoryview(b"\x01"), DecodeError),
        (memoryview(SEG_HEADER.pack(SegmentFlags.FIRST, 9, 0, 0)), DecodeError),  # version
        (seg(SegmentFlags.FIRST, seq=5), DecodeError),  # sequence gap
        (seg(0, payload=b"abc"), DecodeError),  # continuation without first
        (seg(SegmentFlags.CONTROL, payload=b"x"), DecodeError),
        (seg(SegmentFlags.FIRST | SegmentFlags.LAST, payload=struct.pack("<IQ", 10**6, 0)), TooManyFrames),
        (seg(SegmentFlags.FIRST | SegmentFlags.LAST, payload=struct.pack("<IQ", 1, 1 << 40)), FrameTooLarge),
        (seg(SegmentFlags.FIRST | SegmentFlags.LAST, payload=struct.pack("<IQQ", 1, 4, 3) + b"abc"), DecodeError),
        (seg(SegmentFlags.FIRST | SegmentFlags.LAST, payload=struct.pack("<IQQ", 1, 2, 2) + b"abcd"), DecodeError),
        (seg(SegmentFlags.FIRST | SegmentFlags.LAST, payload=struct.pack("<IQQ", 1, 4, 4) + b"ab"), DecodeError),
        (memoryview(bytes(200)), FrameTooLarge),
    ],
)
def test_garbage_is_a_protocol_error(data, exc):
    p = RdmaProtocol(recv_buffers=4, peer_recv_buffers=4, segment_bytes=128, max_frames=100, max_message_bytes=1 << 20)
    with pytest.raises(exc):
        p.on_receive(data)


def test_limits_on_send_side():
    p = RdmaProtocol(recv_buffers=4, peer_recv_buffers=4, segment_bytes=128, max_frames=2, max_message_bytes=10)
    with pytest.raises(TooManyFrames):
        p.queue([b"", b"", b""])
    with pytest.raises(FrameTooLarge):
        p.queue([b"x" * 11])


def test_needs_three_buffers():
    with pytest.raises(ValueError):
        RdmaProtocol(recv_buffers=2, peer_recv_buffers=4, segment_bytes=128)
