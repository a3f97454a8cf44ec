"""Small arrays in the latency-bound algorithms travel as their raw bytes: the receiver
rebuilds them from the dtype and shape every rank holds, and refuses bytes that do not fit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aionet.collectives.small import RAW_MAX, RawDecoder
from aionet.errors import CollectiveError

DTYPES = ["int8", "uint16", "int32", "int64", "float16", "float32", "float64", "complex64", "bool"]


@given(st.sampled_from(DTYPES), st.integers(0, 16), st.data())
def test_round_trip_keeps_every_bit(dtype: str, n: int, data: st.DataObject) -> None:
    raw = data.draw(st.binary(min_size=n * np.dtype(dtype).itemsize, max_size=n * np.dtype(dtype).itemsize))
    x = np.frombuffer(raw, dtype) if dtype != "bool" else np.frombuffer(raw, np.uint8).astype(bool)
    dec = RawDecoder(x.dtype, x.shape)
    out = dec(dec.encode(x))
    assert out.dtype == x.dtype and out.shape == x.shape
    assert out.tobytes() == x.tobytes()


def test_bytes_of_another_size_raise_a_collective_error_naming_the_fix() -> None:
    dec = RawDecoder(np.dtype("float32"), (4,))
    with pytest.raises(CollectiveError, match="same shape and dtype on every rank"):
        dec(RawDecoder(np.dtype("float32"), (3,)).encode(np.zeros(3, np.float32)))


@pytest.mark.parametrize(
    ("mine", "theirs"),
    [
        (np.zeros(4, np.float32), np.zeros(2, np.float64)),  # 16 bytes each
        (np.asarray(1.5), np.asarray(1)),  # allreduce(1.5) on one rank, allreduce(1) on another
        (np.zeros(4, np.int32), np.zeros(4, np.float32)),
        (np.zeros(8, np.uint8), np.zeros(8, np.int8)),
    ],
)
def test_bytes_of_another_dtype_of_the_same_length_are_refused(mine: np.ndarray, theirs: np.ndarray) -> None:
    """Equal byte counts used to decode silently as this rank's dtype: garbage on every rank."""
    wire = RawDecoder(theirs.dtype, theirs.shape).encode(theirs)
    with pytest.raises(CollectiveError, match=f"{theirs.dtype} elements for this rank's {mine.dtype} array"):
        RawDecoder(mine.dtype, mine.shape)(wire)


def test_an_array_from_an_older_peer_passes_through_only_if_it_fits() -> None:
    x = np.arange(3, dtype=np.int32)
    assert np.shares_memory(RawDecoder(x.dtype, x.shape)(x), x)
    # a peer that compressed this call sends float16 arrays: they were reduced in silently
    for other in (x.astype(np.float16), x[:2], "text"):
        with pytest.raises(CollectiveError, match="compression"):
            RawDecoder(x.dtype, x.shape)(other)


def test_the_raw_bound_keeps_messages_on_the_links_inline_path() -> None:
    from aionet.core.link import _PLAIN_MAX

    assert RAW_MAX + 1 <= _PLAIN_MAX  # the array's bytes and the dtype byte
