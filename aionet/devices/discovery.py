"""What compute a node has: CPU cores, memory and NVIDIA GPUs.

Used by ``aionet.info``, by load reports and by the scheduler's ``resources={"gpu": n}``.
Every probe is guarded: a missing library, a missing driver or a broken NVML never raises out
of :class:`Devices` (it reports zero GPUs and records *why* in ``discover()["gpu_probe"]``),
because a CPU-only node must start and serve even when GPU packages are installed.

CuPy is only trusted through ``cupy.cuda.is_available()``: CuPy imports fine on a machine with
no driver and then raises ``CUDARuntimeError`` on first use. NVML (``nvidia-ml-py``) gives
names, memory and utilization; CuPy is the fallback for names and memory when NVML is absent.

Static facts (CPU count, total memory, GPU names and totals, whether CUDA works) are probed once
per :class:`Devices` object; dynamic ones (available memory, GPU memory used, utilization) are
re-read on every :meth:`Devices.discover`. The cache lives on the object, so each Node owns one
and tests can build fresh ones.
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from ..errors import DeviceUnavailable
from ..log import get_logger

__all__ = ["DeviceUnavailable", "Devices", "GPUInfo", "cuda_available", "discover", "gpu_count"]

log = get_logger("aionet.devices")


@dataclass(frozen=True)
class GPUInfo:
    """One GPU as reported to peers and to the scheduler."""

    index: int
    name: str
    memory_total: int
    memory_used: int
    utilization: float | None  # percent, None when the probe cannot tell
    uuid: str = ""
    temperature_c: float | None = None  # NVML only
    power_w: float | None = None  # NVML only: board power draw

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Devices:
    """Probes this node's devices once and re-reads the dynamic numbers on demand.

    ``use_nvml`` / ``use_cupy`` exist so tests (and nodes that must not touch the GPU
    driver, e.g. pre-fork parents) can switch a probe off.
    """

    def __init__(self, *, use_nvml: bool = True, use_cupy: bool = True) -> None:
        self._use_nvml = use_nvml
        self._use_cupy = use_cupy
        self._lock = threading.Lock()
        self._probed = False
        self._cuda_ok = False
        self._cuda_reason = "not probed"
        self._nvml: Any = None  # the pynvml module once nvmlInit() succeeded
        self._nvml_reason = "not probed"
        self._static_gpus: list[GPUInfo] = []
        self._cpu_count = os.cpu_count() or 1
        self._cpu_physical: int | None = None
        self._mem_total = 0

    # ------------------------------------------------------------------ probing
    def _probe(self) -> None:
        with self._lock:
            if self._probed:
                return
            try:
                self._cpu_count = psutil.cpu_count(logical=True) or self._cpu_count
                self._cpu_physical = psutil.cpu_count(logical=False)
                self._mem_total = int(psutil.virtual_memory().total)
            except Exception as exc:  # psutil on exotic platforms
                log.warning("cpu/memory probe failed", error=repr(exc))
            self._cuda_ok, self._cuda_reason = self._probe_cupy() if self._use_cupy else (False, "cupy probe off")
            nvml_gpus = self._probe_nvml() if self._use_nvml else None
            if not self._use_nvml:
                self._nvml_reason = "nvml probe off"
            if nvml_gpus is not None:
                self._static_gpus = nvml_gpus
            elif self._cuda_ok:
                self._static_gpus = self._cupy_gpus()
            self._probed = True

    @staticmethod
    def _probe_cupy() -> tuple[bool, str]:
        try:
            import cupy
        except ImportError:
            return False, "cupy is not installed (pip install 'aionet[gpu]')"
        except Exception as exc:  # a broken install: wrong CUDA wheel, missing libs
            return False, f"cupy failed to import: {exc!r}"
        try:
            if not cupy.cuda.is_available():
                return False, "cupy is installed but reports no usable CUDA device (no driver or no GPU)"
            n = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # CUDARuntimeError and friends
            return False, f"cupy CUDA runtime error: {exc!r}"
        if n <= 0:
            return False, "CUDA runtime reports 0 devices"
        return True, f"{n} CUDA device(s) via cupy"

    def _probe_nvml(self) -> list[GPUInfo] | None:
        try:
            import pynvml
        except ImportError:
            self._nvml_reason = "nvidia-ml-py is not installed"
            return None
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded / ...
            self._nvml_reason = f"NVML unavailable: {exc}"
            return None
        self._nvml = pynvml
        self._nvml_reason = "ok"
        gpus: list[GPUInfo] = []
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                name = name.decode() if isinstance(name, bytes) else str(name)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                try:
                    uuid = pynvml.nvmlDeviceGetUUID(h)
                    uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
                except Exception:
                    uuid = ""
                gpus.append(GPUInfo(i, name, int(mem.total), int(mem.used), None, uuid))
        except Exception as exc:
            self._nvml_reason = f"NVML query failed: {exc}"
            log.warning("nvml query failed", error=repr(exc))
        return gpus

    @staticmethod
    def _cupy_gpus() -> list[GPUInfo]:
        import cupy

        out: list[GPUInfo] = []
        try:
            for i in range(cupy.cuda.runtime.getDeviceCount()):
                props = cupy.cuda.runtime.getDeviceProperties(i)
                name = props.get("name", b"")
                name = name.decode() if isinstance(name, bytes) else str(name)
                with cupy.cuda.Device(i):
                    free, total = cupy.cuda.runtime.memGetInfo()
                out.append(GPUInfo(i, name, int(total), int(total - free), None))
        except Exception as exc:
            log.warning("cupy device query failed", error=repr(exc))
        return out

    def _dynamic_gpus(self) -> list[GPUInfo]:
        """GPU list with current memory use and utilization (static names/totals reused)."""
        if not self._static_gpus:
            return []
        if self._nvml is None:
            if self._cuda_ok:
                return self._cupy_gpus()
            return list(self._static_gpus)
        pynvml = self._nvml
        out: list[GPUInfo] = []
        for g in self._static_gpus:
            used, util, temp, power = g.memory_used, None, None, None
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(g.index)
                used = int(pynvml.nvmlDeviceGetMemoryInfo(h).used)
                util = float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
                temp = float(pynvml.nvmlDeviceGetTemperature(h, getattr(pynvml, "NVML_TEMPERATURE_GPU", 0)))
                power = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0  # mW
            except Exception:
                pass  # keep what was read; a flaky NVML (or a board without sensors) must not break load reports
            out.append(GPUInfo(g.index, g.name, g.memory_total, used, util, g.uuid, temp, power))
        return out

    # ------------------------------------------------------------------ public
    def cuda_available(self) -> bool:
        """True when CuPy can really run kernels here (cached)."""
        self._probe()
        return self._cuda_ok

    def cuda_reason(self) -> str:
        """Why :meth:`cuda_available` is what it is, for error messages and ``aionet.info``."""
        self._probe()
        return self._cuda_reason

    def gpu_count(self) -> int:
        """GPUs this node can offer to tasks: NVML's count, or CuPy's when NVML is absent."""
        self._probe()
        return len(self._static_gpus)

    def require_cuda(self, what: str = "this operation") -> None:
        """Raise :class:`DeviceUnavailable` naming what is missing unless CUDA works here."""
        if not self.cuda_available():
            raise DeviceUnavailable(f"no CUDA device: {what} needs a GPU, but {self._cuda_reason}")

    def discover(self) -> dict[str, Any]:
        """A JSON-friendly snapshot: CPU, memory and GPUs (dynamic numbers are fresh)."""
        self._probe()
        try:
            vm = psutil.virtual_memory()
            mem_total, mem_avail = int(vm.total), int(vm.available)
        except Exception:
            mem_total, mem_avail = self._mem_total, 0
        return {
            "cpu_count": self._cpu_count,
            "cpu_physical": self._cpu_physical,
            "memory_total": mem_total,
            "memory_available": mem_avail,
            "gpus": [g.to_dict() for g in self._dynamic_gpus()],
            "cuda_available": self._cuda_ok,
            "gpu_probe": {"cupy": self._cuda_reason, "nvml": self._nvml_reason},
        }

    def resources(self) -> dict[str, float]:
        """What the scheduler may hand out on this node, e.g. ``{"cpu": 8, "gpu": 2}``."""
        self._probe()
        return {"cpu": float(self._cpu_count), "gpu": float(len(self._static_gpus))}

    def close(self) -> None:
        """Shut NVML down if we started it (harmless to skip; NVML refcounts inits)."""
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None


def discover(devices: Devices | None = None) -> dict[str, Any]:
    """Snapshot of this node's devices. Pass the node's :class:`Devices` to reuse its cache."""
    return (devices or Devices()).discover()


def gpu_count(devices: Devices | None = None) -> int:
    return (devices or Devices()).gpu_count()


def cuda_available(devices: Devices | None = None) -> bool:
    return (devices or Devices()).cuda_available()
