"""``FrameDecoder.frame_remaining``: the bytes a transport may wait for before reading (a receive
low-water mark) are exactly those the large frame in progress still owes, never one more."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.codecs.framing import FrameDecoder, encode

LARGE = 256


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 6 * LARGE), min_size=1, max_size=5),
    cuts=st.lists(st.integers(1, 2 * LARGE), min_size=1, max_size=6),
)
def test_frame_remaining_is_what_the_large_frame_in_progress_still_owes(sizes: list[int], cuts: list[int]) -> None:
    dec = FrameDecoder(large_frame_bytes=LARGE, staging_bytes=4 * LARGE)
    msgs = [[b"h", bytes([i]) * n] for i, n in enumerate(sizes)]
    stream = b"".join(bytes(p) for m in msgs for p in encode(m))
    # where each large frame's payload starts and ends in the stream
    spans, pos = [], 0
    for m in msgs:
        start = pos + len(b"".join(bytes(p) for p in encode(m))) - len(m[1])
        pos = start + len(m[1])
        if len(m[1]) >= LARGE:
            spans.append((start, pos))
    got, pos, i = [], 0, 0
    while pos < len(stream):
        buf = dec.get_buffer(-1)
        k = min(len(buf), cuts[i % len(cuts)], len(stream) - pos)
        i += 1
        buf[:k] = stream[pos : pos + k]
        pos += k
        got.extend(dec.buffer_updated(k))
        owed = next((end - pos for start, end in spans if start <= pos < end), 0)
        assert dec.frame_remaining == owed  # exactly what the frame still owes (0 between frames)
    assert [[bytes(f) for f in m] for m in got] == msgs
    assert dec.frame_remaining == 0
