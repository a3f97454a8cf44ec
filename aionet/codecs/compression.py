"""Per-buffer compression for out-of-band frames (sans-I/O, pure functions).

Only large buffers are worth compressing, and much of what a cluster moves (float arrays,
already-compressed media, random keys) does not compress. So :func:`compress_buffer` first
compresses a small sample taken from a few places in the buffer and gives up when the sample
does not shrink; on random data that check costs a few microseconds instead of a full pass.

:func:`decompress` is the receiving side and treats its input as hostile: the claimed raw
length is checked against the configured limit *and* against what LZ4 can physically
produce from that many input bytes before anything is allocated, so a 20-byte frame
claiming a terabyte fails fast instead of exhausting memory.
"""

from __future__ import annotations

import lz4.block

from ..errors import DecodeError

__all__ = [
    "CODECS",
    "LZ4",
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
#: An LZ4 block expands at most ~255x (one literal-length byte per 255 bytes of a match), so
#: any claim above this bound is corrupt or malicious and is rejected without allocating.
LZ4_MAX_EXPANSION = 255
_SLACK = 64


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


def compress_buffer(buf: bytes | bytearray | memoryview, codec: str = LZ4) -> tuple[str, bytes] | None:
    """Compress ``buf`` with ``codec``; None when it is not worth it (incompressible or too big).

    Returns ``(codec, data)``; the caller records the codec and the raw length next to the
    frame so the receiver can check the size before decompressing.
    """
    if codec != LZ4:
        raise ValueError(f"unknown compression codec {codec!r}; known: {', '.join(sorted(CODECS))}")
    mv = _as_bytes_view(buf)
    n = mv.nbytes
    if n == 0 or n > LZ4_MAX_INPUT or not is_compressible(mv):
        return None
    data = lz4.block.compress(mv, store_size=False)
    if len(data) > MAX_RATIO * n:
        return None
    return codec, data


def decompress(codec: str, data: bytes | bytearray | memoryview, raw_len: int, max_bytes: int) -> bytearray:
    """Decompress one frame into a fresh writable ``bytearray`` of exactly ``raw_len`` bytes.

    Raises :class:`~aionet.errors.DecodeError` for an unknown codec, a raw length that is
    negative, above ``max_bytes`` or impossible for the input size, and for corrupt data.
    """
    if codec not in CODECS:
        raise DecodeError(f"unknown compression codec {codec!r}")
    if type(raw_len) is not int or raw_len < 0:
        raise DecodeError(f"bad decompressed length {raw_len!r}")
    if raw_len > max_bytes:
        raise DecodeError(f"decompressed length {raw_len} exceeds limits.max_frame_bytes ({max_bytes})")
    try:
        n = memoryview(data).nbytes
    except TypeError:
        raise DecodeError(f"compressed frame is not a buffer: {type(data).__name__}") from None
    if raw_len > n * LZ4_MAX_EXPANSION + _SLACK:
        raise DecodeError(f"lz4 frame of {n} bytes cannot expand to the claimed {raw_len} bytes")
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
