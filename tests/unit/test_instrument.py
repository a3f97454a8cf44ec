"""The instrument multiplexer: hooks are None until overridden, fan out to every instrument
that overrides them, and an instrument whose hook raises is removed with one log line."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from aionet.instrument import HOOKS, Instrument, Instruments


class Counting(Instrument):
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def request_finished(self, peer: str, service: str, seconds: float, error: str | None) -> None:
        self.calls.append((peer, service, error))


class Broken(Instrument):
    def request_finished(self, peer: str, service: str, seconds: float, error: str | None) -> None:
        raise RuntimeError("bug in the exporter")

    def link_event(self, peer: str, event: str, info: dict[str, Any]) -> None:
        pass


def test_no_instrument_means_every_hook_is_none() -> None:
    ins = Instruments()
    assert all(getattr(ins, h) is None for h in HOOKS)
    ins.add(Instrument())  # the base overrides nothing: still nothing to call
    assert all(getattr(ins, h) is None for h in HOOKS)


def test_only_overridden_hooks_are_set_and_all_instruments_are_called() -> None:
    a, b = Counting(), Counting()
    ins = Instruments([a])
    ins.add(b)
    ins.add(b)  # twice is once
    assert len(ins) == 2 and ins.link_event is None and ins.request_finished is not None
    ins.request_finished("p", "echo", 0.1, None)
    assert a.calls == b.calls == [("p", "echo", None)]
    ins.remove(a)
    ins.request_finished("p", "x", 0.1, "RemoteError")
    assert len(a.calls) == 1 and len(b.calls) == 2
    ins.remove(b)
    assert ins.request_finished is None


def test_an_instrument_that_raises_is_removed_and_the_others_still_run() -> None:
    good, bad = Counting(), Broken()
    ins = Instruments([bad, good])
    with capture_logs() as logs:
        ins.request_finished("p", "echo", 0.1, None)  # does not raise
        ins.request_finished("p", "echo", 0.1, None)
    assert list(ins) == [good] and len(good.calls) == 2
    assert ins.link_event is None  # bad's other hooks went with it
    [line] = [e for e in logs if e["event"].startswith("instrument removed")]
    assert line["instrument"] == "Broken" and line["hook"] == "request_finished" and line["log_level"] == "error"


def test_only_instruments_are_accepted() -> None:
    with pytest.raises(TypeError, match="subclass it"):
        Instruments([object()])  # type: ignore[list-item]


def test_a_task_hook_written_before_the_device_argument_still_gets_called() -> None:
    """task_changed gained ``device``: an instrument with the old five-argument hook keeps
    working (called without it); one with six gets it."""
    old_seen: list[str] = []
    new_seen: list[str] = []

    class Old(Instrument):
        def task_changed(self, owner: str, task_id: int, attempt: int, name: str, state: str) -> None:  # type: ignore[override]
            old_seen.append(state)

    class New(Instrument):
        def task_changed(self, owner: str, task_id: int, attempt: int, name: str, state: str, device: str) -> None:
            new_seen.append(device)

    old, new = Old(), New()
    mux = Instruments([old, new])
    assert mux.task_changed is not None
    mux.task_changed("o", 1, 1, "f", "running", "gpu:0")
    assert old_seen == ["running"] and new_seen == ["gpu:0"]
    assert list(mux) == [old, new]  # neither was removed as broken
