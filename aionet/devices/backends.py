"""Array backends: what the GPU staging pipeline (:mod:`aionet.devices.staging`) needs from an
array library, behind one small :class:`ArrayBackend` interface so the whole pipeline runs and
is tested on the CPU.

* :class:`CupyBackend`: the real thing; needs ``cupy.cuda.is_available()``.
* :class:`SimulatedDeviceBackend`: treats host memory as "device" memory (numpy arrays and
  test doubles exposing ``__cuda_array_interface__`` or CUDA-typed DLPack over host memory)
  and performs the device<->host copies as real memcpys. Only for tests and benchmarks: it
  must never see real device pointers, so it is never selected automatically.
* :class:`HostTarget`: the receiver side when this node has no GPU and the config allows
  delivering device arrays as numpy arrays.
* :class:`NoDevice`: the stand-in on nodes without CUDA; every device path fails with why.

:func:`is_device_array` tells device arrays from everything else without importing CuPy.
"""

from __future__ import annotations

import ctypes
import math
import threading
import weakref
from typing import Any, Protocol

import numpy as np

from ..errors import DeviceUnavailable, SerializationError
from .discovery import Devices

__all__ = [
    "ArrayBackend",
    "CachingAllocator",
    "CupyBackend",
    "HostTarget",
    "NoDevice",
    "SimulatedDeviceBackend",
    "check_dtype",
    "is_device_array",
    "source_kind",
]

# DLPack device types (dlpack.h DLDeviceType)
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_CUDA_DL_TYPES = (_DL_CUDA, _DL_CUDA_MANAGED)


def is_device_array(obj: Any) -> bool:
    """True for CuPy arrays, ``__cuda_array_interface__`` objects and DLPack arrays whose
    device is CUDA. Cheap (attribute checks only, never imports CuPy) and never raises."""
    if isinstance(obj, (bytes, bytearray, memoryview, np.ndarray, np.generic, str, int, float)):
        return False
    try:
        if hasattr(obj, "__cuda_array_interface__"):
            return True
        dev = getattr(obj, "__dlpack_device__", None)
        if dev is not None:
            return int(dev()[0]) in _CUDA_DL_TYPES
    except Exception:
        return False
    return False


def source_kind(obj: Any) -> str:
    t = type(obj)
    if t.__module__.split(".")[0] == "cupy":
        return "cupy"
    return "cai" if hasattr(obj, "__cuda_array_interface__") else "dlpack"


_ALLOWED_KINDS = frozenset("biufcmMSV")


def check_dtype(dt: np.dtype) -> None:
    if dt.hasobject or dt.kind not in _ALLOWED_KINDS or dt.itemsize == 0:
        raise SerializationError(f"device arrays of dtype {dt} cannot be sent")


class ArrayBackend(Protocol):
    """What the staging pipeline needs from an array library.

    ``prepare`` turns a user array into a flat, contiguous uint8 "device buffer" plus its
    dtype/shape/order; the copy functions are synchronous. With ``host_copies`` False (a real
    device) they run in the stager's worker thread, which waits on the device while the event
    loop keeps sending; they must release the GIL. With ``host_copies`` True they are plain
    host memcpys and run on the event loop itself, queued behind the sends in flight: handing
    a 4 MiB memcpy to a thread costs more CPU than the memcpy (thread wake-ups, GIL handoffs,
    the chunk crossing to another core's cache), see ``benchmarks/staging.py``."""

    name: str
    on_device: bool  # False when "device" arrays produced by this backend are host numpy arrays
    host_copies: bool  # True when the copies are host memcpys (run on the loop, not a thread)
    host_destination: bool  # empty() is plain host memory a transport may receive into

    def prepare(self, obj: Any) -> tuple[Any, np.dtype, tuple[int, ...], str]: ...

    def copy_to_host(self, src: Any, offset: int, dst: np.ndarray) -> None: ...

    def empty(self, nbytes: int) -> Any: ...

    def copy_from_host(self, dst: Any, offset: int, src: memoryview) -> None: ...

    def finalize(self, flat: Any, dtype: np.dtype, shape: tuple[int, ...], order: str) -> Any: ...


def _layout(shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int) -> str | None:
    """'C' or 'F' if the strides describe a contiguous layout (None = not contiguous)."""
    if strides is None:
        return "C"
    c = _contiguous_strides(shape, itemsize, "C")
    if tuple(strides) == c or math.prod(shape) <= 1:
        return "C"
    if tuple(strides) == _contiguous_strides(shape, itemsize, "F"):
        return "F"
    return None


def _contiguous_strides(shape: tuple[int, ...], itemsize: int, order: str) -> tuple[int, ...]:
    out: list[int] = []
    acc = itemsize
    dims = reversed(shape) if order == "C" else shape
    for d in dims:
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out)) if order == "C" else tuple(out)


