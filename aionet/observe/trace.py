"""Traces: what a node did, as Chrome trace-event JSON that Perfetto (ui.perfetto.dev) and
chrome://tracing open.

A :class:`TraceRecorder` is an :class:`~aionet.instrument.Instrument`: it turns the node's hooks
(requests made and handled, tasks queued and running, device transfers, collectives, member
events) into trace events in a bounded ring buffer, so an always-on recorder (``[trace]
enabled``) holds the last ``max_events`` and never more. ``aionet trace --connect URL`` turns a
recorder on at every member for a while (the ``aionet.trace`` service), collects and merges
them: one process per node, one row per kind of work, tasks on as many rows as ran at once, and
running tasks on rows of the device they ran on (the CPU slots, or each GPU they were given).
Times are wall-clock microseconds, so nodes on one host line up exactly (across hosts, as well
as their clocks agree).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..instrument import Instrument

__all__ = ["TRACE_SERVICE", "TraceRecorder", "chrome_trace", "device_profile", "handle_trace", "profile", "validate"]

TRACE_SERVICE = "aionet.trace"

# rows (Chrome "threads") of a node's process
TID_REQ_OUT, TID_REQ_IN, TID_TRANSFERS, TID_COLLECTIVES, TID_MEMBERS = 1, 2, 3, 4, 5
TID_RUNNING, TID_QUEUED = 100, 1000  # + lane: tasks running on CPU slots / waiting, at once
TID_GPU, GPU_STRIDE = 10_000, 1000  # + GPU index * stride + lane: tasks running on that GPU
MAX_LANES = 256  # rows per kind (more tasks at once share the last row)
ROW_NAMES = {
    TID_REQ_OUT: "requests made",
    TID_REQ_IN: "requests handled",
    TID_TRANSFERS: "device transfers",
    TID_COLLECTIVES: "collectives",
    TID_MEMBERS: "membership",
}
_SPAN_OF_STATE = {"fetching": "fetching inputs", "queued": "queued", "running": "running"}


class TraceRecorder(Instrument):
    """Trace events from one node's hooks, the newest ``max_events`` kept."""

    def __init__(self, node: str, max_events: int = 100_000, clock: Callable[[], float] = time.time) -> None:
        self.node = node
        self.events: deque[dict[str, Any]] = deque(maxlen=max(1, max_events))
        self.recorded = 0  # events ever recorded (minus the kept ones: dropped by the ring)
        self.clock = clock
        # attempt -> (state, since, name, device)
        self._tasks: dict[tuple[str, int, int], tuple[str, float, str, str]] = {}
        self._lanes: dict[int, list[float]] = {}  # a row kind's base tid -> end time of each of its lanes

    @property
    def dropped(self) -> int:
        return self.recorded - len(self.events)

    # ---------------------------------------------------------------- recording
    def _add(self, event: dict[str, Any]) -> None:
        self.recorded += 1
        self.events.append(event)

    def _span(self, cat: str, name: str, tid: int, start: float, seconds: float, args: dict[str, Any]) -> None:
        self._add({"name": name, "cat": cat, "ph": "X", "ts": round(start * 1e6, 1),
                   "dur": round(max(seconds, 0.0) * 1e6, 1), "tid": tid, "args": args})  # fmt: skip

    def _lane(self, base: int, start: float, end: float) -> int:
        """The lowest row of ``base``'s rows free at ``start`` (tasks at once get rows of their own)."""
        lanes = self._lanes.setdefault(base, [])
        for i, busy_until in enumerate(lanes):
            if busy_until <= start:
                lanes[i] = end
                return base + i
        if len(lanes) < MAX_LANES:
            lanes.append(end)
            return base + len(lanes) - 1
        return base + MAX_LANES - 1

    def request_finished(self, peer: str, service: str, seconds: float, error: str | None) -> None:
        now = self.clock()
        self._span("request", f"{service} → {peer}", TID_REQ_OUT, now - seconds, seconds,
                   {"peer": peer, "service": service, "error": error})  # fmt: skip

    def request_handled(self, peer: str, service: str, seconds: float, error: str | None) -> None:
        now = self.clock()
        self._span("request", f"{service} ← {peer}", TID_REQ_IN, now - seconds, seconds,
                   {"peer": peer, "service": service, "error": error})  # fmt: skip

    def transfer_finished(self, peer: str, direction: str, nbytes: int, seconds: float, path: str) -> None:
        now = self.clock()
        rate = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        self._span("transfer", f"{direction} {_size(nbytes)} {'→' if direction == 'send' else '←'} {peer}",
                   TID_TRANSFERS, now - seconds, seconds,
                   {"peer": peer, "bytes": nbytes, "path": path, "GB/s": round(rate, 3)})  # fmt: skip

    def collective_finished(self, group: str, op: str, nbytes: int, seconds: float, error: str | None) -> None:
        now = self.clock()
        self._span("collective", f"{op} {_size(nbytes)}", TID_COLLECTIVES, now - seconds, seconds,
                   {"group": group, "bytes": nbytes, "error": error})  # fmt: skip

    def member_changed(self, name: str, kind: str, previous: str | None, reason: str) -> None:
        self._add({"name": f"{name} {kind}", "cat": "membership", "ph": "i", "s": "p",
                   "ts": round(self.clock() * 1e6, 1), "tid": TID_MEMBERS,
                   "args": {"member": name, "previous": previous, "reason": reason}})  # fmt: skip

    def task_changed(self, owner: str, task_id: int, attempt: int, name: str, state: str, device: str = "cpu") -> None:
        now = self.clock()
        key = (owner, task_id, attempt)
        prev = self._tasks.pop(key, None)
        if prev is not None:
            pstate, since, pname, pdevice = prev
            label = _SPAN_OF_STATE.get(pstate)
            args = {"state": label, "owner": owner, "task": task_id, "attempt": attempt}
            if label is None:
                pass
            elif pstate != "running":
                self._span("task", pname, self._lane(TID_QUEUED, since, now), since, now - since, args)
            else:
                # one span per device it held, so each GPU's row shows it busy; the profile
                # counts the task once per node ("also": the same run on another of its GPUs)
                for i, base in enumerate(_device_bases(pdevice)):
                    extra = {"device": pdevice} if i == 0 else {"device": pdevice, "also": True}
                    self._span("task", pname, self._lane(base, since, now), since, now - since, {**args, **extra})
        if state != "finished":
            self._tasks[key] = (state, now, name, device)
            if len(self._tasks) > 100_000:  # attempts that never finish (a node gone mid-task): forget the oldest
                self._tasks.pop(next(iter(self._tasks)))

    # ---------------------------------------------------------------- reading
    def since(self, ts_us: float = 0.0) -> list[dict[str, Any]]:
        return [e for e in self.events if e["ts"] + e.get("dur", 0.0) >= ts_us]


