"""Frames are counted by the bytes they hold, whatever a transport hands over: host buffers,
numpy arrays, CuPy arrays, and UCX's own device buffer types, which expose only a
``__cuda_array_interface__`` (no ``len``, no ``nbytes``: found on a GPU machine, where every
device frame over ucx:// was refused as a bad message)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aionet.codecs.decoder import _frame_len
from aionet.codecs.framing import frame_nbytes
from aionet.core.link import nbytes_of
from aionet.errors import DecodeError


class BareDeviceBuffer:
    """Like ucxx's CCCLBufferWrapper: a device buffer with only the interface."""

    def __init__(self, shape: tuple[int, ...], typestr: str) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (0, False), "version": 3}


class ArrayLike:
    def __init__(self, nbytes: int, first_dim: int) -> None:
        self.nbytes, self._len = nbytes, first_dim
        self.__cuda_array_interface__ = {"shape": (first_dim,), "typestr": "<f4", "data": (0, False), "version": 3}

    def __len__(self) -> int:
        return self._len


@given(st.lists(st.integers(0, 64), max_size=3), st.sampled_from(["|u1", "<f4", "<f8", "<c16"]))
def test_a_bare_device_buffer_counts_shape_times_itemsize(shape: list[int], typestr: str) -> None:
    buf = BareDeviceBuffer(tuple(shape), typestr)
    want = int(np.prod(shape, dtype=np.int64)) * int(typestr[2:])
    assert frame_nbytes(buf) == want
    assert _frame_len(buf, 1)[1] == want


def test_every_kind_of_frame_is_counted_in_bytes() -> None:
    a = np.zeros((10, 3), np.float32)
    frames = [b"abc", bytearray(5), memoryview(a), a, ArrayLike(400, 100), BareDeviceBuffer((7,), "<f8")]
    assert [frame_nbytes(f) for f in frames] == [3, 5, 120, 120, 400, 56]
    assert nbytes_of(frames) == 3 + 5 + 120 + 120 + 400 + 56  # not len(): a float32 array's len is its rows


def test_a_device_buffer_without_a_usable_size_is_a_decode_error() -> None:
    class Broken:
        __cuda_array_interface__ = {"shape": "?", "typestr": ""}

    with pytest.raises(DecodeError, match="device buffer without a size"):
        _frame_len(Broken(), 2)