def _contiguous(a: Any, xp: Any) -> tuple[Any, str]:
    """``a`` (numpy or CuPy, module ``xp``) in one contiguous layout, and which one."""
    if a.flags.c_contiguous:
        return a, "C"
    if a.flags.f_contiguous:
        return a, "F"
    return xp.ascontiguousarray(a), "C"


def _flat_bytes(a: Any, xp: Any) -> Any:
    """The bytes of a contiguous array as a flat uint8 view (no copy)."""
    return a.reshape(-1, order="A").view(xp.uint8) if a.size else xp.empty(0, xp.uint8)


class SimulatedDeviceBackend:
    """Host memory playing the part of device memory (tests and benchmarks only).

    Accepts numpy arrays, ``__cuda_array_interface__`` objects whose pointer is host memory,
    and DLPack objects claiming a CUDA device whose capsule describes host memory. The
    "device to host" and "host to device" copies are real memcpys (numpy releases the GIL for
    them), so every staged byte is copied twice, as on a GPU. Destination arrays come from a
    :class:`CachingAllocator`, which models CuPy's default ``MemoryPool``: freed device memory
    is kept and handed out again, so receiving the same size twice does not fault in fresh
    memory (on the CPU that first touch costs more than the copy itself)."""

    name = "simulated"
    on_device = False
    host_copies = True
    host_destination = False  # plays device memory: the host-to-device copy is never skipped

    def __init__(self, cache_bytes: int = 4 << 30) -> None:
        self.memory = CachingAllocator(cache_bytes)

    def _as_numpy(self, obj: Any) -> np.ndarray:
        if isinstance(obj, np.ndarray):
            return obj
        cai = getattr(obj, "__cuda_array_interface__", None)
        if cai is not None:
            dt = np.dtype(cai["typestr"])
            shape = tuple(int(s) for s in cai["shape"])
            ptr, _readonly = cai["data"]
            strides = cai.get("strides")
            n = math.prod(shape)
            if n == 0:
                return np.empty(shape, dtype=dt)
            if strides is None:
                span = n * dt.itemsize
            else:
                span = sum((d - 1) * abs(s) for d, s in zip(shape, strides, strict=True)) + dt.itemsize
            raw = (ctypes.c_ubyte * span).from_address(int(ptr))
            base = np.frombuffer(raw, dtype=np.uint8)
            return np.lib.stride_tricks.as_strided(base.view(dt)[:1], shape=shape, strides=strides or None)
        if hasattr(obj, "__dlpack__"):
            return np.from_dlpack(_HostCapsule(obj.__dlpack__()))
        raise SerializationError(f"{type(obj).__name__} is not an array the simulated backend understands")

    def prepare(self, obj: Any) -> tuple[Any, np.dtype, tuple[int, ...], str]:
        a = self._as_numpy(obj)
        check_dtype(a.dtype)
        a, order = _contiguous(a, np)
        return _flat_bytes(a, np), a.dtype, tuple(a.shape), order

    def copy_to_host(self, src: Any, offset: int, dst: np.ndarray) -> None:
        np.copyto(dst, src[offset : offset + dst.nbytes])

    def empty(self, nbytes: int) -> Any:
        return self.memory.empty(nbytes)

    def copy_from_host(self, dst: Any, offset: int, src: memoryview) -> None:
        s = np.frombuffer(src, dtype=np.uint8)
        np.copyto(dst[offset : offset + s.nbytes], s)

    def finalize(self, flat: Any, dtype: np.dtype, shape: tuple[int, ...], order: str) -> Any:
        return flat.view(dtype).reshape(shape, order=order)


class _Block:
    """Owner of one allocator block: every array on it keeps it alive (numpy points views
    at the first non-array owner), and its finalizer hands the memory back to the cache."""

    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, raw: np.ndarray, nbytes: int) -> None:
        self.__array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (raw.ctypes.data, False),
            "version": 3,
        }