def _device_bases(device: str) -> list[int]:
    """The row bases of a task's device: ``"cpu"`` -> the CPU rows; ``"gpu:0+1"`` -> GPU 0's and 1's."""
    if device.startswith("gpu:"):
        idx = [int(x) for x in device[4:].split("+") if x.isdigit() and int(x) < 1000]
        if idx:
            return [TID_GPU + GPU_STRIDE * i for i in idx]
    return [TID_RUNNING]


def handle_trace(node: Any, arg: Any) -> dict[str, Any]:
    """The ``aionet.trace`` service: ``{"op": "start", "max_events": n}`` turns a recorder on
    (if ``[trace]`` has not already); ``{"op": "collect", "since": µs, "stop": bool}`` returns
    what it holds (and turns an on-demand recorder off)."""
    if not isinstance(arg, Mapping) or arg.get("op") not in ("start", "collect"):
        raise ValueError('aionet.trace takes {"op": "start" | "collect", ...}')
    rec: TraceRecorder | None = node.tracer
    if arg["op"] == "start":
        if rec is None:
            rec = TraceRecorder(node.name, int(arg.get("max_events") or node.config.trace.max_events))
            node.tracer = rec
            node.instruments.add(rec)
        return {"node": node.name, "now_us": time.time() * 1e6, "always_on": node.config.trace.enabled}
    events = rec.since(float(arg.get("since") or 0.0)) if rec is not None else []
    out = {"node": node.name, "pid": os.getpid(), "events": events, "dropped": rec.dropped if rec else 0}
    if arg.get("stop") and rec is not None and not node.config.trace.enabled:
        node.instruments.remove(rec)
        node.tracer = None
    return out


