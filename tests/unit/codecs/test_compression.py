"""aionet.codecs.compression: per-buffer lz4 with an incompressibility check and bomb guards."""

from __future__ import annotations

import os

import lz4.block
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.codecs.compression import (
    LZ4,
    LZ4_MAX_EXPANSION,
    SAMPLE_BYTES,
    SAMPLE_POINTS,
    compress_buffer,
    decompress,
    is_compressible,
)
from aionet.errors import DecodeError, ProtocolError

GiB = 2**30


def test_round_trip_compressible() -> None:
    raw = b"the quick brown fox jumps over the lazy dog. " * 5000
    res = compress_buffer(raw)
    assert res is not None
    codec, data = res
    assert codec == LZ4
    assert len(data) < len(raw) // 10
    out = decompress(codec, data, len(raw), max_bytes=GiB)
    assert type(out) is bytearray  # writable: numpy arrays built on it are writable
    assert out == raw


def test_accepts_typed_memoryviews_without_copy_on_input() -> None:
    arr = np.zeros((256, 64), dtype=np.float64)
    arr[::7] = 1.5
    res = compress_buffer(memoryview(arr))
    assert res is not None
    out = decompress(res[0], res[1], arr.nbytes, max_bytes=GiB)
    np.testing.assert_array_equal(np.frombuffer(out, np.float64).reshape(arr.shape), arr)


def test_random_data_is_not_compressed() -> None:
    raw = os.urandom(4 * 2**20)
    assert not is_compressible(raw)
    assert compress_buffer(raw) is None


def test_sample_sees_more_than_the_start() -> None:
    # Compressible head, random remainder: the samples from the middle and end must veto it.
    raw = bytes(SAMPLE_BYTES) + os.urandom(4 * 2**20)
    assert compress_buffer(raw) is None


def test_sample_of_mostly_random_buffer_then_full_check() -> None:
    # Buffers small enough to be sampled whole are judged exactly.
    small = os.urandom(SAMPLE_BYTES * SAMPLE_POINTS - 1)
    assert not is_compressible(small)
    assert is_compressible(bytes(1000))


def test_empty_and_unknown_codec() -> None:
    assert compress_buffer(b"") is None
    assert not is_compressible(b"")
    with pytest.raises(ValueError, match="unknown compression codec"):
        compress_buffer(b"x" * 100000, "zstd")
    assert decompress(LZ4, b"", 0, max_bytes=10) == bytearray()


def test_bomb_claiming_a_terabyte_is_rejected_before_allocating() -> None:
    data = lz4.block.compress(bytes(2**16), store_size=False)
    with pytest.raises(DecodeError, match="exceeds"):
        decompress(LZ4, data, 2**40, max_bytes=16 * GiB)


def test_claim_beyond_lz4_expansion_is_rejected() -> None:
    # Under the configured limit, but no lz4 block of this size can expand that far.
    data = lz4.block.compress(bytes(2**16), store_size=False)
    claim = len(data) * LZ4_MAX_EXPANSION * 4
    assert claim < 16 * GiB
    with pytest.raises(DecodeError, match="decompression bomb"):
        decompress(LZ4, data, claim, max_bytes=16 * GiB)


def test_claim_above_limit() -> None:
    raw = bytes(2**20)
    data = lz4.block.compress(raw, store_size=False)
    with pytest.raises(DecodeError, match="max_frame_bytes"):
        decompress(LZ4, data, len(raw), max_bytes=len(raw) - 1)


@pytest.mark.parametrize("raw_len", [-1, "10", 1.5, None, True])
def test_bad_raw_length(raw_len: object) -> None:
    with pytest.raises(DecodeError):
        decompress(LZ4, b"\x00" * 10, raw_len, max_bytes=GiB)  # type: ignore[arg-type]


def test_wrong_raw_length_is_caught() -> None:
    raw = b"abc" * 10000
    data = lz4.block.compress(raw, store_size=False)
    for claim in (len(raw) - 1, len(raw) + 1, 1):
        with pytest.raises(DecodeError):
            decompress(LZ4, data, claim, max_bytes=GiB)


def test_unknown_codec_and_non_buffer() -> None:
    with pytest.raises(DecodeError, match="codec"):
        decompress("zstd", b"abc", 3, max_bytes=GiB)
    with pytest.raises(DecodeError, match="not a buffer"):
        decompress(LZ4, "text", 3, max_bytes=GiB)  # type: ignore[arg-type]
    with pytest.raises(DecodeError):
        decompress(LZ4, b"abc", 0, max_bytes=GiB)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), raw_len=st.integers(min_value=-10, max_value=100000))
def test_garbage_never_escapes_as_another_error(data: bytes, raw_len: int) -> None:
    try:
        out = decompress(LZ4, data, raw_len, max_bytes=2**20)
    except ProtocolError:
        return
    assert type(out) is bytearray and len(out) == raw_len


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(min_size=1, max_size=5000), reps=st.integers(1, 50))
def test_round_trip_property(raw: bytes, reps: int) -> None:
    buf = raw * reps
    res = compress_buffer(buf)
    if res is None:
        return
    assert len(res[1]) <= 0.9 * len(buf)
    assert decompress(res[0], res[1], len(buf), max_bytes=len(buf)) == buf
