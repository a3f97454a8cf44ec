"""Sans-I/O message framing for stream transports (TCP, TLS, ...).

A message is a list of 0..N frames. On the wire (all integers little-endian)::

    preamble   8 bytes   "<2sBBI": magic b"AN", version u8, flags u8 (reserved, 0), nframes u32
    lengths    nframes x u64
    payload    the frames back to back

This module does no I/O and never imports asyncio or socket: bytes go in, messages come out,
so it is tested by feeding bytes split at every point. :class:`FrameDecoder` is shaped for
``asyncio.BufferedProtocol``: small data is parsed out of one reusable staging buffer while a
large frame is allocated once at its final size and received straight into by the kernel, or
received into a place its consumer already holds (:meth:`FrameDecoder.set_frame_target`).
Limits are checked as soon as a preamble or length is seen, before anything is allocated.
"""

from __future__ import annotations

import ctypes
import gc
import mmap
import platform
import struct
import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ..config import LimitsSection
from ..errors import (
    BadMagic,
    FrameTooLarge,
    ProtocolError,
    SerializationError,
    TooManyFrames,
    UnsupportedVersion,
)

Buffer = bytes | bytearray | memoryview
Message = list[Buffer]

MAGIC = b"AN"
VERSION = 1

PREAMBLE = struct.Struct("<2sBBI")
PREAMBLE_SIZE = PREAMBLE.size  # 8
LENGTH = struct.Struct("<Q")

#: The first 4 preamble bytes (magic, version, flags=0) read as one little-endian u32: a
#: single compare validates them on the hot path.
HEAD = struct.unpack("<I", MAGIC + bytes((VERSION, 0)))[0]
#: ``pack(HEAD, 1, length)`` is the whole 16-byte prefix of a 1-frame message.
ONE_FRAME_PREFIX = struct.Struct("<IIQ")
_HEAD = HEAD
_HEAD_N = struct.Struct("<II")  # head, nframes
_HEAD_N_LEN = ONE_FRAME_PREFIX
_ONE_PREFIX = ONE_FRAME_PREFIX.size  # 16
_KEY_LEN = struct.Struct("<QQ")  # (head | nframes << 32), first length
_ONE_KEY = _HEAD | (1 << 32)
# A 1-frame message shorter than this starts a run decoded out of a bytes snapshot of at most
# _SNAPSHOT_MAX staged bytes (see FrameDecoder._parse_small).
_SNAPSHOT_BELOW = 1024
_SNAPSHOT_MAX = 65536
#: After a message with a large frame, the next read into empty staging is capped at this many
#: bytes: large messages tend to follow each other, and a full staging read would land the
#: next one's first ``staging_bytes`` in staging, to be copied into its own buffer (measured:
#: 25% of every 1 MiB frame, about 50 us of receiver CPU each). This holds a typical preamble,
#: length table and envelope; when a small message comes instead, it costs one extra read.
PEEK_BYTES = 4096

#: Frames shorter than this that directly follow the prefix are merged into it by :func:`encode`.
#: Measured (uvloop ``writelines`` and raw ``sendmsg``, 64 B..1 KiB frames): merged and separate
#: cost the same within noise, so this only halves the buffers a caller has to track; what does
#: pay (~25%) is joining many small messages into one buffer, as the TCP transport's batch does.
MERGE_BELOW = 1024

#: Large frames at least this big get an anonymous mmap advised for transparent huge pages;
#: smaller ones a bytearray from the malloc heap (measured on 64 KiB..256 MiB receives).
MMAP_ALLOC_BYTES = 16 * 2**20

_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)

#: Remembered large-frame buffers beyond the two newest are kept only while all of them
#: together stay within this many bytes (a few MiB-sized segments in flight, not four 64 MiB
#: frames). Two cover a consumer that holds one message while the next arrives; more help
#: when several pipelined frames (a ring collective's segments) are in flight at once.
REUSE_BUDGET_BYTES = 64 * 2**20