def chrome_trace(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge nodes' collected events into one Chrome trace (JSON object format): a process per
    node (named, sorted by name), a named row per kind of work."""
    events: list[dict[str, Any]] = []
    for pid, part in enumerate(sorted(parts, key=lambda p: str(p["node"])), start=1):
        node = str(part["node"])
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": node}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        rows: set[int] = set()
        for e in part["events"]:
            events.append({**e, "pid": pid})
            rows.add(int(e["tid"]))
        for tid in sorted(rows):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": _row(tid)}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"producer": "aionet trace"}}


def _row(tid: int) -> str:
    if tid in ROW_NAMES:
        return ROW_NAMES[tid]
    if tid >= TID_GPU:
        gpu, lane = divmod(tid - TID_GPU, GPU_STRIDE)
        return f"gpu {gpu}: tasks running {lane}"
    if tid >= TID_QUEUED:
        return f"tasks waiting {tid - TID_QUEUED}"
    return f"cpu: tasks running {tid - TID_RUNNING}"


def validate(trace: Mapping[str, Any]) -> list[str]:
    """Problems that would stop Perfetto or chrome://tracing from reading ``trace`` (empty: none)."""
    problems: list[str] = []
    evs = trace.get("traceEvents")
    if not isinstance(evs, list):
        return ["traceEvents must be a list"]
    for i, e in enumerate(evs):
        ph = e.get("ph")
        if ph not in ("X", "i", "M"):
            problems.append(f"event {i}: unknown phase {ph!r}")
        if not isinstance(e.get("name"), str) or not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            problems.append(f"event {i}: name (str), pid and tid (int) are required")
        if ph in ("X", "i") and not isinstance(e.get("ts"), (int, float)):
            problems.append(f"event {i}: ts must be a number")
        if ph == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            problems.append(f"event {i}: a complete event needs dur >= 0")
    return problems


def profile(trace: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Seconds per node: tasks running and waiting, requests made and handled, transfers and
    collectives, and the communication share (time in communication over that plus task compute)."""
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    out: dict[str, dict[str, float]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") != "X":
            continue
        row = out.setdefault(names.get(e["pid"], str(e["pid"])), dict.fromkeys(_PROFILE_KEYS, 0.0))
        s = e["dur"] / 1e6
        cat, tid = e.get("cat"), e["tid"]
        if cat == "task":
            if not _is_running(e):
                row["task_waiting_s"] += s
            elif not e.get("args", {}).get("also"):
                row["task_running_s"] += s
        elif cat == "request":
            row["requests_made_s" if tid == TID_REQ_OUT else "requests_handled_s"] += s
        elif cat == "transfer":
            row["transfers_s"] += s
            row["transfer_bytes"] += float(e.get("args", {}).get("bytes", 0))
        elif cat == "collective":
            row["collectives_s"] += s
    for row in out.values():
        comm = row["requests_made_s"] + row["transfers_s"] + row["collectives_s"]
        total = comm + row["task_running_s"]
        row["communication_share"] = comm / total if total > 0 else 0.0
    return out


def _is_running(e: Mapping[str, Any]) -> bool:
    state = e.get("args", {}).get("state")
    if state is not None:
        return bool(state == "running")
    return TID_RUNNING <= int(e["tid"]) < TID_QUEUED or int(e["tid"]) >= TID_GPU  # traces without args


def device_profile(trace: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """node -> device (``cpu``, ``gpu 0``...) -> ``{"tasks": n, "running_s": s}``: the time tasks
    ran on each device of each node (a task holding two GPUs counts on both)."""
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") != "task" or not _is_running(e):
            continue
        tid = int(e["tid"])
        device = f"gpu {(tid - TID_GPU) // GPU_STRIDE}" if tid >= TID_GPU else "cpu"
        node = out.setdefault(names.get(e["pid"], str(e["pid"])), {})
        row = node.setdefault(device, {"tasks": 0.0, "running_s": 0.0})
        row["tasks"] += 1
        row["running_s"] += e["dur"] / 1e6
    return out


_PROFILE_KEYS = ("task_running_s", "task_waiting_s", "requests_made_s", "requests_handled_s", "transfers_s",
                 "transfer_bytes", "collectives_s", "communication_share")  # fmt: skip


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
