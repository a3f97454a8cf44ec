"""Objects <-> messages: frame 0 is a msgpack header, frames 1..N are out-of-band buffers.

The node calls :meth:`Serializer.dumps` / :meth:`Serializer.loads` once per message, mostly on
small envelopes such as ``[2, 17, "echo", payload]``, so the common case is one
``msgpack.Packer.pack`` and one ``msgpack.unpackb`` with extension hooks and no per-message
objects beyond the header itself. Large payloads take the other road: numpy arrays and
bytes-likes of at least ``oob_min_bytes`` leave the header as separate frames that alias the
caller's memory (no copy on the sender), and the receiver builds arrays directly on the
received frames (no copy on the receiver).

What round-trips, and what it costs on the receiver:

* msgpack types; ``tuple``, ``set``, ``frozenset``, ``complex``, integers beyond 64 bits,
  ``datetime``/``date``/``time``/``timedelta`` (time zones travel as fixed UTC offsets),
  numpy scalars (as the same numpy type) and dict keys of any of these hashable types.
* ``numpy.ndarray`` of any fixed-size dtype (no object or StringDType fields), any shape and
  memory order. The array aliases the received frame and is writable when the frame is
  (``bytearray`` or a writable ``memoryview``); a read-only frame (``bytes``) is copied once
  so users always get a writable array.
* ``bytearray`` (zero-copy when the frame is a ``bytearray``), ``memoryview`` (a flat
  unsigned-byte view over the received frame) and ``bytes``. Producing ``bytes`` from a
  frame that is not already ``bytes`` costs one copy on the receiver: numpy arrays,
  ``bytearray`` and ``memoryview`` are the zero-copy types.
* dataclasses registered with :meth:`Serializer.register` on both ends (restored like
  pickle restores objects: fields are set without calling ``__init__``).
* anything else only with ``allow_pickle=True`` (pickle protocol 5, large buffers still out of
  band). With pickle off, a pickle record from the network is rejected without unpickling.
* device arrays (CuPy, ``__cuda_array_interface__``, CUDA DLPack) when a :class:`DeviceHook`
  is installed (the node installs one, see ``aionet/core/device_transfer.py``): unknown types are
  offered to the hook *after* every other check fails, so plain messages never pay for it.

Subclasses of ``int``/``float``/``str``/``bytes``/``list``/``dict``/``tuple`` (enums with a
value mixin, named tuples, ``OrderedDict``...) travel as their base type.

Every decoding failure raises :class:`~aionet.errors.DecodeError` (a
:class:`~aionet.errors.ProtocolError`): the input is treated as hostile. A serializer is safe
to share between threads (a busy or re-entered encoder falls back to a fresh one).

The pieces: :mod:`~aionet.codecs.extensions` (the extension codes: the wire format),
:mod:`~aionet.codecs.encoder` and :mod:`~aionet.codecs.decoder`, :mod:`~aionet.codecs.dtypes`
(numpy dtypes on the wire, bounds on hostile descriptions) and :mod:`~aionet.codecs.pickling`
(the opt-in pickle fallback). This module holds the :class:`Serializer` that ties them.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

import msgpack

from ..config import LimitsSection
from ..errors import ConfigError, DecodeError, FrameTooLarge, ProtocolError, SerializationError
from .compression import CODECS, LZ4, LZ4_MAX_EXPANSION
from .decoder import GC_PAUSE_BYTES, Decoder, decode_frames, gc_paused, meta_limits, short_record_max
from .dtypes import DtypeTable
from .encoder import Encoder
from .extensions import Buffer, DecodeDeferred, DeviceHook, qualname

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["Serializer"]

T = TypeVar("T", bound=type)


class Serializer:
    """Turns Python objects into messages (lists of frames) and back.

    Keep one per node and reuse it: it caches its encoder, dtype translations and the
    dataclass registry. Safe to share between threads.
    """

    def __init__(
        self,
        *,
        oob_min_bytes: int = 2048,
        compression: str = "none",
        compress_min_bytes: int = 65536,
        allow_pickle: bool = False,
        limits: LimitsSection | None = None,
        device_hook: DeviceHook | None = None,
        max_compression_ratio: float = LZ4_MAX_EXPANSION,
    ) -> None:
        if compression != "none" and compression not in CODECS:
            raise ConfigError(f"compression must be 'none' or one of {sorted(CODECS)}, not {compression!r}")
        if oob_min_bytes < 0 or compress_min_bytes < 0:
            raise ConfigError("oob_min_bytes and compress_min_bytes must not be negative")
        if not 1.0 <= max_compression_ratio <= LZ4_MAX_EXPANSION:
            raise ConfigError(f"max_compression_ratio must be between 1 and {LZ4_MAX_EXPANSION}")
        #: compressed frames that claim to grow more than this are refused (decompression bombs)
        self.max_compression_ratio = float(max_compression_ratio)
        self.oob_min_bytes = oob_min_bytes
        self.compression = compression
        self.compress_min_bytes = compress_min_bytes
        self.allow_pickle = allow_pickle
        self.limits = limits if limits is not None else LimitsSection()
        # device arrays: offered to this hook when nothing else knows the type (node-provided)
        self.device_hook: DeviceHook | None = device_hook
        self._oob_min = max(1, oob_min_bytes)  # empty buffers always stay inline
        self._max_header = self.limits.max_header_bytes
        self._meta_kw = meta_limits(self.limits, self._max_header)
        self._codec = compression if compression != "none" else LZ4
        self._compress_default = compression != "none"
        self._by_type: dict[type, tuple[str, tuple[str, ...]]] = {}
        self._by_name: dict[str, tuple[type, tuple[str, ...]]] = {}
        self._dtypes = DtypeTable(self.limits)
        #: the dtype table, for the short roads that pack and read array messages themselves
        #: (codecs/array_send.py: the link and the dispatcher)
        self.dtypes = self._dtypes
        # msgpack packers are neither thread-safe nor re-entrant: one encoder per thread.
        self._tls = threading.local()
        self._root = Decoder(self, (), None, 0)
        self._root_hook = self._root.hook
        self._short = short_record_max(self.limits, self._max_header)
        #: headers up to this many bytes unpack within every limit on msgpack's own bounds (their
        #: length), and frames up to this many bytes are within the frame and message limits
        #: whatever such a header: the bounds of the array short road (codecs/array_send.py)
        self.short_header_bytes = self._short
        self.short_frame_bytes = min(self.limits.max_frame_bytes, self.limits.max_message_bytes - self._short)

    @classmethod
    def from_config(cls, cfg: Config) -> Serializer:
        """Build from the ``[codec]``, ``[limits]`` and ``[security]`` sections."""
        return cls(
            oob_min_bytes=cfg.codec.oob_min_bytes,
            compression=cfg.codec.compression,
            compress_min_bytes=cfg.codec.compress_min_bytes,
            allow_pickle=cfg.security.allow_pickle,
            limits=cfg.limits,
            max_compression_ratio=cfg.codec.max_compression_ratio,
        )

    @overload
    def register(self, cls: T, name: str | None = None) -> T: ...
    @overload
    def register(self, cls: None = None, name: str | None = None) -> Callable[[T], T]: ...
    def register(self, cls: T | None = None, name: str | None = None) -> Any:
        """Let dataclass ``cls`` travel under ``name`` (default ``module:qualname``).

        Both ends must register the same name. Usable as ``@ser.register`` or
        ``@ser.register(name="geo.Point")``; returns the class.
        """
        if cls is None:
            return lambda c: self.register(c, name)
        if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
            raise SerializationError(f"only dataclasses can be registered, not {cls!r}")
        key = name if name is not None else f"{cls.__module__}:{cls.__qualname__}"
        other = self._by_name.get(key)
        if other is not None and other[0] is not cls:
            raise SerializationError(f"name {key!r} is already registered for {qualname(other[0])}")
        fields = tuple(f.name for f in dataclasses.fields(cls))
        old = self._by_type.get(cls)
        if old is not None and old[0] != key:
            del self._by_name[old[0]]
        self._by_type[cls] = (key, fields)
        self._by_name[key] = (cls, fields)
        return cls

    def dumps(self, obj: Any, *, compress: bool | None = None) -> list[Buffer]:
        """Encode ``obj`` into frames. Large buffers in the result alias ``obj``'s memory:
        do not mutate them until the transport is done sending.

        ``compress=None`` follows the configured compression; True/False force it.
        Raises :class:`~aionet.errors.SerializationError` for unsupported objects.
        """
        try:
            enc = self._tls.encoder
        except AttributeError:
            enc = self._tls.encoder = Encoder(self)
        if enc.busy:  # re-entered from user code running inside this encoder (pickle hooks)
            enc = Encoder(self)
        return enc.encode(obj, self._compress_default if compress is None else compress)

    def dumps_sized(self, obj: Any, *, compress: bool) -> tuple[list[Buffer], int, int]:
        """:meth:`dumps`, plus what compression hid: the bytes the frames gain once
        inflated and the largest inflated frame. Receivers enforce their limits on inflated
        sizes, so a sender checks those, not the wire sizes, before a message is sequenced."""
        try:
            enc = self._tls.encoder
        except AttributeError:
            enc = self._tls.encoder = Encoder(self)
        if enc.busy:
            enc = Encoder(self)
        frames = enc.encode(obj, compress)
        return frames, enc.raw_extra, enc.raw_max

    def loads(self, frames: Sequence[Buffer], *, decompress: bool | None = None) -> Any:
        """Decode a message produced by :meth:`dumps` (on any node).

        Arrays and buffers alias the given frames where possible, so hand over ownership.
        ``decompress``: may the message hold compressed frames? None follows this serializer's
        ``compression`` setting; a node passes what the connection negotiated.
        Raises :class:`~aionet.errors.ProtocolError` (normally DecodeError) on any bad input.
        """
        if len(frames) == 1:  # the hot path (small messages): no tuple, no accounting
            try:
                header = frames[0]
                n = len(header)
                if n <= self._short:  # msgpack's own limits are the record's length: as strict
                    return msgpack.unpackb(header, ext_hook=self._root_hook, strict_map_key=False)
                if n < GC_PAUSE_BYTES and n <= self._max_header:
                    return self._root.unpack(header)
            except (ProtocolError, DecodeDeferred):
                raise
            except Exception as exc:
                raise DecodeError(f"cannot decode message: {type(exc).__name__}: {exc}") from exc
        return self.loads_sized(frames, decompress=decompress)[0]

    def loads_sized(self, frames: Sequence[Buffer], *, decompress: bool | None = None) -> tuple[Any, int]:
        """:meth:`loads`, plus the message's size in bytes once decompressed: what mailboxes
        and receive accounting must count (the wire size of a compressed message says
        nothing about the memory it takes)."""
        try:
            if len(frames) == 1:
                header = frames[0]
                n = len(header)
                if n > self._max_header:
                    raise FrameTooLarge(f"header of {n} bytes exceeds limits.max_header_bytes ({self._max_header})")
                if n < GC_PAUSE_BYTES:
                    return self._root.unpack(header), n
                with gc_paused():
                    return self._root.unpack(header), n
            allow = self._compress_default if decompress is None else decompress
            if len(frames) > 1 and len(frames[0]) >= GC_PAUSE_BYTES:
                with gc_paused():
                    return decode_frames(self, frames, allow)
            return decode_frames(self, frames, allow)
        except (ProtocolError, DecodeDeferred):
            raise
        except Exception as exc:
            raise DecodeError(f"cannot decode message: {type(exc).__name__}: {exc}") from exc
