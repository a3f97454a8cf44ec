"""Batched SEND envelopes (codecs/batch.py): assembled from packed payloads, they must be the
very msgpack array ``[SEND, seq, ack, channel, *payloads]`` that the receiver decodes."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aionet.codecs.batch import array_header, encode_send_batch
from aionet.codecs.envelope import SEND
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