class CachingAllocator:
    """Host memory blocks reused across allocations, like CuPy's device ``MemoryPool``.

    Freeing an array returns its block to a per-size free list (when the last view of it is
    garbage-collected), and the next allocation of that size takes it back instead of
    faulting in fresh pages -- first-touch of fresh memory costs more than the copy that fills
    it. At most ``cache_bytes`` of idle blocks are kept; :meth:`trim` frees them all."""

    def __init__(self, cache_bytes: int = 4 << 30) -> None:
        self.cache_bytes = int(cache_bytes)
        self._lock = threading.Lock()  # blocks come back from whichever thread drops the last view
        self._free: dict[int, list[np.ndarray]] = {}
        self._idle = 0
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _round(nbytes: int) -> int:
        return max(512, -(-nbytes // 512) * 512)  # CuPy's pool rounds to 512 bytes too

    def empty(self, nbytes: int) -> np.ndarray:
        """A flat uint8 array of ``nbytes`` (uninitialised)."""
        size = self._round(nbytes)
        with self._lock:
            blocks = self._free.get(size)
            raw = blocks.pop() if blocks else None
            if raw is not None:
                self._idle -= size
                self.hits += 1
            else:
                self.misses += 1
        if raw is None:
            raw = np.empty(size, dtype=np.uint8)
        owner = _Block(raw, nbytes)
        weakref.finalize(owner, self._give_back, raw, size).atexit = False
        return np.asarray(owner)

    def _give_back(self, raw: np.ndarray, size: int) -> None:
        with self._lock:
            if self._idle + size <= self.cache_bytes:
                self._free.setdefault(size, []).append(raw)
                self._idle += size

    @property
    def idle_bytes(self) -> int:
        return self._idle

    def trim(self) -> None:
        """Free every idle block (CuPy: ``free_all_blocks``)."""
        with self._lock:
            self._free.clear()
            self._idle = 0


class _HostCapsule:
    """Presents a DLPack capsule as CPU-resident so numpy imports it (simulation only)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DL_CPU, 0)

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule


class HostTarget(SimulatedDeviceBackend):
    """Receiver side without a GPU: device arrays arrive as numpy arrays.

    Arrays come from a smaller cache (1 GiB of idle blocks by default, :meth:`Stager.close`
    frees it): a node receiving the same large array repeatedly reuses its memory. A
    transport that lets the receiver choose where frames land (:meth:`Receiver.alloc`) puts
    the chunks straight into the final array: no staging copy at all."""

    name = "host"
    host_destination = True

    def __init__(self, cache_bytes: int = 1 << 30) -> None:
        super().__init__(cache_bytes)


class CupyBackend:
    """CuPy on a real CUDA device. Copies run on a per-thread non-blocking stream."""

    name = "cupy"
    on_device = True
    host_copies = False
    host_destination = False

    def __init__(self, devices: Devices) -> None:
        devices.require_cuda("GPU staging")
        import cupy

        self._cp = cupy
        self._tls = threading.local()

    def _stream(self) -> Any:
        s = getattr(self._tls, "stream", None)
        if s is None:
            s = self._tls.stream = self._cp.cuda.Stream(non_blocking=True)
        return s

    def prepare(self, obj: Any) -> tuple[Any, np.dtype, tuple[int, ...], str]:
        cp = self._cp
        if isinstance(obj, cp.ndarray):
            a = obj
        elif hasattr(obj, "__cuda_array_interface__"):
            a = cp.asarray(obj)  # honours the producer's CAI stream
        else:
            a = cp.from_dlpack(obj)
        check_dtype(a.dtype)
        a, order = _contiguous(a, cp)
        # make work queued by the producer visible to our copy stream
        cp.cuda.get_current_stream().synchronize()
        flat = _flat_bytes(a, cp)
        return flat, np.dtype(a.dtype), tuple(a.shape), order

    def copy_to_host(self, src: Any, offset: int, dst: np.ndarray) -> None:
        if dst.nbytes == 0:
            return
        s = self._stream()
        with src.device:
            self._cp.cuda.runtime.memcpyAsync(int(dst.ctypes.data), int(src.data.ptr) + offset, dst.nbytes, 2, s.ptr)
            s.synchronize()

    def empty(self, nbytes: int) -> Any:
        return self._cp.empty(nbytes, dtype=self._cp.uint8)  # on the caller's current device

    def copy_from_host(self, dst: Any, offset: int, src: memoryview) -> None:
        if src.nbytes == 0:
            return
        s = self._stream()
        host = np.frombuffer(src, dtype=np.uint8)
        with dst.device:
            self._cp.cuda.runtime.memcpyAsync(int(dst.data.ptr) + offset, int(host.ctypes.data), host.nbytes, 1, s.ptr)
            s.synchronize()

    def finalize(self, flat: Any, dtype: np.dtype, shape: tuple[int, ...], order: str) -> Any:
        return flat.view(dtype).reshape(shape, order=order)


class NoDevice:
    """Backend stand-in on nodes without CUDA: every device path fails with the reason."""

    name = "none"
    on_device = False
    host_copies = False
    host_destination = False

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def _fail(self, *_: Any, **__: Any) -> Any:
        raise DeviceUnavailable(f"no CUDA device: cannot stage a device array ({self.reason})")

    prepare = copy_to_host = empty = copy_from_host = finalize = _fail
