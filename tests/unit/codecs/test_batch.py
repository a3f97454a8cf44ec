"""Batched SEND, REQ and REP envelopes (codecs/batch.py): assembled from packed payloads, they
must be the very msgpack array ``[SEND, seq, ack, channel, *payloads]`` (``[REQ, seq, ack,
rid, service, payload, ...]``, ``[REP, seq, ack, rid, payload, ...]``) that the receiver decodes."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aionet.codecs.batch import array_header, encode_rpc_batch, encode_send_batch, rpc_items
from aionet.codecs.envelope import REP, REQ, SEND
from aionet.codecs.serialize import Serializer
from aionet.errors import ProtocolError

pack = msgpack.Packer(use_bin_type=True, strict_types=True, datetime=False).pack

plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 255, 0xFFFF, 0x10000, 2**32 - 1])
def test_array_header_is_msgpacks_own(n: int) -> None:
    """At every boundary between fixarray, array16 and array32."""
    if n <= 0x10000:
        assert array_header(n) == pack([None] * n)[: len(array_header(n))]
    u = msgpack.Unpacker()
    u.feed(array_header(n))
    assert u.read_array_header() == n


def test_array_header_refuses_what_msgpack_cannot_hold() -> None:
    with pytest.raises(ValueError, match="2\\*\\*32"):
        array_header(2**32)


@given(
    payloads=st.lists(plain, min_size=1, max_size=40),
    seq=st.integers(1, 2**63),
    ack=st.integers(0, 2**63),
    channel=st.text(max_size=30),
)
def test_batch_decodes_to_the_envelope_it_stands_for(payloads, seq, ack, channel) -> None:
    frame = encode_send_batch(pack, seq, ack, channel, [pack(p) for p in payloads])
    assert frame == pack([SEND, seq, ack, channel, *payloads])
    env = Serializer().loads([frame])  # what the receiving node's dispatcher sees
    assert env == [SEND, seq, ack, channel, *payloads]


@given(st.lists(plain, min_size=1, max_size=20), st.data())
def test_a_truncated_batch_is_a_decode_error_never_a_short_batch(payloads, data) -> None:
    """A frame cut anywhere must not decode as a batch with fewer payloads."""
    frame = encode_send_batch(pack, 1, 0, "c", [pack(p) for p in payloads])
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(ProtocolError):
        Serializer().loads([frame[:cut]])


# ---------------------------------------------------------------- requests and replies
requests = st.lists(st.tuples(st.integers(0, 2**63), st.text(max_size=12), plain), min_size=1, max_size=40)


@given(reqs=requests, seq=st.integers(1, 2**63), ack=st.integers(0, 2**63))
def test_a_request_batch_decodes_to_the_envelope_it_stands_for(reqs, seq, ack) -> None:
    """Each request packed as its field list without the list's header, as the link does."""
    frame = encode_rpc_batch(pack, REQ, seq, ack, [pack(list(r))[1:] for r in reqs])
    flat = [x for r in reqs for x in r]
    assert frame == pack([REQ, seq, ack, *flat])
    env = Serializer().loads([frame])
    assert env == [REQ, seq, ack, *flat]
    assert rpc_items(env) == len(reqs)


@given(reps=st.lists(st.tuples(st.integers(0, 2**63), plain), min_size=1, max_size=40), seq=st.integers(1, 2**63))
def test_a_reply_batch_decodes_to_the_envelope_it_stands_for(reps, seq) -> None:
    frame = encode_rpc_batch(pack, REP, seq, 3, [pack(list(r))[1:] for r in reps])
    env = Serializer().loads([frame])
    assert env == [REP, seq, 3, *(x for r in reps for x in r)]
    assert rpc_items(env) == len(reps)


def test_one_request_or_reply_is_the_envelope_an_older_node_sends() -> None:
    """So a batch of one needs no feature, and a node that never batches reads every batch of one."""
    assert encode_rpc_batch(pack, REQ, 5, 2, [pack([9, "svc", b"x"])[1:]]) == pack([REQ, 5, 2, 9, "svc", b"x"])
    assert encode_rpc_batch(pack, REP, 5, 2, [pack([9, None])[1:]]) == pack([REP, 5, 2, 9, None])


@pytest.mark.parametrize(
    "env",
    [[REQ, 1, 0], [REQ, 1, 0, 7, "svc"], [REQ, 1, 0, 7, "svc", 1, 8], [REP, 1, 0], [REP, 1, 0, 7, 1, 8]],
)
def test_an_envelope_that_holds_no_whole_number_of_items_is_refused(env) -> None:
    """A peer's malformed batch is a protocol error (the dispatcher closes the connection)."""
    with pytest.raises(ValueError):
        rpc_items(env)


@given(st.lists(st.tuples(st.integers(0, 2**32), plain), min_size=1, max_size=20), st.data())
def test_a_truncated_reply_batch_is_a_decode_error_never_a_short_batch(reps, data) -> None:
    frame = encode_rpc_batch(pack, REP, 1, 0, [pack(list(r))[1:] for r in reps])
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(ProtocolError):
        Serializer().loads([frame[:cut]])
