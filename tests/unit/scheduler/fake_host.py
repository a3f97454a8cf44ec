"""A stand-in for ``service.Scheduler`` that performs nothing: the owner and worker are fed
inputs by hand and their effects are recorded (no node, no sockets, no sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from aionet.config import Config
from aionet.instrument import Instruments
from aionet.scheduler.instructions import AcceptLocal, FailFuture, Resolve, SendCtrl, SendSpecs


def apply_future(ins: Resolve | FailFuture) -> None:
    """Resolve or fail a task's future as ``service.Scheduler.perform`` does."""
    if ins.fut.done():
        return
    if isinstance(ins, Resolve):
        ins.fut.set_result(None)
    else:
        ins.fut.set_exception(ins.exc)
        ins.fut.exception()


class _Handle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualLoop:
    """``call_soon`` callbacks run only when the test says so (:meth:`run_soon`); futures and
    tasks live on a real loop that is never run in the background."""

    def __init__(self) -> None:
        self.real = asyncio.new_event_loop()
        self.soon: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.later: list[tuple[float, Callable[..., Any], tuple[Any, ...]]] = []

    def create_future(self) -> asyncio.Future[Any]:
        return self.real.create_future()

    def create_task(self, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        return self.real.create_task(coro, **kw)

    def call_soon(self, cb: Callable[..., Any], *args: Any) -> _Handle:
        self.soon.append((cb, args))
        return _Handle()

    call_soon_threadsafe = call_soon

    def call_later(self, delay: float, cb: Callable[..., Any], *args: Any) -> _Handle:
        self.later.append((delay, cb, args))
        return _Handle()

    def run_soon(self) -> None:
        while self.soon:
            cb, args = self.soon.pop(0)
            cb(*args)

    def close(self) -> None:
        self.real.close()


class FakeHost:
    """Implements ``host.SchedulerHost`` by recording."""

    def __init__(self, name: str = "me", **sched: Any) -> None:
        self.name = name
        self.cfg = Config.from_dict({"scheduler": sched}).scheduler
        self.loop = ManualLoop()
        self.log = _NullLog()
        self.instruments = Instruments()
        self.task_node: Any = None
        self.rank = -1
        self.spec_sends: list[str] = []
        self.local_specs: list[list[Any]] = []
        self.local_ctrl: list[tuple[int, list[int]]] = []
        self.local_results: list[list[Any]] = []
        self.suspected: list[str] = []
        self.down: list[str] = []
        self.performed: list[Any] = []
        self.now = 0.0
        self.locate: Any = None  # no cache: cache_ref arguments are not located (host.SchedulerHost.locate)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str, *, log_errors: bool = True) -> None:
        coro.close()  # effects are not performed here

    async def send(self, peer: str, msg: list[Any]) -> None:
        raise AssertionError("no messages in pure tests")

    async def send_quiet(self, peer: str, msg: list[Any]) -> None:
        raise AssertionError("no messages in pure tests")

    def dumps(self, obj: Any) -> bytes:
        return b""

    async def fetch(self, holder: str, owner: str, tid: int) -> Any:
        raise AssertionError("no fetches in pure tests")

    async def request_unless_dead(self, peer: str, service: str, obj: Any, timeout: float | None = None) -> Any:
        raise AssertionError("no requests in pure tests")

    def broadcast_load(self, load: list[Any]) -> None:
        pass

    def perform(self, instructions: list[Any]) -> None:
        """What the owner hands over from entry points that return nothing (submit, its own
        dispatch and batched cancels): recorded, and futures resolved as the service would."""
        self.performed.extend(instructions)
        for ins in instructions:
            if isinstance(ins, SendSpecs):
                self.spec_sends.append(ins.peer)
            elif isinstance(ins, AcceptLocal):
                self.local_specs.append(ins.specs)
            elif isinstance(ins, SendCtrl) and ins.peer == self.name:
                self.local_ctrl.append((ins.kind, list(ins.tids)))
            elif isinstance(ins, (Resolve, FailFuture)):
                apply_future(ins)

    def perform_worker(self, instructions: list[Any]) -> None:
        self.performed.extend(instructions)

    def clock(self) -> float:
        return self.now

    def results_local(self, items: list[Any]) -> None:
        self.local_results.extend(items)

    def info_pending(self) -> bool:
        return False

    def is_alive(self, name: str) -> bool:
        return True


class _NullLog:
    def __getattr__(self, _name: str) -> Callable[..., None]:
        return lambda *a, **k: None
