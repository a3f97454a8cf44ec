"""The layout of a ucx:// message with out-of-line frames: the receiver allocates what it
announces, so any bytes must yield either a layout within the limits or a ProtocolError, before
anything is allocated. Pure: no ucxx needed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aionet.config import LimitsSection
from aionet.errors import FrameTooLarge, ProtocolError, TooManyFrames
from aionet.transports.ucx import _INLINE, _LAYOUT, _OOL_DEVICE, _OOL_HOST, split_layout

LIMITS = LimitsSection(max_frame_bytes=1 << 20, max_message_bytes=3 << 20, max_frames=8)
entries = st.lists(st.tuples(st.integers(0, 255), st.integers(0, 2**64 - 1)), max_size=12)


def pack(layout: list[tuple[int, int]]) -> bytes:
    return b"".join(_LAYOUT.pack(w, n) for w, n in layout)


@given(st.binary(max_size=200), st.integers(0, 20))
def test_any_bytes_give_a_checked_layout_or_a_protocol_error(raw: bytes, inline: int) -> None:
    try:
        layout = split_layout(raw, inline, LIMITS)
    except ProtocolError:
        return
    assert len(layout) <= LIMITS.max_frames
    assert sum(1 for w, _ in layout if w == _INLINE) == inline
    assert all(w in (_INLINE, _OOL_HOST, _OOL_DEVICE) and n <= LIMITS.max_frame_bytes for w, n in layout)
    assert sum(n for _, n in layout) <= LIMITS.max_message_bytes


@given(entries, st.integers(0, 20))
def test_well_formed_layouts_are_judged_by_their_contents(layout: list[tuple[int, int]], inline: int) -> None:
    ok = (
        len(layout) <= LIMITS.max_frames
        and all(w in (_INLINE, _OOL_HOST, _OOL_DEVICE) for w, _ in layout)
        and sum(1 for w, _ in layout if w == _INLINE) == inline
        and all(n <= LIMITS.max_frame_bytes for _, n in layout)
        and sum(n for _, n in layout) <= LIMITS.max_message_bytes
    )
    if ok:
        assert split_layout(pack(layout), inline, LIMITS) == layout
    else:
        with pytest.raises(ProtocolError):
            split_layout(pack(layout), inline, LIMITS)


def test_each_limit_names_its_setting() -> None:
    with pytest.raises(FrameTooLarge, match="limits.max_frame_bytes"):
        split_layout(pack([(_OOL_DEVICE, 2 << 20)]), 0, LIMITS)
    with pytest.raises(FrameTooLarge, match="limits.max_message_bytes"):
        split_layout(pack([(_OOL_HOST, 1 << 20)] * 4), 0, LIMITS)
    with pytest.raises(TooManyFrames, match="limits.max_frames"):
        split_layout(pack([(_OOL_HOST, 1)] * 9), 0, LIMITS)
    with pytest.raises(ProtocolError, match="malformed"):
        split_layout(b"\x01" * (_LAYOUT.size + 1), 0, LIMITS)
    assert split_layout(b"", 0, LIMITS) == []