def _uninitialized_bytearray() -> Callable[[int], bytearray]:
    """``bytearray(n)`` without the zero fill, where the C API allows it (CPython).

    A received frame is handed out only once the kernel wrote every byte of it, so zeroing it
    first is wasted work: measured 108 vs 6 us for 1 MiB, 365 vs 42 us for 4 MiB (heap reused;
    the zero fill is a full pass over memory the receive then writes again)."""
    if platform.python_implementation() != "CPython":
        return bytearray
    try:
        fn = ctypes.pythonapi.PyByteArray_FromStringAndSize
    except AttributeError:
        return bytearray
    fn.restype = ctypes.py_object
    fn.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
    return lambda n: fn(None, n)  # NULL source: allocated, not initialized (documented C API)


#: ``new_frame_bytearray(n)``: a bytearray of ``n`` bytes whose contents are not initialized.
new_frame_bytearray = _uninitialized_bytearray()


def default_alloc(n: int) -> Buffer:
    """A writable buffer of ``n`` bytes for a large incoming frame (contents undefined: the
    decoder fills all of it before anyone sees it).

    Measured for 64 MiB loopback receives: a zero-filled bytearray runs at ~1.4 GB/s, an
    anonymous mmap with MAP_POPULATE ~1.5 GB/s (4 KiB pages pre-faulted), numpy.empty and an
    anonymous mmap advised MADV_HUGEPAGE both ~3 GB/s (the kernel faults 2 MiB pages while
    writing into them). Below ~16 MiB malloc reuses heap memory and a bytearray without the
    zero fill is as fast as anything, without the mmap/munmap syscalls.
    """
    if n < MMAP_ALLOC_BYTES:
        return new_frame_bytearray(n)
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if _MADV_HUGEPAGE is not None:
        try:
            m.madvise(_MADV_HUGEPAGE)
        except OSError:  # THP disabled or unsupported: plain pages still work
            pass
    return memoryview(m)


class OwnedFrame(bytearray):
    """A buffer whose owner (the link's replay copies) leaves it unchanged while any
    transport references it: a transport may keep it by reference, like ``bytes``, instead
    of waiting until the kernel has taken it (as it must for a caller's mutable buffer)."""

    __slots__ = ()


def as_frame(f: Any) -> Buffer:
    """A bytes-like object whose ``len`` is its size in bytes (1-D, unsigned bytes)."""
    t = type(f)
    if t is bytes or t is bytearray or t is OwnedFrame:
        return f
    try:
        mv = memoryview(f)
    except TypeError:
        raise SerializationError(f"frame must be bytes-like, not {t.__name__}") from None
    if not mv.c_contiguous:
        raise SerializationError(f"frame must be a C-contiguous buffer (got shape {mv.shape}, strides {mv.strides})")
    if mv.ndim == 1 and mv.format == "B":
        return mv
    return mv.cast("B")


def encode(frames: Sequence[Any]) -> list[Buffer]:
    """Encode one message as ``[prefix, *frames]`` for a scatter-gather write.

    Payload frames are never concatenated, so large buffers go to the kernel without a copy.
    Frames below :data:`MERGE_BELOW` that directly follow the prefix are merged into it (a
    small header is the common case), so a small message is a single buffer.
    Non-``bytes`` frames come back as 1-D unsigned-byte views of the caller's memory.
    """
    n = len(frames)
    if n == 1:
        f = frames[0]
        if type(f) is not bytes:
            f = as_frame(f)
        ln = len(f)
        prefix = _HEAD_N_LEN.pack(_HEAD, 1, ln)
        if ln < MERGE_BELOW:
            return [prefix + f]
        return [prefix, f]
    fs = [as_frame(f) for f in frames]
    lens = [len(f) for f in fs]
    prefix = _HEAD_N.pack(_HEAD, n) + struct.pack(f"<{n}Q", *lens)
    i = 0
    while i < n and lens[i] < MERGE_BELOW:
        i += 1
    if i:
        prefix = b"".join([prefix, *fs[:i]])
    return [prefix, *fs[i:]]


def encode_prefix(frames: Sequence[Buffer]) -> bytes:
    """Only the preamble and length table for ``frames`` (already 1-D byte buffers)."""
    n = len(frames)
    if n == 1:
        return _HEAD_N_LEN.pack(_HEAD, 1, len(frames[0]))
    return _HEAD_N.pack(_HEAD, n) + struct.pack(f"<{n}Q", *map(len, frames))


#: ``fn(header, index, n)``: where frame ``index`` (``n`` bytes) of the message with header frame
#: ``header`` should land, or None (see :meth:`FrameDecoder.set_frame_target`).
FrameTarget = Callable[[Buffer, int, int], Any]

