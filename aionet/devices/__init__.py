"""What compute a node has and how device (GPU) arrays get on and off the wire.

* :mod:`.discovery`: :class:`Devices` (CPU, memory, GPUs; one per Node, passed down to
  whoever needs it) and the one-shot helpers :func:`discover`, :func:`gpu_count`,
  :func:`cuda_available`.
* :mod:`.buffers`: the bounded pool of (pinned) host buffers shared by GPU staging and RDMA.
* :mod:`.backends`: the array-backend interface and its CuPy, simulated and host backends.
* :mod:`.staging`: the double-buffered staging pipeline (:class:`Stager`).
"""

from ..errors import DeviceUnavailable
from .backends import (
    ArrayBackend,
    CachingAllocator,
    CupyBackend,
    HostTarget,
    SimulatedDeviceBackend,
    is_device_array,
)
from .buffers import (
    DEFAULT_SIZE_CLASSES,
    BufferPool,
    HostAllocator,
    MemoryRegistrar,
    PinnedAllocator,
    PlainAllocator,
    PooledBuffer,
)
from .discovery import Devices, GPUInfo, cuda_available, discover, gpu_count
from .staging import DEFAULT_CHUNK_BYTES, DEFAULT_DEPTH, ChunkStream, Receiver, Stager

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_DEPTH",
    "DEFAULT_SIZE_CLASSES",
    "ArrayBackend",
    "BufferPool",
    "CachingAllocator",
    "ChunkStream",
    "CupyBackend",
    "DeviceUnavailable",
    "Devices",
    "GPUInfo",
    "HostAllocator",
    "HostTarget",
    "MemoryRegistrar",
    "PinnedAllocator",
    "PlainAllocator",
    "PooledBuffer",
    "Receiver",
    "SimulatedDeviceBackend",
    "Stager",
    "cuda_available",
    "discover",
    "gpu_count",
    "is_device_array",
]
