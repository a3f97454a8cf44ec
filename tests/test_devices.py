"""Device discovery is guarded: on this CPU-only machine it reports zero GPUs with reasons."""

from __future__ import annotations

import sys
import types

import pytest

from aionet.devices import Devices, DeviceUnavailable, cuda_available, discover, gpu_count


def test_discover_reports_cpu_memory_and_no_gpus_here():
    d = Devices()
    info = d.discover()
    assert info["cpu_count"] >= 1
    assert info["memory_total"] > 0 and 0 <= info["memory_available"] <= info["memory_total"]
    assert isinstance(info["gpus"], list)
    assert set(info["gpu_probe"]) == {"cupy", "nvml"}
    if not info["cuda_available"]:
        assert info["gpu_probe"]["cupy"]  # says why


def test_module_functions_and_resources():
    d = Devices()
    assert discover(d)["cpu_count"] == d.discover()["cpu_count"]
    assert gpu_count(d) == len(d.discover()["gpus"])
    assert cuda_available(d) == d.cuda_available()
    assert d.resources()["cpu"] >= 1


def test_static_probe_is_cached_on_the_object(monkeypatch):
    d = Devices()
    d.discover()
    calls = []
    monkeypatch.setattr(Devices, "_probe_cupy", staticmethod(lambda: calls.append(1) or (False, "x")))
    for _ in range(5):
        d.discover()
        d.cuda_available()
    assert calls == []  # static facts are not re-probed
    Devices().cuda_available()
    assert calls == [1]  # a fresh object probes again


def test_cupy_import_without_driver_is_not_cuda(monkeypatch):
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    d = Devices(use_nvml=False)
    assert not d.cuda_available()
    assert "no usable CUDA device" in d.cuda_reason()
    with pytest.raises(DeviceUnavailable, match="no CUDA device"):
        d.require_cuda("staging")


def test_cupy_runtime_error_is_guarded(monkeypatch):
    class CUDARuntimeError(RuntimeError):
        pass

    def boom():
        raise CUDARuntimeError("cudaErrorNoDevice")

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(is_available=boom)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    d = Devices(use_nvml=False)
    assert not d.cuda_available() and "cudaErrorNoDevice" in d.cuda_reason()
    assert d.discover()["gpus"] == []


def test_nvml_failure_is_guarded(monkeypatch):
    fake = types.ModuleType("pynvml")

    def init():
        raise RuntimeError("NVML Shared Library Not Found")

    fake.nvmlInit = init
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    d = Devices(use_cupy=False)
    assert d.gpu_count() == 0
    assert "NVML unavailable" in d.discover()["gpu_probe"]["nvml"]


def test_nvml_gpus_are_reported(monkeypatch):
    fake = types.ModuleType("pynvml")
    mem = types.SimpleNamespace(total=16 << 30, used=1 << 30)
    fake.nvmlInit = lambda: None
    fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetCount = lambda: 2
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetName = lambda h: b"Tesla T4"
    fake.nvmlDeviceGetMemoryInfo = lambda h: mem
    fake.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    fake.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=37)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    d = Devices(use_cupy=False)
    assert d.gpu_count() == 2
    gpus = d.discover()["gpus"]
    assert gpus[1] == {
        "index": 1,
        "name": "Tesla T4",
        "memory_total": 16 << 30,
        "memory_used": 1 << 30,
        "utilization": 37.0,
        "uuid": "GPU-1",
    }
    assert d.resources()["gpu"] == 2
    d.close()


@pytest.mark.skipif(not Devices(use_nvml=False).cuda_available(), reason="no CUDA device")
def test_real_gpu_is_found():
    d = Devices()
    assert d.gpu_count() >= 1 and d.discover()["gpus"][0]["memory_total"] > 0
