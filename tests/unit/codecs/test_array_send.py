"""The array short road (codecs/array_send.py): the sender's frames are byte for byte the
serializer's, the receiver reads back what the general decoder reads, anything it does not take
is left to the general path (None), and hostile bytes give None or a DecodeError, nothing else."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.codecs.array_send import MAX_KEY, decode_array_send, encode_array_send, split_array_send
from aionet.codecs.envelope import SEND
from aionet.codecs.peek import peek_send_array
from aionet.codecs.serialize import Serializer
from aionet.errors import DecodeError, ProtocolError

OOB_MIN = 16
SER = Serializer(oob_min_bytes=OOB_MIN)
PACK = msgpack.Packer(use_bin_type=True, strict_types=True, datetime=False).pack  # as the link's
MAX_FRAME = SER.short_frame_bytes
DTYPES = ["float32", "float64", "int8", "int64", "uint16", "complex64", "bool", ">f4", "<i2", "datetime64[ns]"]
DTYPES += ["f4,i2"]  # a structured dtype (its wire form is a description, not a str)

keys = st.lists(
    st.one_of(st.integers(-(2**63), 2**64 - 1), st.text(max_size=12)),
    min_size=0,  # none: the array alone is the payload (node.send(peer, channel, array))
    max_size=MAX_KEY,
)
shapes = st.lists(st.integers(1, 7), min_size=1, max_size=3)


def array(dtype: str, shape: list[int], seed: int) -> np.ndarray:
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) * dt.itemsize
    raw = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    if dt.kind == "M":
        raw[:] = 0  # valid datetimes
    return raw.view(dt).reshape(shape)


def encode(seq: int, ack: int, channel: str, payload: list[Any]) -> list[Any] | None:
    return encode_array_send(PACK, seq, ack, channel, payload, SER.dtypes, OOB_MIN)


@settings(max_examples=300, deadline=None)
@given(
    key=keys,
    dtype=st.sampled_from(DTYPES),
    shape=shapes,
    seq=st.integers(0, 2**40),
    ack=st.integers(0, 2**40),
    channel=st.text(max_size=40),
    seed=st.integers(0, 1000),
)
def test_frames_are_the_serializers_and_read_back_as_the_general_decoder_reads_them(
    key: list[Any], dtype: str, shape: list[int], seq: int, ack: int, channel: str, seed: int
) -> None:
    a = array(dtype, shape, seed)
    if a.nbytes < OOB_MIN:
        a = np.concatenate([a.reshape(-1)] * (OOB_MIN // a.nbytes + 1)).reshape(-1)
    payload: Any = [*key, a] if key else a
    frames = encode(seq, ack, channel, payload)
    assert frames is not None
    general = SER.dumps([SEND, seq, ack, channel, payload], compress=False)
    assert len(frames) == len(general) == 2
    assert bytes(frames[0]) == bytes(general[0])  # same header bytes: any peer reads them as always
    assert bytes(frames[1]) == bytes(general[1])
    for frame in (bytearray(frames[1]), bytes(frames[1]), memoryview(bytearray(frames[1]))):
        env = decode_array_send(frames[0], frame, SER.dtypes, MAX_FRAME)
        assert env is not None
        want = SER.loads([frames[0], bytearray(frames[1])])
        assert env[:4] == want[:4] == [SEND, seq, ack, channel]
        if key:
            assert env[4][:-1] == want[4][:-1] == key
            got, ref = env[4][-1], want[4][-1]
        else:
            got, ref = env[4], want[4]
        assert type(got) is type(ref) is np.ndarray
        assert got.dtype == ref.dtype == a.dtype and got.shape == ref.shape == a.shape
        assert got.tobytes() == a.tobytes()
        assert got.flags.writeable  # a read-only frame is copied, as the general decoder does
    assert peek_send_array(frames[0], 1) == ((channel, tuple(key)) if key else None)  # keyed ones only


def test_the_array_views_a_writable_frame_without_a_copy() -> None:
    a = np.arange(64, dtype=np.float32)
    frames = encode(1, 0, "c", [3, 7, 1, a])
    assert frames is not None
    place = bytearray(frames[1])
    env = decode_array_send(frames[0], memoryview(place), SER.dtypes, MAX_FRAME)
    assert env is not None
    got = env[4][-1]
    got[0] = 42.0
    assert np.frombuffer(place, np.float32)[0] == 42.0  # the receive-into place itself


@pytest.mark.parametrize(
    "payload",
    [
        [1, np.arange(3, dtype=np.float32)],  # below the out-of-band threshold: inline in the header
        [1, np.zeros((8, 8), np.float32, order="F")],  # Fortran order
        [1, np.arange(64, dtype=np.float32)[::2]],  # not contiguous
        [True, np.zeros(64, np.float32)],  # a bool key (not a plain int)
        [2**70, np.zeros(64, np.float32)],  # an int beyond 64 bits (the serializer's extension)
        [1.5, np.zeros(64, np.float32)],  # a float key
        [b"k", np.zeros(64, np.float32)],  # a bytes key
        [*range(MAX_KEY + 1), np.zeros(64, np.float32)],  # too many key items
        [np.zeros(64, np.float32)],  # no key
        [1, np.ma.zeros(64, np.float32)],  # an ndarray subclass
        [1, np.zeros(64, object)],  # not raw memory
        [1, [np.zeros(64, np.float32)]],  # not an array
        np.zeros((8, 8), np.float32, order="F"),  # bare, Fortran order
        np.arange(3, dtype=np.float32),  # bare, inline
    ],
)
def test_the_sender_leaves_anything_else_to_the_serializer(payload: Any) -> None:
    assert encode(1, 0, "c", payload) is None


def general_frames(payload: list[Any], compress: bool = False, ser: Serializer = SER) -> list[Any]:
    return ser.dumps([SEND, 1, 0, "c", payload], compress=compress)


@pytest.mark.parametrize(
    "frames",
    [
        general_frames([1, np.zeros((8, 8), np.float32, order="F")]),  # Fortran order
        general_frames([(1, 2), np.zeros(64, np.float32)]),  # a tuple key (an extension record)
        general_frames([1, np.zeros(64, np.float32), 2]),  # the array is not last
        general_frames([1, bytearray(64)]),  # not an array
        general_frames([1, np.zeros(64, "V0")]) if np.dtype("V0").itemsize == 0 else [b"\x90", b""],
        [SER.dumps([SEND, 1, 0, "c", [1, 2]])[0], bytearray(8)],  # a header with no array
        [b"\xc1", bytearray(8)],  # not msgpack
    ],
)
def test_the_receiver_leaves_anything_else_to_the_general_path(frames: list[Any]) -> None:
    frame = frames[1] if len(frames) > 1 else bytearray()
    assert decode_array_send(frames[0], bytearray(frame), SER.dtypes, MAX_FRAME) is None


def test_compressed_frames_take_the_general_path() -> None:
    ser = Serializer(oob_min_bytes=OOB_MIN, compression="lz4", compress_min_bytes=16)
    frames = general_frames([1, np.zeros(1 << 14, np.float32)], compress=True, ser=ser)
    assert decode_array_send(frames[0], bytearray(frames[1]), ser.dtypes, MAX_FRAME) is None


def test_a_frame_beyond_the_bound_takes_the_general_path() -> None:
    frames = encode(1, 0, "c", [1, np.zeros(64, np.float32)])
    assert frames is not None
    assert decode_array_send(frames[0], bytearray(frames[1]), SER.dtypes, 255) is None


def header_with(meta: list[Any]) -> bytes:
    rec = msgpack.ExtType(7, msgpack.packb(meta))
    return msgpack.packb([SEND, 1, 0, "c", [1, 2, rec]])


@pytest.mark.parametrize(
    ("meta", "frame_len", "why"),
    [
        (["<f4", [10], False, 1], 8, "needs 40 bytes"),  # the shape says more than the frame holds
        (["<f4", [1, 2**40], False, 1], 8, "needs"),  # a huge shape: nothing allocated, refused
        (["<f4", [-1], False, 1], 8, "bad array shape"),
        (["<f4", "x", False, 1], 8, "malformed array record"),
        (["<f4", [1] * 65, False, 1], 4, "malformed array record"),
        (["O", [2], False, 1], 16, "bad dtype"),  # object dtype
        (["no such dtype", [2], False, 1], 16, "dtype"),
    ],
)
def test_a_malformed_array_record_is_a_decode_error(meta: list[Any], frame_len: int, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        decode_array_send(header_with(meta), bytearray(frame_len), SER.dtypes, MAX_FRAME)
    with pytest.raises(ProtocolError):  # the general decoder refuses it too
        SER.loads([header_with(meta), bytearray(frame_len)])


def valid_frames(bare: bool) -> list[Any]:
    a = np.arange(40, dtype=np.int32).reshape(5, 8)
    frames = encode(5, 4, "aionet.coll/g#0.abc", a if bare else [7, 1 << 44, 2, a])
    assert frames is not None
    return frames


@settings(max_examples=500, deadline=None)
@given(data=st.data())
def test_hostile_headers_give_none_or_a_decode_error_and_agree_with_the_general_decoder(data: Any) -> None:
    frames = valid_frames(data.draw(st.booleans()))
    header = bytearray(frames[0])
    for _ in range(data.draw(st.integers(0, 2))):  # 0: only the frame is cut (a size mismatch)
        i = data.draw(st.integers(0, len(header) - 1))
        header[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        header = header[: data.draw(st.integers(0, len(header)))]
    header = bytes(header)
    frame = bytearray(frames[1])
    if data.draw(st.booleans()):
        frame = frame[: data.draw(st.integers(0, len(frame)))]
    try:
        env = decode_array_send(header, frame, SER.dtypes, MAX_FRAME)
    except DecodeError:
        with pytest.raises(ProtocolError):
            SER.loads([header, bytearray(frame)])
        return
    if env is not None:  # what the short road takes, the general decoder reads alike
        want = SER.loads([header, bytearray(frame)])
        assert env[:4] == want[:4]
        got, ref = env[4], want[4]
        if type(got) is list:
            assert got[:-1] == ref[:-1]
            got, ref = got[-1], ref[-1]
        assert got.dtype == ref.dtype and np.array_equal(got, ref)


@settings(max_examples=500, deadline=None)
@given(header=st.binary(max_size=200), frame=st.binary(max_size=64))
def test_random_bytes_never_raise_anything_but_a_decode_error(header: bytes, frame: bytes) -> None:
    assert split_array_send(header) is None or isinstance(split_array_send(header), tuple)
    try:
        decode_array_send(header, bytearray(frame), SER.dtypes, MAX_FRAME)
    except DecodeError:
        pass