# decoder states
_IDLE = 0  # between messages (expecting a preamble)
_TABLE = 1  # reading the length table
_FRAMES = 2  # reading payload frames out of staging
_LARGE = 3  # the kernel writes straight into an allocated frame


class FrameDecoder:
    """Incremental decoder: ``get_buffer`` says where received bytes go, ``buffer_updated``
    returns the messages they completed.

    Small frames are parsed out of a reusable staging buffer and returned as ``bytes``. A frame
    of at least ``large_frame_bytes`` is allocated once with ``alloc(n)`` and ``get_buffer``
    then points into it, so its payload is never copied (only the part that had already
    landed in staging when the frame started). After a protocol error the decoder stays
    failed: every later call raises the same error.
    """

    __slots__ = (
        "_alloc",
        "_buf",
        "_cap",
        "_custom_alloc",
        "_end",
        "_error",
        "_fast_max",
        "_fi",
        "_frames",
        "_free_refs",
        "_hook",
        "_into",
        "_large",
        "_lengths",
        "_max_frame",
        "_max_frames",
        "_max_header",
        "_max_message",
        "_min_free",
        "_mv",
        "_nframes",
        "_peek",
        "_reuse_frames",
        "_reuse_max",
        "_spare_objs",
        "_spare_sizes",
        "_start",
        "_state",
        "_target",
        "_target_obj",
        "_target_off",
        "_target_src",
        "_total",
        "delivered_bytes",
        "frame_remaining",
        "large_allocs",
        "large_done",
    )

    def __init__(
        self,
        limits: LimitsSection | None = None,
        *,
        alloc: Callable[[int], Any] | None = None,
        large_frame_bytes: int = 65536,
        staging_bytes: int = 262144,
        reuse_frames: int = 4,
        reuse_max_bytes: int = 256 * 2**20,
    ) -> None:
        lim = limits or LimitsSection()
        self._max_message = lim.max_message_bytes
        self._max_frame = lim.max_frame_bytes
        self._max_header = lim.max_header_bytes
        self._max_frames = lim.max_frames
        self._large = max(1, large_frame_bytes)
        # Whatever is left unparsed in staging is less than one small frame plus a prefix, so
        # twice that always fits after compaction and the kernel can always make progress.
        self._cap = max(staging_bytes, 2 * self._large + 2 * _ONE_PREFIX, 64)
        self._buf = bytearray(self._cap)
        self._mv = memoryview(self._buf)
        self._min_free = self._cap // 4
        self._start = 0
        self._end = 0
        self._peek = False  # the last message had a large frame: read the next one's start small
        self._alloc = alloc or default_alloc
        self._custom_alloc = alloc is not None
        self._hook: Callable[[int], Any] | None = None
        self._into: FrameTarget | None = None
        # Recycling (default alloc only): the last ``reuse_frames`` large-frame buffers are
        # remembered; one the receiver has dropped (we hold the only reference) is reused for
        # the next frame of the same size instead of faulting in fresh pages.
        self._reuse_frames = 0 if alloc is not None else max(0, reuse_frames)
        self._reuse_max = reuse_max_bytes
        self._spare_objs: list[Any] = [bytearray()]
        self._spare_sizes: list[int] = [0]
        self._free_refs = self._refs(0)  # calibrated: what "only this list holds it" reads as
        self._spare_objs.clear()
        self._spare_sizes.clear()
        #: How many large-frame buffers were obtained so far (fresh or reused). Plain
        #: attributes, like ``delivered_bytes``: the transport reads them on every read.
        self.large_allocs = 0
        #: How many large frames were completed so far (handed on with their message).
        self.large_done = 0
        self._fast_max = min(self._max_header, self._max_message, self._large - 1)
        self._error: ProtocolError | None = None
        #: Total payload bytes of all messages returned so far (receive-queue accounting).
        self.delivered_bytes = 0
        self._state = _IDLE
        self._nframes = 0
        self._lengths: list[int] = []
        self._frames: list[Buffer] = []
        self._fi = 0
        self._total = 0
        self._target: memoryview | None = None
        self._target_obj: Any = None
        self._target_off = 0
        self._target_src: Any = None  # the buffer a FrameTarget gave for the frame in progress
        #: Bytes still to come of the large frame being received into its own buffer (0 if none).
        #: The peer wrote this frame's header, so it is committed to every byte of it: a transport
        #: may ask the kernel to wake it only once up to this many are queued (a receive low-water
        #: mark) without ever waiting for bytes the peer holds back (it may send nothing after the
        #: frame). A plain attribute kept by every change of the frame in progress, like
        #: ``large_allocs``: the transport reads it on every read of a large frame.
        self.frame_remaining = 0

    # ----------------------------------------------------------------- public API
    @property
    def pending_bytes(self) -> int:
        """Bytes of the incomplete message currently held (staged, parsed frames, large frame)."""
        held = self._end - self._start + self._target_off
        if self._state in (_FRAMES, _LARGE):
            held += sum(map(len, self._frames))
        return held

    @property
    def spare_bytes(self) -> int:
        """Bytes of remembered large-frame buffers (in use by the receiver or reusable)."""
        return sum(self._spare_sizes)

    def trim(self) -> None:
        """Forget remembered large-frame buffers, so dropped ones are freed (call when idle)."""
        self._spare_objs.clear()
        self._spare_sizes.clear()

    @property
    def failed(self) -> ProtocolError | None:
        """The protocol error this decoder failed with, if any."""
        return self._error

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next received bytes must be written (never empty)."""
        start = self._start
        end = self._end
        if start == end == 0 and self._target is None and self._error is None:
            # the usual case: everything read was taken (see buffer_updated's one-message path)
            return self._mv[:PEEK_BYTES] if self._peek else self._mv
        if self._error is not None:
            raise self._error
        target = self._target
        if target is not None:
            return target[self._target_off :]
        if start == end:
            self._start = self._end = 0
            if self._peek:
                return self._mv[:PEEK_BYTES]
            return self._mv
        if self._cap - end < self._min_free:
            n = end - start
            self._buf[:n] = self._mv[start:end]
            self._start = 0
            self._end = end = n
        return self._mv[end:]

    def buffer_updated(self, nbytes: int) -> list[Message]:
        """Account ``nbytes`` written into the last :meth:`get_buffer`; return completed messages."""
        if self._error is not None:
            raise self._error
        if self._target is not None:
            # a read into the large frame in progress (most reads of a large message): counted
            # without a call, and the frame's end is the only thing to act on
            self._target_off += nbytes
            left = self.frame_remaining - nbytes
            self.frame_remaining = left
            if left > 0:
                return []
            out: list[Message] = []
            try:
                self._finish_large()
                self._parse_frames(out)
            except ProtocolError as exc:
                self._fail(exc)
            return out
        end = self._end + nbytes
        self._end = end
        if self._state == _IDLE:
            # The usual read of a request/reply exchange: exactly one whole small message.
            # Taken here without the general parser's frames and without pausing the GC (one
            # message allocates too little to matter): about 300 fewer bytecodes per read.
            pos = self._start
            if end - pos >= _ONE_PREFIX:
                key, ln = _KEY_LEN.unpack_from(self._mv, pos)
                if key == _ONE_KEY and pos + _ONE_PREFIX + ln == end and ln <= self._fast_max:
                    self._start = self._end = 0  # all taken: the next read starts at the front
                    self.delivered_bytes += ln
                    self._peek = False
                    return [[self._mv[pos + _ONE_PREFIX : end].tobytes()]]
        # One chunk can complete thousands of small messages, each a new list. Those cannot
        # form reference cycles, yet every 700 of them would trigger a cyclic-GC pass (and the
        # survivors, queued for the consumer, later full collections): pausing the collector
        # while one chunk is parsed cut the decode cost by ~40% (measured, 64-byte messages).
        # The collector is re-enabled before returning, and never enabled if it was off.
        gc_was_enabled = gc.isenabled()
        if gc_was_enabled:
            gc.disable()
        try:
            out = self._parse()
        except ProtocolError as exc:
            self._fail(exc)
            raise  # unreachable: _fail raises
        finally:
            if gc_was_enabled:
                gc.enable()
        if self._target is None:
            self._peek = False  # a small message came: full staging reads again
        return out

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message]:
        """Decode ``data`` by copying it through get_buffer/buffer_updated (tests, datagrams)."""
        src = memoryview(data).cast("B")
        out: list[Message] = []
        pos = 0
        n = len(src)
        while pos < n:
            buf = self.get_buffer(n - pos)
            k = min(len(buf), n - pos)
            buf[:k] = src[pos : pos + k]
            pos += k
            out.extend(self.buffer_updated(k))
        if not n and self._error is not None:  # zero bytes fed: still surface a stored error
            raise self._error
        return out

    def eof(self) -> None:
        """The stream ended: raise ProtocolError if it stopped in the middle of a message."""
        if self._error is not None:
            raise self._error
        if self._state != _IDLE or self._end > self._start:
            self._fail(
                ProtocolError(f"stream ended in the middle of a message ({self.pending_bytes} bytes of it received)")
            )

    # ----------------------------------------------------------------- internals
    def _fail(self, exc: ProtocolError) -> None:
        self._error = exc
        self._release_target()
        self._frames = []
        self._lengths = []
        raise exc

    def _release_target(self) -> None:
        self._target = None
        self._target_obj = None
        self._target_off = 0
        self._target_src = None
        self.frame_remaining = 0

    def _parse(self) -> list[Message]:
        out: list[Message] = []
        mv = self._mv
        end = self._end
        while True:
            state = self._state
            if state == _IDLE:
                pos = self._start
                if end - pos >= _ONE_PREFIX:
                    # Hot path: a whole 1-frame message in staging; (magic, version, flags,
                    # nframes=1) compare as one u64.
                    key, ln = _KEY_LEN.unpack_from(mv, pos)
                    if key == _ONE_KEY and ln <= self._fast_max and pos + _ONE_PREFIX + ln <= end:
                        if ln < _SNAPSHOT_BELOW:
                            self._start = self._parse_small(out, pos, end)
                        else:
                            out.append([mv[pos + _ONE_PREFIX : pos + _ONE_PREFIX + ln].tobytes()])
                            self.delivered_bytes += ln
                            self._start = pos + _ONE_PREFIX + ln
                        continue
                if pos == end or not self._parse_preamble(out):
                    return out
            elif state == _TABLE:
                if not self._parse_table():
                    return out
            elif not self._parse_frames(out):
                return out

    def _parse_small(self, out: list[Message], pos: int, end: int) -> int:
        """Decode a run of small 1-frame messages; return the new staging position.

        Copies a window of staging into one ``bytes`` first: slicing and unpacking ``bytes``
        costs about half as much per message as going through memoryviews (measured ~190 vs
        ~375 ns per 64-byte message), which pays for the extra memcpy many times over.
        """
        b = self._mv[pos : min(end, pos + _SNAPSHOT_MAX)].tobytes()
        limit = len(b) - _ONE_PREFIX
        bend = len(b)
        unpack = _KEY_LEN.unpack_from
        fast_max = self._fast_max
        append = out.append
        n0 = len(out)
        p = 0
        while p <= limit:
            key, ln = unpack(b, p)
            if key != _ONE_KEY or ln > fast_max:
                break
            start = p + _ONE_PREFIX
            stop = start + ln
            if stop > bend:
                break
            append([b[start:stop]])
            p = stop
        self.delivered_bytes += p - _ONE_PREFIX * (len(out) - n0)
        return pos + p

    def _parse_preamble(self, out: list[Message]) -> bool:
        pos = self._start
        avail = self._end - pos
        if avail < PREAMBLE_SIZE:
            if avail:
                self._check_partial_preamble(bytes(self._mv[pos : self._end]))
            return False
        head, n = _HEAD_N.unpack_from(self._mv, pos)
        if head != _HEAD:
            self._check_partial_preamble(bytes(self._mv[pos : pos + PREAMBLE_SIZE]))
        if n > self._max_frames:
            raise TooManyFrames(f"message announces {n} frames; limit is {self._max_frames} (limits.max_frames)")
        self._start = pos + PREAMBLE_SIZE
        if n == 0:
            out.append([])
            return True
        self._nframes = n
        self._lengths = []
        self._total = 0
        self._state = _TABLE
        return True

    def _check_partial_preamble(self, got: bytes) -> None:
        """Raise the precise error for the first bad preamble byte(s) seen, if any."""
        if got[:2] != MAGIC[: len(got[:2])]:
            raise BadMagic(f"stream does not start with aionet magic {MAGIC!r}: got {got[:8]!r} (not an aionet peer?)")
        if len(got) > 2 and got[2] != VERSION:
            raise UnsupportedVersion(f"peer speaks framing version {got[2]}; this node speaks {VERSION}")
        if len(got) > 3 and got[3] != 0:
            raise ProtocolError(f"reserved preamble flags set: 0x{got[3]:02x}")

    def _parse_table(self) -> bool:
        pos = self._start
        lengths = self._lengths
        want = self._nframes - len(lengths)
        k = min(want, (self._end - pos) // 8)
        if k == 0:
            return False
        got = struct.unpack_from(f"<{k}Q", self._mv, pos)
        total = self._total
        max_frame = self._max_frame
        for ln in got:
            if not lengths:
                if ln > self._max_header:
                    raise FrameTooLarge(
                        f"header frame announces {ln} bytes; limit is {self._max_header} (limits.max_header_bytes)"
                    )
            elif ln > max_frame:
                raise FrameTooLarge(
                    f"frame {len(lengths)} announces {ln} bytes; limit is {max_frame} (limits.max_frame_bytes)"
                )
            total += ln
            if total > self._max_message:
                raise FrameTooLarge(
                    f"message of {self._nframes} frames announces at least {total} bytes; "
                    f"limit is {self._max_message} (limits.max_message_bytes)"
                )
            lengths.append(ln)
        self._total = total
        self._start = pos + 8 * k
        if k < want:
            return False
        self._state = _FRAMES
        self._frames = []
        self._fi = 0
        return True

    def _parse_frames(self, out: list[Message]) -> bool:
        """Extract as many frames of the current message as staging holds.

        Returns True when the message completed (parsing may continue), False when more bytes
        are needed (possibly now into a large frame's own buffer)."""
        lengths = self._lengths
        frames = self._frames
        n = self._nframes
        fi = self._fi
        mv = self._mv
        pos = self._start
        end = self._end
        large = self._large
        while fi < n:
            ln = lengths[fi]
            if ln >= large:
                have = min(end - pos, ln)
                self._fi = fi
                self._start = pos + have
                self._start_large(ln, mv[pos : pos + have])
                if self._target is not None:  # waiting for the kernel to fill it
                    return False
                pos = self._start
                fi = self._fi
                continue
            if end - pos < ln:
                break
            frames.append(mv[pos : pos + ln].tobytes())
            pos += ln
            fi += 1
        self._start = pos
        self._fi = fi
        if fi < n:
            return False
        out.append(frames)
        self.delivered_bytes += self._total
        self._frames = []
        self._lengths = []
        self._state = _IDLE
        return True

    def set_frame_allocator(self, alloc: Callable[[int], Any] | None) -> None:
        """Choose where the next large frames land: ``alloc(n)`` returns a writable buffer of
        at least ``n`` bytes, or None for the default. Lets a consumer that knows what comes
        next (the staging receiver) have frames written straight into pooled or final memory.
        ``None`` removes the hook."""
        self._hook = alloc

    def set_frame_target(self, fn: FrameTarget | None) -> None:
        """Receive-into: ``fn(header, index, n)`` is asked, for every large frame, whether the
        consumer already holds that frame's final place (frame ``index`` of ``n`` bytes of the
        message whose header frame is ``header``). It returns a writable, contiguous buffer of
        exactly ``n`` bytes, or None for the usual buffer; anything else is ignored (the usual
        buffer again), so nothing is ever written outside what ``fn`` gave. None removes it."""
        self._into = fn

    def release_frame_target(self, buf: Any) -> bool:
        """If the frame in progress is being received into ``buf`` (a FrameTarget's answer),
        continue it in a private buffer (the bytes so far copied over) and return True: its
        owner gave up waiting, and not one more byte may land in its memory."""
        src = self._target_src
        if src is None or src is not buf or self._target is None:
            return False
        n = len(self._target)
        own = memoryview(self._reuse_or_alloc(n) if not self._custom_alloc else self._alloc(n)).cast("B")
        own[: self._target_off] = self._target[: self._target_off]
        self._target = own
        self._target_obj = own
        self._target_src = None
        return True

    def _frame_target(self, n: int) -> Any:
        """The FrameTarget's buffer for the large frame about to start, checked; or None."""
        assert self._into is not None
        header = self._frames[0] if self._fi > 0 and self._frames else None
        if header is None:
            return None
        buf = self._into(header, self._fi, n)
        if buf is None:
            return None
        try:
            view = memoryview(buf)
        except TypeError:
            return None
        if view.readonly or not view.c_contiguous or view.nbytes != n:
            return None  # not a place this frame fits exactly: the usual buffer
        self._target_src = buf
        return view.cast("B") if view.ndim != 1 or view.format != "B" else view

    def _start_large(self, n: int, initial: memoryview) -> None:
        """Allocate a frame's final buffer and copy in the part already staged."""
        if self._into is not None:
            view = self._frame_target(n)
            if view is not None:
                have = len(initial)
                if have:
                    view[:have] = initial
                self.large_allocs += 1
                self._target = view
                self._target_obj = view
                self._target_off = have
                self.frame_remaining = n - have
                self._state = _LARGE
                if have == n:
                    self._finish_large()
                return
        try:
            obj = self._hook(n) if self._hook is not None else None
            if obj is None:
                obj = self._alloc(n) if self._custom_alloc else self._reuse_or_alloc(n)
        except MemoryError:
            raise FrameTooLarge(f"cannot allocate {n} bytes for an incoming frame") from None
        self.large_allocs += 1
        view = memoryview(obj)
        if view.readonly:
            raise TypeError("FrameDecoder alloc() must return a writable buffer")
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
        if len(view) < n:
            raise TypeError(f"FrameDecoder alloc({n}) returned only {len(view)} bytes")
        if len(view) > n:
            view = view[:n]
            obj = view
        elif type(obj) not in (bytearray, memoryview):
            obj = view
        have = len(initial)
        if have:
            view[:have] = initial
        self._target = view
        self._target_obj = obj
        self._target_off = have
        self.frame_remaining = n - have
        self._state = _LARGE
        if have == n:
            self._finish_large()

    def _refs(self, i: int) -> int:
        return sys.getrefcount(self._spare_objs[i])

    def _reuse_or_alloc(self, n: int) -> Any:
        """A buffer of exactly ``n`` bytes: a dropped one of that size, else a fresh one.

        The newest dropped one is taken (the list runs from least to most recently handed
        out): it was filled last, so it is the likeliest still in cache. Taking the oldest
        instead rotated a stream of 1 MiB frames through all 16 remembered buffers after any
        burst, and a kernel copy into a cold buffer cost the receiver ~40 % more per byte."""
        sizes = self._spare_sizes
        objs = self._spare_objs
        for i in range(len(sizes) - 1, -1, -1):
            if sizes[i] == n and self._refs(i) <= self._free_refs and not weakref.getweakrefcount(objs[i]):
                # Nobody else can reach it: no reference, no memoryview (views hold one).
                exporter = objs.pop(i)
                sizes.pop(i)
                objs.append(exporter)
                sizes.append(n)
                return exporter if type(exporter) is bytearray else memoryview(exporter)
        obj = default_alloc(n)
        if self._reuse_frames and n <= self._reuse_max:
            objs.append(obj.obj if type(obj) is memoryview else obj)
            sizes.append(n)
            while len(objs) > self._reuse_frames or (len(objs) > 2 and sum(sizes) > REUSE_BUDGET_BYTES):
                del objs[0], sizes[0]
        return obj

    def _finish_large(self) -> None:
        self._peek = True
        self.large_done += 1
        self._frames.append(self._target_obj)
        self._fi += 1
        self._release_target()
        self._state = _FRAMES


def frame_nbytes(f: Any) -> int:
    """Bytes in any frame: host buffers, numpy arrays, and device buffers a transport hands over
    (CuPy arrays, or UCX's own buffer types that have a ``__cuda_array_interface__`` and no
    ``len``), so a device frame is counted as the bytes it holds, not its first dimension."""
    t = type(f)
    if t is bytes or t is bytearray or t is OwnedFrame:
        return len(f)
    if t is memoryview:
        return f.nbytes
    n = getattr(f, "nbytes", None)
    if n is not None:
        return int(n)
    cai = getattr(f, "__cuda_array_interface__", None)
    if cai is not None:
        count = 1
        for d in cai["shape"]:
            count *= int(d)
        return count * int(cai["typestr"][2:])
    return memoryview(f).nbytes
