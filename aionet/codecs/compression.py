"""Per-buffer compression for out-of-band frames (sans-I/O, pure functions).

Only large buffers are worth compressing, and much of what a cluster moves (float arrays,
already-compressed media, random keys) does not compress. So :func:`compress_buffer` first
compresses a small sample taken from a few places in the buffer and gives up when the sample
does not shrink; on random data that check costs a few microseconds instead of a full pass.

:func:`decompress` is the receiving side and treats its input as hostile: the claimed raw
length is checked against the configured limit *and* against the ratio cap
(``codec.max_compression_ratio``, at most what LZ4 can physically produce from that many
input bytes) before anything is allocated, so a 20-byte frame claiming a terabyte fails fast
instead of exhausting memory. Every limit downstream (message size, mailbox bytes) counts the
decompressed size, which the caller learns from ``raw_len`` before this runs.
"""

from __future__ import annotations

from typing import Any

import lz4.block

from ..errors import DecodeError

__all__ = [
    "CODECS",
    "LZ4",
    "LZ4_MAX_EXPANSION",
    "check_decompressed_size",
    "compress_buffer",
    "decompress",
    "is_compressible",
]

LZ4 = "lz4"
CODECS = frozenset({LZ4})

#: Bytes taken from each sampled place; SAMPLE_POINTS places in all (start, middle..., end).
SAMPLE_BYTES = 4096
SAMPLE_POINTS = 4
#: Keep the compressed form only when it is at most this fraction of the raw size: a frame
#: that shrinks by less is not worth the receiver's decompression pass.
MAX_RATIO = 0.9
#: LZ4 block format limit on one input (LZ4_MAX_INPUT_SIZE); larger buffers travel raw.
LZ4_MAX_INPUT = 0x7E000000
#: An LZ4 block expands at most ~255x (one match-length byte per 255 bytes of a match; measured
#: 254.99 for 100 MB of zeros), so any claim above this bound is corrupt or malicious and is
#: rejected without allocating. It is also the default and the largest ``codec.max_compression_ratio``.
LZ4_MAX_EXPANSION = 255


def _as_bytes_view(buf: bytes | bytearray | memoryview) -> memoryview:
    mv = memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def is_compressible(buf: bytes | bytearray | memoryview) -> bool:
    """Cheap guess: does a sample of ``buf`` shrink to at most :data:`MAX_RATIO`?

    Buffers no larger than the whole sample are judged by compressing them outright.
    """
    mv = _as_bytes_view(buf)
    n = mv.nbytes
    if n == 0:
        return False
    total = SAMPLE_BYTES * SAMPLE_POINTS
    if n <= total:
        sample: bytes | memoryview = mv
    else:
        step = (n - SAMPLE_BYTES) // (SAMPLE_POINTS - 1)
        sample = b"".join(mv[i * step : i * step + SAMPLE_BYTES] for i in range(SAMPLE_POINTS))
    packed = lz4.block.compress(sample, store_size=False)
    return len(packed) <= MAX_RATIO * len(sample)


def compress_buffer(
    buf: bytes | bytearray | memoryview, codec: str = LZ4, max_ratio: float = LZ4_MAX_EXPANSION
) -> tuple[str, bytes] | None:
    """Compress ``buf`` with ``codec``; None when it is not worth it (incompressible or too big).

    Returns ``(codec, data)``; the caller records the codec and the raw length next to the
    frame so the receiver can check the size before decompressing. A result that shrank by
    more than ``max_ratio`` is dropped too (the frame travels raw): receivers with the same
    ``codec.max_compression_ratio`` would refuse it as a bomb.
    """
    if codec != LZ4:
        raise ValueError(f"unknown compression codec {codec!r}; known: {', '.join(sorted(CODECS))}")
    mv = _as_bytes_view(buf)
    n = mv.nbytes
    if n == 0 or n > LZ4_MAX_INPUT or not is_compressible(mv):
        return None
    data = lz4.block.compress(mv, store_size=False)
    if len(data) > MAX_RATIO * n or n > len(data) * max_ratio:
        return None
    return codec, data


def check_decompressed_size(
    codec: Any, nbytes: int, raw_len: Any, max_bytes: int, max_ratio: float = LZ4_MAX_EXPANSION
) -> None:
    """Validate what a compressed frame of ``nbytes`` claims to become, before allocating.

    Raises :class:`~aionet.errors.DecodeError` for an unknown codec, a raw length that is not
    a non-negative int, above ``max_bytes`` (limits.max_frame_bytes), or more than
    ``max_ratio`` times the compressed size (a decompression bomb).
    """
    if codec not in CODECS:
        raise DecodeError(f"unknown compression codec {codec!r}")
    if type(raw_len) is not int or raw_len < 0:
        raise DecodeError(f"bad decompressed length {raw_len!r}")
    if raw_len > max_bytes:
        raise DecodeError(f"decompressed length {raw_len} exceeds limits.max_frame_bytes ({max_bytes})")
    if raw_len > nbytes * max_ratio:
        raise DecodeError(
            f"{codec} frame of {nbytes} bytes claims to expand to {raw_len} bytes, more than "
            f"codec.max_compression_ratio ({max_ratio:g}) allows: refused as a decompression bomb"
        )


def decompress(
    codec: str,
    data: bytes | bytearray | memoryview,
    raw_len: int,
    max_bytes: int,
    max_ratio: float = LZ4_MAX_EXPANSION,
) -> bytearray:
    """Decompress one frame into a fresh writable ``bytearray`` of exactly ``raw_len`` bytes.

    Raises :class:`~aionet.errors.DecodeError` for an unknown codec, a raw length that is
    negative, above ``max_bytes`` or above ``max_ratio`` times the input size (checked before
    anything is allocated), and for corrupt data.
    """
    try:
        n = memoryview(data).nbytes
    except TypeError:
        raise DecodeError(f"compressed frame is not a buffer: {type(data).__name__}") from None
    check_decompressed_size(codec, n, raw_len, max_bytes, min(max_ratio, LZ4_MAX_EXPANSION))
    if raw_len == 0:
        if n:
            raise DecodeError("non-empty lz4 frame claims an empty result")
        return bytearray()
    try:
        out = lz4.block.decompress(data, uncompressed_size=raw_len, return_bytearray=True)
    except (lz4.block.LZ4BlockError, ValueError, OverflowError, MemoryError) as exc:
        raise DecodeError(f"corrupt lz4 frame: {exc}") from None
    if len(out) != raw_len:
        raise DecodeError(f"lz4 frame decompressed to {len(out)} bytes, header said {raw_len}")
    return out
