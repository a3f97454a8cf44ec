"""aionet.collectives.empty_aligned and friends: arrays for the kernel to receive into, on the
boundary asked for, with the shape, dtype and size asked for, and a clear error otherwise."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aionet.collectives import empty_aligned, empty_like_aligned, is_aligned

DTYPES = ["uint8", "int16", "int32", "int64", "float16", "float32", "float64", "complex128", "bool"]


@given(
    shape=st.lists(st.integers(0, 7), max_size=3).map(tuple),
    dtype=st.sampled_from(DTYPES),
    align=st.sampled_from([1, 2, 8, 16, 64, 4096]),
)
def test_the_array_starts_on_the_boundary_and_is_the_array_asked_for(
    shape: tuple[int, ...], dtype: str, align: int
) -> None:
    a = empty_aligned(shape, dtype, align=align)
    assert a.shape == shape and a.dtype == np.dtype(dtype)
    assert a.size == 0 or (a.ctypes.data % align == 0 and is_aligned(a, align))  # empty: no first byte
    assert a.flags.c_contiguous and a.flags.writeable
    assert a.nbytes == int(np.prod(shape)) * np.dtype(dtype).itemsize
    a[...] = 1  # every element is writable memory of its own
    assert bool((a == 1).all())


def test_an_int_shape_and_the_defaults_a_page_and_float32() -> None:
    a = empty_aligned(1000)
    assert a.shape == (1000,) and a.dtype == np.float32 and a.ctypes.data % 4096 == 0


def test_two_arrays_never_share_memory() -> None:
    a, b = empty_aligned(100), empty_aligned(100)
    a[:] = 1
    b[:] = 2
    assert not np.may_share_memory(a, b) and bool((a == 1).all())


def test_like_takes_shape_and_dtype_and_gives_c_order() -> None:
    x = np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 4))
    y = empty_like_aligned(x)
    assert y.shape == (3, 4) and y.dtype == np.int64 and y.flags.c_contiguous and is_aligned(y)


def test_is_aligned_tells_an_offset_view_apart() -> None:
    a = empty_aligned(2048, np.float32)  # on a page by default
    assert is_aligned(a) and not is_aligned(a[1:]) and not is_aligned(a[16:]) and is_aligned(a[1024:])
    assert is_aligned(a[16:], 64) and not is_aligned(a[4:], 64)  # 64 and 16 bytes in


@pytest.mark.parametrize("align", [0, -64, 3, 48])
def test_an_alignment_that_is_not_a_power_of_two_is_refused(align: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        empty_aligned(10, align=align)
