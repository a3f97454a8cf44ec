"""Load reports: how busy a node is and what devices it has, in a form compact enough to ride
on every heartbeat.

Why compact keys on the wire: a report travels several times per second to a few peers and is
relayed by gossip, so its size is multiplied by the heartbeat rate. :meth:`LoadReport.to_dict`
gives the readable form for ``node.members()`` and ``aionet status``.

Sampling is cheap (psutil counters, a task count, the loop lag already measured by the
membership's lag task). GPU numbers come from :mod:`aionet.devices` when that module and a GPU
are present; the first probe may import CuPy or NVML, which can take seconds, so it runs in a
thread and the report carries an empty GPU list until it returns.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from ..log import get_logger

log = get_logger("aionet.load")


@dataclass(frozen=True)
class GpuLoad:
    index: int
    name: str
    memory_used: int
    memory_total: int
    utilization: float | None  # percent; None when the driver cannot tell
    temperature_c: float | None = None  # NVML only
    power_w: float | None = None  # NVML only

    def to_wire(self) -> list[Any]:
        return [self.index, self.name, self.memory_used, self.memory_total, self.utilization, self.temperature_c,
                self.power_w]  # fmt: skip

    @classmethod
    def from_wire(cls, w: Any) -> GpuLoad:
        idx, name, used, total, util = w[:5]  # 5 fields from nodes before temperature and power
        temp, power = (w[5], w[6]) if len(w) >= 7 else (None, None)
        return cls(int(idx), str(name), int(used), int(total), _opt(util), _opt(temp), _opt(power))

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "memory_used": self.memory_used,
            "memory_total": self.memory_total,
            "utilization": self.utilization,
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
        }


def _opt(v: Any) -> float | None:
    return None if v is None else float(v)


@dataclass(frozen=True)
class LoadReport:
    """One node's load at one moment. ``seq`` increases with every new sample."""

    seq: int = 0
    cpu_percent: float = 0.0  # whole machine
    process_cpu_percent: float = 0.0  # this node's process (100 = one core)
    cpu_count: int = 1
    memory_used: int = 0
    memory_total: int = 0
    rss: int = 0
    tasks: int = 0  # asyncio tasks on the node's loop (its run queue of coroutines)
    loop_lag_ms: float = 0.0
    max_stall_ms: float = 0.0  # loop lateness that keeps recurring (2nd-worst per-sample max, ~10 s)
    load_avg: float = 0.0  # 1-minute OS load average
    gpus: tuple[GpuLoad, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the scheduler's queue length

    @classmethod
    def unknown(cls) -> LoadReport:
        """The stand-in for a member that has not reported yet: all zeros, no CPUs, no GPUs."""
        return cls(cpu_count=0)

    def to_wire(self) -> dict[str, Any]:
        w: dict[str, Any] = {
            "s": self.seq,
            "c": round(self.cpu_percent, 1),
            "p": round(self.process_cpu_percent, 1),
            "n": self.cpu_count,
            "m": [self.memory_used, self.memory_total],
            "r": self.rss,
            "t": self.tasks,
            "l": round(self.loop_lag_ms, 2),
            "st": round(self.max_stall_ms, 1),
            "a": round(self.load_avg, 2),
            "g": [g.to_wire() for g in self.gpus],
        }
        if self.extra:
            w["x"] = self.extra
        return w

    @classmethod
    def from_wire(cls, w: Any) -> LoadReport:
        """Parse a peer's report; raises ValueError/TypeError/KeyError on garbage."""
        if not isinstance(w, dict):
            raise TypeError("load report is not a map")
        used, total = w["m"]
        extra = w.get("x") or {}
        if not isinstance(extra, dict):
            raise TypeError("load report extra is not a map")
        return cls(
            seq=int(w["s"]),
            cpu_percent=float(w["c"]),
            process_cpu_percent=float(w["p"]),
            cpu_count=int(w["n"]),
            memory_used=int(used),
            memory_total=int(total),
            rss=int(w["r"]),
            tasks=int(w["t"]),
            loop_lag_ms=float(w["l"]),
            max_stall_ms=float(w.get("st", 0.0)),
            load_avg=float(w["a"]),
            gpus=tuple(GpuLoad.from_wire(g) for g in w["g"]),
            extra=extra,
        )

    def to_dict(self) -> dict[str, Any]:
        """Readable load (``members()[name]["load"]``)."""
        return {
            "cpu_percent": self.cpu_percent,
            "process_cpu_percent": self.process_cpu_percent,
            "memory_used": self.memory_used,
            "memory_total": self.memory_total,
            "rss": self.rss,
            "tasks": self.tasks,
            "loop_lag_ms": self.loop_lag_ms,
            "max_stall_ms": self.max_stall_ms,
            "load_avg": self.load_avg,
            "gpu_utilization": [g.utilization for g in self.gpus],
            **({"extra": dict(self.extra)} if self.extra else {}),
        }

    def devices(self) -> dict[str, Any]:
        """What the node has (``members()[name]["devices"]``); no GPU is an empty list."""
        return {
            "cpu_count": self.cpu_count,
            "memory_total": self.memory_total,
            "gpus": [g.to_dict() for g in self.gpus],
        }


class LoadSampler:
    """Produces this node's :class:`LoadReport`; one per node (no shared state).

    ``lag_ms`` and ``stall_ms`` return the loop lag and recent worst stall measured elsewhere
    (the membership's lag task), so sampling never sleeps. ``devices`` is an object with
    ``discover()`` (the node's :class:`aionet.devices.Devices`); without one, reports
    carry no GPUs.
    """

    def __init__(
        self,
        lag_ms: Callable[[], float] = lambda: 0.0,
        stall_ms: Callable[[], float] = lambda: 0.0,
        devices: Any = None,
    ):
        self._lag_ms = lag_ms
        self._stall_ms = stall_ms
        self._devices = devices
        self._proc = psutil.Process(os.getpid())
        self._seq = 0
        self._gpus: tuple[GpuLoad, ...] = ()
        self._has_gpus: bool | None = None  # unknown until the first probe returned
        self._gpu_task: asyncio.Task[None] | None = None
        self._extra: dict[str, Callable[[], Any]] = {}
        self.last: LoadReport = LoadReport(cpu_count=psutil.cpu_count() or 1)
        # prime the cpu_percent counters (their first call returns a meaningless 0.0)
        psutil.cpu_percent(interval=None)
        self._proc.cpu_percent(interval=None)

    def add_field(self, name: str, fn: Callable[[], Any]) -> None:
        """Report ``fn()`` under ``extra[name]`` (must be msgpack-able and small)."""
        self._extra[name] = fn

    def sample(self) -> LoadReport:
        """Take a new sample now (cheap, non-blocking) and kick a GPU refresh if needed."""
        self._seq += 1
        try:
            vm = psutil.virtual_memory()
            mem_used, mem_total = int(vm.total - vm.available), int(vm.total)
            cpu = float(psutil.cpu_percent(interval=None))
            pcpu = float(self._proc.cpu_percent(interval=None))
            rss = int(self._proc.memory_info().rss)
            la = float(os.getloadavg()[0]) if hasattr(os, "getloadavg") else 0.0
        except Exception as exc:  # psutil on exotic platforms: report what we have
            log.debug("load sample failed", error=repr(exc))
            mem_used = mem_total = rss = 0
            cpu = pcpu = la = 0.0
        try:
            tasks = len(asyncio.all_tasks())
        except RuntimeError:  # no running loop (tests)
            tasks = 0
        extra: dict[str, Any] = {}
        for k, fn in self._extra.items():
            try:
                extra[k] = fn()
            except Exception as exc:
                log.debug("load field failed", field=k, error=repr(exc))
        self.last = LoadReport(
            seq=self._seq,
            cpu_percent=cpu,
            process_cpu_percent=pcpu,
            cpu_count=psutil.cpu_count() or 1,
            memory_used=mem_used,
            memory_total=mem_total,
            rss=rss,
            tasks=tasks,
            loop_lag_ms=float(self._lag_ms()),
            max_stall_ms=float(self._stall_ms()),
            load_avg=la,
            gpus=self._gpus,
            extra=extra,
        )
        self._maybe_refresh_gpus()
        return self.last

    def _maybe_refresh_gpus(self) -> None:
        if self._devices is None or self._has_gpus is False:
            return
        if self._gpu_task is not None and not self._gpu_task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._gpu_task = loop.create_task(self._refresh_gpus(), name="aionet-load-gpus")

    async def _refresh_gpus(self) -> None:
        try:
            info = await asyncio.to_thread(self._devices.discover)
            gpus = tuple(
                GpuLoad(
                    int(g.get("index", i)),
                    str(g.get("name", "")),
                    int(g.get("memory_used", 0)),
                    int(g.get("memory_total", 0)),
                    _opt(g.get("utilization")),
                    _opt(g.get("temperature_c")),
                    _opt(g.get("power_w")),
                )
                for i, g in enumerate(info.get("gpus", []))
            )
        except Exception as exc:  # a broken driver must not break load reports
            log.warning("GPU probe failed; reporting no GPUs", error=repr(exc))
            gpus = ()
        self._gpus = gpus
        self._has_gpus = bool(gpus)

    async def aclose(self) -> None:
        t = self._gpu_task
        if t is not None and not t.done():
            # a thread cannot be interrupted: wait briefly, then leave it to finish on its own
            await asyncio.wait([t], timeout=2.0)


__all__ = ["GpuLoad", "LoadReport", "LoadSampler"]
