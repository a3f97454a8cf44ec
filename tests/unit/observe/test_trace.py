"""TraceRecorder fed hooks on a fed clock: spans, rows, the ring bound, merging and the profile."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from aionet.observe.trace import (
    GPU_STRIDE,
    TID_COLLECTIVES,
    TID_GPU,
    TID_QUEUED,
    TID_REQ_IN,
    TID_REQ_OUT,
    TID_RUNNING,
    TID_TRANSFERS,
    TraceRecorder,
    chrome_trace,
    device_profile,
    profile,
    validate,
)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_hooks_become_complete_events_ending_now() -> None:
    clock = Clock()
    rec = TraceRecorder("a", clock=clock)
    rec.request_finished("b", "echo", 0.25, None)
    rec.request_handled("b", "work", 0.5, "ValueError")
    rec.transfer_finished("b", "send", 64 << 20, 0.1, "staged")
    rec.collective_finished("g", "allreduce", 4096, 0.002, None)
    rec.member_changed("c", "dead", "alive", "connection lost")
    out, handled, xfer, coll, member = rec.events
    assert (out["ph"], out["tid"], out["ts"], out["dur"]) == ("X", TID_REQ_OUT, 999.75e6, 0.25e6)
    assert handled["tid"] == TID_REQ_IN and handled["args"]["error"] == "ValueError"
    assert xfer["tid"] == TID_TRANSFERS and xfer["name"] == "send 64.0 MiB → b" and xfer["args"]["GB/s"] == 0.671
    assert coll["tid"] == TID_COLLECTIVES and coll["name"] == "allreduce 4.0 KiB"
    assert member["ph"] == "i" and member["name"] == "c dead"


def test_task_states_become_waiting_and_running_spans_on_separate_rows_when_concurrent() -> None:
    clock = Clock()
    rec = TraceRecorder("w", clock=clock)
    rec.task_changed("o", 1, 1, "o:1", "queued")
    rec.task_changed("o", 2, 1, "o:2", "queued")
    clock.t += 0.1
    rec.task_changed("o", 1, 1, "o:1", "running")
    rec.task_changed("o", 2, 1, "o:2", "running")
    clock.t += 1.0
    rec.task_changed("o", 1, 1, "o:1", "finished")
    rec.task_changed("o", 2, 1, "o:2", "finished")
    rec.task_changed("o", 3, 1, "o:3", "running")  # after both: reuses the first row
    clock.t += 0.5
    rec.task_changed("o", 3, 1, "o:3", "finished")
    spans = [(e["name"], e["args"]["state"], e["tid"], e["dur"]) for e in rec.events]
    assert spans == [
        ("o:1", "queued", TID_QUEUED, 0.1e6),
        ("o:2", "queued", TID_QUEUED + 1, 0.1e6),
        ("o:1", "running", TID_RUNNING, 1e6),
        ("o:2", "running", TID_RUNNING + 1, 1e6),
        ("o:3", "running", TID_RUNNING, 0.5e6),
    ]


def test_the_ring_keeps_the_newest_and_counts_the_dropped() -> None:
    rec = TraceRecorder("a", max_events=10, clock=Clock())
    for i in range(25):
        rec.request_finished("b", f"s{i}", 0.001, None)
    assert len(rec.events) == 10 and rec.dropped == 15
    assert rec.events[0]["name"].startswith("s15 ")


def test_merged_trace_is_valid_json_with_named_processes_and_rows() -> None:
    a, b = TraceRecorder("b-node", clock=Clock()), TraceRecorder("a-node", clock=Clock())
    a.request_finished("a-node", "echo", 0.01, None)
    b.request_handled("b-node", "echo", 0.005, None)
    b.task_changed("o", 1, 1, "o:1", "running")
    b.task_changed("o", 1, 1, "o:1", "finished")
    trace = json.loads(json.dumps(chrome_trace([{"node": r.node, "events": list(r.events)} for r in (a, b)])))
    assert validate(trace) == []
    meta = {(e["pid"], e["name"]): e["args"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert meta[(1, "process_name")] == {"name": "a-node"} and meta[(2, "process_name")] == {"name": "b-node"}
    rows = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert rows == {"requests made", "requests handled", "cpu: tasks running 0"}
    prof = profile(trace)
    assert prof["a-node"]["requests_handled_s"] == 0.005 and prof["b-node"]["requests_made_s"] == 0.01


def test_running_tasks_get_a_track_per_device_and_the_profile_sums_per_node_and_device() -> None:
    """A GPU task runs on its GPU's row (each GPU it holds, for a multi-GPU one); a CPU task on
    the CPU rows; the node total counts each task once, the device rows count device time."""
    clock = Clock()
    rec = TraceRecorder("w", clock=clock)
    rec.task_changed("o", 1, 1, "o:1", "queued")
    clock.t += 0.5
    rec.task_changed("o", 1, 1, "o:1", "running", "gpu:1")
    rec.task_changed("o", 2, 1, "o:2", "running", "cpu")
    rec.task_changed("o", 3, 1, "o:3", "running", "gpu:0+1")  # two GPUs at once
    clock.t += 2.0
    for tid in (1, 2, 3):
        rec.task_changed("o", tid, 1, f"o:{tid}", "finished", "cpu")
    rows = {(e["name"], e["tid"]) for e in rec.events if e["args"]["state"] == "running"}
    assert rows == {
        ("o:1", TID_GPU + GPU_STRIDE),  # gpu 1, lane 0
        ("o:2", TID_RUNNING),
        ("o:3", TID_GPU),  # gpu 0, lane 0
        ("o:3", TID_GPU + GPU_STRIDE + 1),  # gpu 1, lane 1: o:1 holds lane 0 at the same time
    }
    trace = json.loads(json.dumps(chrome_trace([{"node": "w", "events": list(rec.events)}])))
    assert validate(trace) == []
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {"gpu 0: tasks running 0", "gpu 1: tasks running 0", "gpu 1: tasks running 1"} <= names
    assert {"cpu: tasks running 0", "tasks waiting 0"} <= names
    prof = profile(trace)["w"]
    assert prof["task_running_s"] == 6.0 and prof["task_waiting_s"] == 0.5  # o:3 counted once
    assert device_profile(trace) == {
        "w": {
            "cpu": {"tasks": 1, "running_s": 2.0},
            "gpu 0": {"tasks": 1, "running_s": 2.0},
            "gpu 1": {"tasks": 2, "running_s": 4.0},
        }
    }


def test_validate_names_what_perfetto_would_reject() -> None:
    assert validate({"traceEvents": {}}) == ["traceEvents must be a list"]
    bad = {"traceEvents": [{"name": "x", "ph": "X", "pid": 1, "tid": 1, "ts": 0}, {"ph": "B", "name": 1}]}
    problems = validate(bad)
    assert any("dur" in p for p in problems) and any("phase" in p for p in problems)


@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 2), st.sampled_from(["queued", "running", "finished"]))))
def test_any_sequence_of_task_states_gives_valid_non_negative_spans(steps) -> None:
    clock = Clock()
    rec = TraceRecorder("w", clock=clock)
    for tid, dt, state in steps:
        clock.t += dt
        rec.task_changed("o", tid, 1, f"o:{tid}", state)
    trace = chrome_trace([{"node": "w", "events": list(rec.events)}])
    assert validate(trace) == []
    assert all(e["dur"] >= 0 for e in trace["traceEvents"] if e["ph"] == "X")
