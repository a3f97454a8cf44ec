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
    fake.NVML_TEMPERATURE_GPU = 0
    fake.nvmlDeviceGetTemperature = lambda h, sensor: 61
    fake.nvmlDeviceGetPowerUsage = lambda h: 70500  # milliwatts
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
        "temperature_c": 61.0,
        "power_w": 70.5,
    }
    assert d.resources()["gpu"] == 2
    d.close()


@pytest.mark.skipif(not Devices(use_nvml=False).cuda_available(), reason="no CUDA device")
def test_real_gpu_is_found():
    d = Devices()
    assert d.gpu_count() >= 1 and d.discover()["gpus"][0]["memory_total"] > 0


async def test_a_node_builds_one_devices_and_hands_it_down(monkeypatch):
    """Issue 12: every part of a node that asks about devices (staging pool and backend, load
    reports, scheduler resources, aionet.info) asks the node's one Devices; none builds its own
    (each would probe CuPy/NVML again)."""
    import aionet
    import aionet.scheduler.service as sched_service

    built: list[Devices] = []
    probed: list[Devices] = []
    orig_init, orig_probe = Devices.__init__, Devices._probe

    def counting_init(self, *a, **kw):
        built.append(self)
        orig_init(self, *a, **kw)

    def recording_probe(self):
        probed.append(self)
        orig_probe(self)

    asked: list[tuple[str, Devices]] = []

    def recording(name):
        orig = getattr(Devices, name)

        def call(self, *a, **kw):
            asked.append((name, self))
            return orig(self, *a, **kw)

        return call

    monkeypatch.setattr(Devices, "__init__", counting_init)
    monkeypatch.setattr(Devices, "_probe", recording_probe)
    for name in ("discover", "gpu_count", "cuda_available"):
        monkeypatch.setattr(Devices, name, recording(name))
    # pretend the host has an NVIDIA device file, so the scheduler really asks for a GPU count
    monkeypatch.setattr(sched_service, "glob", types.SimpleNamespace(glob=lambda pattern: ["/dev/nvidia0"]))
    node = aionet.Node(name="a", listen="inproc://")
    try:
        assert built == [node.devices]
        node._device.stager  # noqa: B018 - the staging pool and backend, built on first use
        assert ("cuda_available", node.devices) in asked
        asked.clear()
        await node.membership.load._refresh_gpus()  # load reports
        assert ("discover", node.devices) in asked
        asked.clear()
        await node.scheduler._detect_resources()  # GPUs and their memory (gpu, gpu_memory)
        assert ("discover", node.devices) in asked
        asked.clear()
        await node._info_service(None)
        assert ("discover", node.devices) in asked
    finally:
        node._device.close()
    assert built == [node.devices]
    assert probed and all(d is node.devices for d in probed)
