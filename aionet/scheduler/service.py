"""The Scheduler a Node carries: owner + worker + a membership view, over narrow ports.

It never sees the Node: ``node.py`` hands it the ports of :mod:`aionet.core.ports` it needs:
:class:`~aionet.core.ports.Messaging` (``add_service`` for resources, result fetch and steal;
``send``/``recv_batch`` on one mailbox channel for batched specs, results, cancels, frees,
load reports and reconciliations; ``request``), :class:`~aionet.core.ports.ControlChannel`
(connection events), :class:`~aionet.core.ports.MemberEvents` (the only source of who is
alive), :class:`~aionet.core.ports.LoadFields` (its queue in the load reports), a ``dumps``
and a :class:`~aionet.core.ports.Clock`.

The owner and the worker decide and return :mod:`.instructions`; :meth:`Scheduler.perform`
and :meth:`Scheduler.perform_worker` do them.

Who is dead: membership's verdicts (and a peer that says goodbye). A node wrongly presumed
dead costs duplicate work, never a duplicate or a lost result: when a peer counted dead is
alive again, owner and worker reconcile what each thinks is in flight (``M_RECONCILE``), lost
attempts are resubmitted under the retry rules, and owners accept one completion per task.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..core.ports import Clock, ControlChannel, LoadFields, MemberEventInfo, MemberEvents, Messaging
from ..devices import Devices
from ..errors import ConfigError, NodeClosed, PeerUnavailable, RemoteError, SerializationError
from ..instrument import Instruments
from ..log import get_logger
from ..stats import SchedulerStats
from .allow import normalize_allow
from .instructions import (
    AcceptLocal,
    Announce,
    FailFuture,
    Instruction,
    Interrupt,
    PostResult,
    Resolve,
    Resubmit,
    SendCtrl,
    SendSpecs,
    Suspect,
    WorkerInstruction,
)
from .owner import MAX_DEPLOST, Owner
from .placement import check_policy
from .state import Rec, TaskState, normalize_resources
from .tasks import TaskLost, TaskRef
from .wire import (
    CHANNEL,
    DEP_TYPE_NAME,
    M_CANCEL,
    M_DEPARTED,
    M_FREE,
    M_LOAD,
    M_RECONCILE,
    M_RESULTS,
    M_SUBMIT,
    S_TID,
    SVC_FETCH,
    SVC_RESOURCES,
    SVC_STEAL,
    DepRef,
)
from .worker import Worker

if TYPE_CHECKING:
    from ..config import SchedulerSection

__all__ = ["Scheduler"]

_STOP_WAIT = 2.0  # s stop() waits for cancelled tasks


def _consume(t: asyncio.Future[Any]) -> None:
    """Retrieve a finished task's exception: its owner handles failures another way."""
    if not t.cancelled():
        t.exception()


def _name(t: asyncio.Future[Any]) -> str:
    return t.get_name() if isinstance(t, asyncio.Task) else repr(t)


def _gpu_resources(devices: Devices | None, declared: Mapping[str, float]) -> dict[str, float]:
    """GPUs to offer, and their memory in bytes as the resource ``gpu_memory`` (what tasks may
    ask for, or ``prefer=``), unless declared. Skips the (slow) CUDA probe without NVIDIA device files."""
    out = {"gpu": 0.0}
    if devices is not None and glob.glob("/dev/nvidia[0-9]*"):
        try:
            gpus = devices.discover().get("gpus", [])
            out = {"gpu": float(len(gpus)), "gpu_memory": float(sum(int(g["memory_total"]) for g in gpus))}
        except Exception:
            pass
    return {k: v for k, v in out.items() if k not in declared and (v or k == "gpu")}


class Scheduler:
    """Tasks for one node: ``node.scheduler``. Users call ``node.submit/map/gather``."""

    def __init__(
        self,
        cfg: SchedulerSection,
        *,
        messaging: Messaging,
        control: ControlChannel,
        members: MemberEvents,
        dumps: Callable[[Any], Any],
        load_fields: LoadFields | None = None,
        devices: Devices | None = None,
        clock: Clock = time.monotonic,
        instruments: Instruments | None = None,
        task_node: Any = None,
        rank: int = -1,
    ):
        self._msg = messaging
        # handed to task code as ``task_context().node`` (and never used here): the node a task
        # runs on, so it can send, request and join groups; and that node's launched rank
        self.task_node = task_node
        self.rank = rank
        self.locate: Callable[[str], Sequence[str]] | None = None  # set by the Node: the cache's owners(key)
        self.instruments = instruments if instruments is not None else Instruments()
        self._dumps = dumps
        self._devices = devices  # the node's: how many GPUs to offer
        self.clock = clock
        self.name: str = messaging.name
        self.cfg = cfg
        self._validate()
        self.log = get_logger("aionet.scheduler", node=self.name)
        messaging.register_type(DepRef, DEP_TYPE_NAME)
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by start()
        self.owner = Owner(self)
        self.worker = Worker(self)
        self.alive: set[str] = set()
        self.down: set[str] = set()
        self._states: dict[str, str] = {}  # member -> state, as membership's events said
        self._leaving: set[str] = set()  # peers that left gracefully, until our mailbox catches up
        self._nonce = os.urandom(8).hex()  # marks our own M_DEPARTED markers (peers cannot forge them)
        self._info_pending: set[str] = set()
        self._workers_waiters: list[asyncio.Future[None]] = []  # wait_workers()
        self._stopped = False  # stop() ran: no worker can come any more
        self._death: dict[str, asyncio.Future[str]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._params: dict[Any, tuple[Any, frozenset[str]]] = {}  # fn -> its keyword params named like options
        # set once start() knows this node's resources: a peer asking before then waits (else it
        # would learn an empty pool and place nothing here, or fail tasks as unschedulable)
        self._ready = asyncio.Event()
        self._running = False
        # run to the end even when the asker gives up: a steal that took tasks off this node's
        # queue must answer with them, not stop between the two
        messaging.add_service(SVC_RESOURCES, self._svc_resources, cancellable=False)
        messaging.add_service(SVC_FETCH, self._svc_fetch, cancellable=False)
        messaging.add_service(SVC_STEAL, self._svc_steal, cancellable=False)
        control.on_connection_event(self._on_connection_event)
        members.on_member_change(self._on_member_change)
        if load_fields is not None:
            # queue length etc. in the node's load reports (members(), aionet status)
            load_fields.add_field("sched", lambda: self.worker.load(None)[:3])

    def _validate(self) -> None:
        c = self.cfg
        self.check_policy(c.policy)
        for name in ("batch_size", "max_queued_per_slot"):
            if getattr(c, name) < 1:
                raise ConfigError(f"scheduler.{name} must be at least 1")
        for name in ("steal_interval", "queue_time", "suspect_grace"):
            if getattr(c, name) <= 0:
                raise ConfigError(f"scheduler.{name} must be positive")
        if c.default_retries < 0:
            raise ConfigError("scheduler.default_retries must be >= 0")
        try:
            normalize_resources(c.resources)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"scheduler.resources: {exc}") from None
        normalize_allow(c.allow_modules)

    check_policy = staticmethod(check_policy)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._running:
            return
        self.loop = asyncio.get_running_loop()
        self._running = True
        self.owner._thread = self.worker._loop_thread = threading.get_ident()
        total = await self._detect_resources()
        self.worker.start(total)
        self._ready.set()
        self.owner.node_up(self.name, total, self.worker.run_tasks)
        self._workers_changed()
        self.spawn(self._consume(), "aionet-sched-consume")
        self.spawn(self._tick(), "aionet-sched-tick")
        for name in sorted(self.alive):  # members membership reported alive before we started
            self._learn(name)
        self.log.debug("scheduler started", resources=total, run_tasks=self.worker.run_tasks)

    async def _detect_resources(self) -> dict[str, float]:
        declared = normalize_resources(self.cfg.resources) if self.cfg.resources else {}
        if self.cfg.resources and "cpu" not in self.cfg.resources:
            declared.pop("cpu", None)
        total: dict[str, float] = {"cpu": float(os.cpu_count() or 1)}
        try:
            import psutil

            total["memory"] = float(psutil.virtual_memory().total)
        except Exception:
            pass
        total.update(await asyncio.to_thread(_gpu_resources, self._devices, declared), **declared)
        return total

    async def drain(self, timeout: float) -> int:
        """Stop taking tasks (peers are told; new ones are rejected and placed elsewhere) and let
        those accepted here finish, for up to ``timeout`` seconds. Returns how many are left: when
        the node then leaves, their owners re-run them elsewhere without counting a retry."""
        w = self.worker
        if not self._running:
            return len(w.jobs)
        w.run_tasks = False
        self.owner.node_up(self.name, {}, run_tasks=False)
        self.broadcast_load([*w.load(None), False])
        w.idle = asyncio.Event()
        if w.jobs:
            self.log.info("draining: finishing the tasks accepted here", tasks=len(w.jobs), timeout=timeout)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(w.idle.wait(), timeout)
        left = len(w.jobs)
        if left:
            self.log.warning("drain timed out; their owners will re-run the tasks still here", tasks=left)
        # the last results must be on their links before the node says it leaves (owners apply
        # a leave after what was sent before it, so they count, and nothing is re-run)
        deadline = self.loop.time() + 5.0
        while w.unsent() and self.loop.time() < deadline:
            await asyncio.sleep(0.005)
        return left

    async def stop(self) -> None:
        """Fail what this node owns, drop queued work, then cancel and await every task the
        scheduler started (running async tasks included): none is left to finish, or to fail
        unobserved, after the node is gone."""
        self._stopped = True
        self._workers_changed()  # a wait_workers waiting now raises NodeClosed
        self._ready.set()  # a peer's resources request waiting for a start that will not come is refused
        if not self._running:
            return
        self._running = False  # from here spawn() starts nothing
        self.owner.shutdown("the local node is shutting down")
        jobs = self.worker.shutdown()
        for fut in self._death.values():
            if not fut.done():
                fut.set_result("local node stopped")
        pending = [*self._tasks, *jobs]
        for t in pending:
            t.cancel()
        if pending:
            _done, left = await asyncio.wait(pending, timeout=_STOP_WAIT)
            if left:  # task code that ignores cancellation: say which, and never log it as lost later
                self.log.warning(
                    "scheduler tasks still running after stop", n=len(left), tasks=[_name(t) for t in left][:10]
                )
                for t in left:
                    t.add_done_callback(_consume)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str, *, log_errors: bool = True) -> asyncio.Task[Any] | None:
        """Start a task the scheduler owns: kept until done, cancelled and awaited by stop(), its
        exception retrieved (and logged unless the caller awaits it: ``log_errors=False``).
        After stop() it starts nothing and returns None."""
        if not self._running:
            coro.close()
            return None
        t = self.loop.create_task(coro, name=name)
        self._tasks.add(t)
        t.add_done_callback(self._task_done if log_errors else self._task_done_quiet)
        return t

    def _task_done(self, t: asyncio.Task[Any]) -> None:
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            self.log.error("scheduler task failed", task=t.get_name(), error=repr(t.exception()))

    def _task_done_quiet(self, t: asyncio.Task[Any]) -> None:
        self._tasks.discard(t)
        _consume(t)

    # ------------------------------------------------------------------ user API
    async def wait_workers(self, n: int, timeout: float | None = None) -> list[str]:
        """Wait until ``n`` nodes take tasks from here (alive, resources learned); their names."""
        views = self.owner.views
        try:
            async with asyncio.timeout(timeout):
                while len(views) < n:
                    if self._stopped:  # NodeClosed: this node stopped (or has stopped) first
                        raise NodeClosed(f"node {self.name!r} is stopped: no worker can come up for it to see")
                    fut = self.loop.create_future()
                    self._workers_waiters.append(fut)
                    await fut
        except TimeoutError:
            there = ", ".join(sorted(views)) or "none"
            raise TimeoutError(
                f"{len(views)} of {n} workers after {timeout:g} s ({there}): have the others joined?"
            ) from None
        return sorted(views)

    def _workers_changed(self) -> None:
        waiters, self._workers_waiters = self._workers_waiters, []
        for fut in (f for f in waiters if not f.done()):
            fut.set_result(None)

    def submit(self, fn: Any, *args: Any, **options: Any) -> TaskRef:
        """Keywords named in ``_OPTIONS`` are task options; ``kwargs={...}`` holds the
        function's keyword arguments. Without ``kwargs=``, other keywords go to the function,
        and an option the function also takes as a keyword is an error (not silently the
        option): pass the function's in ``kwargs=``, which makes every other keyword an option."""
        fn_kwargs = options.pop("kwargs", None)
        opts = {k: options.pop(k) for k in _OPTIONS if k in options}
        if fn_kwargs is not None:
            if not isinstance(fn_kwargs, Mapping) or not all(isinstance(k, str) for k in fn_kwargs):
                raise TypeError(f"submit(): kwargs= must be a dict of keyword arguments, not {fn_kwargs!r}")
            if options:
                raise TypeError(
                    f"submit(): unknown task option{'s' if len(options) > 1 else ''} {', '.join(map(repr, options))}; "
                    f"with kwargs= given, the function's keyword arguments go only in kwargs= "
                    f"(task options: {', '.join(_OPTIONS)})"
                )
            kw: dict[str, Any] | None = dict(fn_kwargs) or None
        else:
            if opts:
                self._check_shadowing(fn, opts)
            kw = options or None
        preset = getattr(fn, "__aionet_task__", None)  # @aionet.task(...) defaults; submit()'s win
        if preset:
            opts = {**preset, **opts}
        return self.owner.submit(fn, args, kw, **opts)

    def _check_shadowing(self, fn: Any, opts: Mapping[str, Any]) -> None:
        """Refuse ``submit(f, timeout=5)`` when ``f`` itself takes ``timeout``: ambiguous.
        Checked when the function is visible here without importing anything: given as a
        callable, or by a path whose module is already imported."""
        params = self._keyword_params(fn)
        clash = [k for k in opts if k in params]
        if clash:
            name = clash[0]
            raise TypeError(
                f"submit(): {name!r} is a task option, and the task function also takes a keyword {name!r}: "
                f"ambiguous. Pass the function's keyword arguments as kwargs={{...}} (every other keyword is then "
                f"a task option), e.g. submit(fn, kwargs={{{name!r}: ...}}) for the function's, "
                f"submit(fn, kwargs={{}}, {name}=...) for the task option"
            )

    def _keyword_params(self, fn: Any) -> frozenset[str]:
        key = fn if isinstance(fn, str) else id(fn)
        cached = self._params.get(key)
        if cached is not None and (isinstance(fn, str) or cached[0] is fn):
            return cached[1]
        target = fn
        if isinstance(fn, str):
            mod, _, attr = fn.partition(":")
            target = sys.modules.get(mod)  # never import here: that runs code
            for part in attr.split(".") if target is not None else ():
                target = getattr(target, part, None)
            if target is None or not callable(target):
                return frozenset()  # not visible yet: checked again once it is
        try:
            sig = inspect.signature(target)
        except (TypeError, ValueError):
            names: frozenset[str] = frozenset()
        else:
            kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            names = frozenset(p.name for p in sig.parameters.values() if p.kind in kinds and p.name in _OPTIONS)
        if len(self._params) >= 1024:
            self._params.clear()
        self._params[key] = (fn, names)
        return names

    async def map(self, fn: Any, *iterables: Iterable[Any], **options: Any) -> list[Any]:
        key = options.pop("key", None)
        return_exceptions = options.pop("return_exceptions", False)
        refs = []
        for i, args in enumerate(zip(*iterables, strict=False)):
            if key is not None:
                options["key"] = f"{key}-{i}"
            refs.append(self.submit(fn, *args, **options))
        return await self.gather(refs, return_exceptions=return_exceptions)

    async def gather(self, refs: Iterable[TaskRef], return_exceptions: bool = False) -> list[Any]:
        """Results of ``refs`` in order; the first failure raises unless ``return_exceptions``.
        One waiter for the whole batch (not one task per ref); only results held on other
        nodes are fetched one by one."""
        owner = self.owner
        recs = [r._rec for r in refs]
        pending = [r.fut for r in recs if not r.fut.done()]
        if pending:
            waiter: asyncio.Future[None] = self.loop.create_future()
            left = len(pending)

            def one_done(f: asyncio.Future[None]) -> None:
                nonlocal left
                left -= 1
                if waiter.done():
                    return
                if left == 0 or (not return_exceptions and (f.cancelled() or f.exception() is not None)):
                    waiter.set_result(None)

            for f in pending:
                f.add_done_callback(one_done)
            try:
                await waiter
            finally:
                for f in pending:
                    f.remove_done_callback(one_done)
        out: list[Any] = [None] * len(recs)
        slow: list[int] = []
        for i, rec in enumerate(recs):
            if rec.has_value:
                out[i] = rec.value
                continue
            fut = rec.fut
            if fut.done() and not fut.cancelled() and fut.exception() is not None:
                if not return_exceptions:
                    raise fut.exception()  # type: ignore[misc]
                out[i] = fut.exception()
                continue
            slow.append(i)
        if slow:
            got = await asyncio.gather(*(owner.result(recs[i]) for i in slow), return_exceptions=return_exceptions)
            for i, v in zip(slow, got, strict=True):
                out[i] = v
        return out

    async def await_result(self, rec: Rec) -> Any:
        """The value of ``rec``: wait for completion, then fetch it from its holder if it is
        large and lives elsewhere. A holder that dies meanwhile makes the owner re-run the
        task (lineage) and this waits for the new result."""
        owner = self.owner
        tries = 0
        while True:
            fut = rec.fut
            await fut
            if rec.has_value:
                return rec.value
            holder = rec.holder
            if holder is None:
                if rec.fut is fut:
                    raise TaskLost(f"task {rec.name}: its result is no longer available")
                continue
            try:
                value = await self.fetch(holder, self.name, rec.tid)
            except (PeerUnavailable, RemoteError, TimeoutError) as exc:
                tries += 1
                if owner.closed:
                    raise TaskLost(f"task {rec.name}: its result is on {holder}, and the local node stopped") from exc
                if rec.fut is fut and rec.holder == holder:
                    if isinstance(exc, RemoteError) and exc.remote_type == "KeyError":
                        self.perform(owner.result_lost(rec))
                    elif tries > MAX_DEPLOST:
                        raise TaskLost(f"task {rec.name}: cannot fetch its result from {holder}: {exc}") from exc
                    else:
                        self.suspect(holder)
                        await asyncio.sleep(min(0.02 * tries, 0.5))
                continue
            if rec.holder == holder and rec.state == TaskState.DONE:
                rec.value = value
                rec.has_value = True
            return value

    def stats(self) -> SchedulerStats:
        """Counters of tasks owned here (``owner``) and run here (``worker``), and the nodes
        this scheduler places on."""
        return SchedulerStats(
            owner=self.owner.stats(),
            worker=self.worker.stats(),
            alive=tuple(sorted(self.alive)),
            down=tuple(sorted(self.down)),
        )

    # ------------------------------------------------------------------ performing decisions
    def perform(self, instructions: list[Instruction]) -> None:
        """Do what the owner decided, in order."""
        for ins in instructions:
            t = type(ins)
            if t is Resolve:
                if not ins.fut.done():  # type: ignore[union-attr]
                    ins.fut.set_result(None)  # type: ignore[union-attr]
            elif t is FailFuture:
                fut = ins.fut  # type: ignore[union-attr]
                if not fut.done():
                    fut.set_exception(ins.exc)  # type: ignore[union-attr]
                    fut.exception()  # retrieved: a ref nobody awaits must not log "never retrieved"
            elif t is SendSpecs:
                self.send_specs(ins.peer)  # type: ignore[union-attr]
            elif t is AcceptLocal:
                self.worker.accept(self.name, ins.specs, local=True)  # type: ignore[union-attr]
            elif t is SendCtrl:
                peer, kind, tids = ins.peer, ins.kind, list(ins.tids)  # type: ignore[union-attr]
                if peer == self.name:
                    if kind == M_CANCEL:
                        self.perform_worker(self.worker.cancel(self.name, tids))
                    else:
                        self.worker.free(self.name, tids)
                else:
                    self.spawn(self.send_quiet(peer, [kind, self.name, tids]), "aionet-sched-ctrl")
            elif t is Resubmit:
                self.log.debug("task resubmitted", task=ins.name, attempt=ins.attempt, reason=ins.reason)  # type: ignore[union-attr]
            elif t is Suspect:
                self.suspect(ins.peer)  # type: ignore[union-attr]
            elif t is Announce:
                msg = [M_RECONCILE, self.name, [list(x) for x in ins.tasks], ins.ask_back]  # type: ignore[union-attr]
                self.spawn(self.send_quiet(ins.peer, msg), "aionet-sched-reconcile")  # type: ignore[union-attr]

    def perform_worker(self, instructions: list[WorkerInstruction]) -> None:
        """Do what the worker decided."""
        for ins in instructions:
            if type(ins) is Interrupt:
                ins.task.cancel()
            elif type(ins) is PostResult:
                self.worker.post(ins.owner, ins.item)

    # ------------------------------------------------------------------ messaging
    async def send(self, peer: str, msg: list[Any]) -> None:
        if peer in self.down:
            raise PeerUnavailable(f"{peer}: node is dead")
        await self._msg.send(peer, CHANNEL, msg)

    async def send_quiet(self, peer: str, msg: list[Any]) -> None:
        try:
            await self.send(peer, msg)
        except Exception as exc:  # cancels/frees/load reports are advisory
            self.log.debug("scheduler message not sent", peer=peer, error=str(exc))

    def broadcast_load(self, load: list[Any]) -> None:
        for peer in self.alive:
            self.spawn(self.send_quiet(peer, [M_LOAD, self.name, load]), "aionet-sched-load")

    async def request_unless_dead(self, peer: str, service: str, obj: Any, timeout: float | None = None) -> Any:
        """``node.request`` that also fails as soon as the scheduler learns ``peer`` died (a
        killed peer's link may otherwise keep trying to reconnect for a long time). The request
        runs as an owned task: cancelled with the caller, and by stop()."""
        if peer in self.down:
            raise PeerUnavailable(f"{peer}: node is dead")
        death = self._death.get(peer)
        if death is None or death.done():
            death = self._death[peer] = self.loop.create_future()
        coro = self._msg.request(peer, service, obj, timeout=timeout)
        req = self.spawn(coro, f"aionet-sched-request-{service}", log_errors=False)
        if req is None:
            raise PeerUnavailable(f"{peer}: the local scheduler is stopped")
        try:
            await asyncio.wait((req, death), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not req.done():
                req.cancel()  # the caller was cancelled, or the peer died first
        if req.done() and not req.cancelled():
            return req.result()
        if not self._running:
            raise PeerUnavailable(f"{peer}: request abandoned, the local scheduler is stopped")
        raise PeerUnavailable(f"{peer}: node died ({death.result() if death.done() else 'unknown'})")

    def dumps(self, obj: Any) -> Any:
        return self._dumps(obj)

    def send_specs(self, peer: str) -> None:
        """Send what the owner placed on ``peer`` (``owner.outbox[peer]``), batched."""
        self.spawn(self._send_specs(peer), f"aionet-sched-submit-{peer}")

    async def _send_specs(self, peer: str) -> None:
        owner = self.owner
        try:
            while True:
                box = owner.outbox.get(peer)
                if not box:
                    return
                owner.outbox[peer] = []
                step = owner.batch_size
                for i in range(0, len(box), step):
                    chunk = box[i : i + step]
                    try:
                        await self.send(peer, [M_SUBMIT, self.name, chunk])
                    except SerializationError:
                        await self._send_checked(peer, chunk)
                    except PeerUnavailable as exc:
                        self.node_down(peer, graceful=False, reason=str(exc))
                        return
        finally:
            owner.specs_sent(peer)

    async def _send_checked(self, peer: str, chunk: list[Any]) -> None:
        """A batch did not serialize: fail the tasks whose specs do not, send the rest."""
        good = []
        for spec in chunk:
            try:
                self.dumps(spec)
                good.append(spec)
            except Exception as exc:
                self.owner.spec_unsendable(spec[S_TID], exc)
        if good:
            await self.send(peer, [M_SUBMIT, self.name, good])

    def results_local(self, items: list[Any]) -> None:
        self.perform(self.owner.on_results(self.name, items, None))

    async def fetch(self, holder: str, owner: str, tid: int) -> Any:
        if holder == self.name:
            return self.worker.fetch_local(owner, tid)
        return await self.request_unless_dead(holder, SVC_FETCH, [owner, tid])

    async def _consume(self) -> None:
        recv_batch = self._msg.recv_batch
        owner = self.owner
        worker = self.worker
        while True:
            msgs = await recv_batch(CHANNEL)
            for m in msgs:
                try:
                    kind = m[0]
                    sender = m[1]
                    if kind == M_SUBMIT:
                        worker.accept(sender, m[2], local=False)
                    elif kind == M_RESULTS:
                        self.perform(owner.on_results(sender, m[2], m[3]))
                    elif kind == M_CANCEL:
                        self.perform_worker(worker.cancel(sender, m[2]))
                    elif kind == M_FREE:
                        worker.free(sender, m[2])
                    elif kind == M_LOAD:
                        worker.peer_load[sender] = list(m[2])
                        owner.load_report(sender, m[2])
                    elif kind == M_RECONCILE:
                        self._on_reconcile(sender, m[2], bool(m[3]))
                    elif kind == M_DEPARTED:
                        if sender == self.name and m[3] == self._nonce and m[2] in self._leaving:
                            self._leaving.discard(m[2])
                            self.node_down(m[2], graceful=True, reason="left")
                    else:
                        raise ValueError(f"unknown scheduler message kind {kind!r}")
                except Exception as exc:  # one bad message must not stop the scheduler
                    self.log.warning("bad scheduler message", error=repr(exc))
            if len(msgs) > 1:
                await asyncio.sleep(0)  # let heartbeats and I/O run between big batches

    async def _tick(self) -> None:
        interval = self.cfg.steal_interval
        while True:
            await asyncio.sleep(interval)
            try:
                self.worker.tick()
            except Exception as exc:
                self.log.error("scheduler tick failed", error=repr(exc))

    # ------------------------------------------------------------------ services
    async def _svc_resources(self, _arg: Any) -> dict[str, Any]:
        await self._ready.wait()
        if self._stopped:  # (the node stopped before its scheduler started)
            raise NodeClosed(f"node {self.name!r} is stopped: it runs no tasks")
        w = self.worker
        return {"total": dict(w.pool.total), "run_tasks": w.run_tasks, "load": w.load(None)}

    # async on purpose: a reply of 1 MiB or more waits for the peer's ack, and a sync handler's
    # reply is sent from the connection's reader, which must not wait (it reads that ack)
    async def _svc_fetch(self, arg: Any) -> Any:
        owner, tid = arg
        return self.worker.fetch_local(str(owner), int(tid))

    async def _svc_steal(self, arg: Any) -> list[list[Any]]:
        return self.worker.steal(arg)

    # ------------------------------------------------------------------ membership
    def info_pending(self) -> bool:
        """Resource information of some live peer is still being fetched."""
        return bool(self._info_pending)

    def is_alive(self, name: str) -> bool:
        return name in self.alive

    def _learn(self, name: str) -> None:
        if not self._running or name in self._info_pending:
            return
        self._info_pending.add(name)
        self.spawn(self._fetch_info(name), f"aionet-sched-info-{name}")

    async def _fetch_info(self, name: str) -> None:
        info: Mapping[str, Any] | None = None
        try:
            for attempt in range(8):
                # short timeouts, retried: a request can be lost when a link is reset while two
                # nodes dial each other at the same moment
                try:
                    info = await self.request_unless_dead(name, SVC_RESOURCES, None, timeout=1.0 + attempt)
                    break
                except TimeoutError:
                    if name not in self.alive:
                        break
            else:
                self.log.warning("could not learn a peer's resources", peer=name)
        except RemoteError:
            info = {"total": {}, "run_tasks": False}  # a node without a scheduler: never place there
        except PeerUnavailable as exc:
            self.log.info("could not learn a peer's resources", peer=name, error=str(exc))
        finally:
            self._info_pending.discard(name)
        if info is not None and name in self.alive:
            try:
                total = {str(k): float(v) for k, v in dict(info.get("total") or {}).items()}
                run_tasks = bool(info.get("run_tasks"))
            except (TypeError, ValueError, AttributeError):
                total, run_tasks = {}, False
            self.owner.node_up(name, total, run_tasks)
            self._workers_changed()
            load = info.get("load")
            if load:
                self.worker.peer_load[name] = list(load)
        self.owner.schedule_dispatch()

    def _on_connection_event(self, peer: str, event: str, details: dict[str, Any]) -> None:
        if event == "connected":
            # only members run tasks (a CLI client that connects is not one)
            if self._states.get(peer) == "alive":
                self._peer_alive(peer)
        elif event == "left":
            self._departed(peer)

    def _on_member_change(self, ev: MemberEventInfo) -> None:
        """A membership event: who is alive comes only from these."""
        name, state, kind = ev.name, ev.state, ev.kind
        if name == self.name:
            return
        self._states[name] = state
        if kind == "restarted":
            # a new process under the old name: whatever the old one ran or held is gone
            self.node_down(name, graceful=False, reason="restarted")
        if state == "alive":
            self._peer_alive(name)
        elif state == "left":
            self._departed(name)
        elif state == "dead":
            self.node_down(name, graceful=False, reason=f"membership: {kind or state}")

    def _departed(self, peer: str) -> None:
        """A graceful leave takes effect after the messages ``peer`` sent before it (already in
        our mailbox: one link, in order), so its last results count and nothing is re-run."""
        if not self._running or peer in self.down or peer in self._leaving:
            return
        self._leaving.add(peer)
        marker = [M_DEPARTED, self.name, peer, self._nonce]
        if self.spawn(self._msg.send(self.name, CHANNEL, marker), "aionet-sched-departed") is None:
            self.node_down(peer, graceful=True, reason="membership: left")

    def _peer_alive(self, peer: str) -> None:
        if peer == self.name:
            return
        back = peer in self.down
        self._leaving.discard(peer)  # back before its leave took effect: it never left
        self.down.discard(peer)
        self.alive.add(peer)
        self._learn(peer)
        if back and self._running:
            # counted dead here, alive after all (a refuted verdict, or a rejoin): what each of us
            # dropped meanwhile is found and resubmitted, so no submit hangs
            self.log.info("node back after a death verdict: reconciling tasks", peer=peer)
            self.perform(self.owner.announce(peer, ask_back=True))

    def _on_reconcile(self, sender: str, tasks: list[Any], ask_back: bool) -> None:
        """``sender`` lists what it believes runs here; answer for what does not, and with
        ``ask_back`` list ours that run there."""
        self.perform_worker(self.worker.reconcile(sender, tasks))
        if ask_back:
            self.perform(self.owner.announce(sender, ask_back=False))

    def suspect(self, peer: str) -> None:
        """Someone failed to reach ``peer``: count it dead unless membership says it is a
        member (a suspect is being verified by membership)."""
        if peer == self.name or peer in self.down or not self._running:
            return
        state = self._states.get(peer)
        if state in (None, "dead", "left"):
            self.node_down(peer, graceful=state == "left", reason=f"unreachable (state {state})")

    def node_down(self, peer: str, graceful: bool, reason: str) -> None:
        if peer == self.name or peer in self.down or not self._running:
            return
        self.down.add(peer)
        self.alive.discard(peer)
        self._info_pending.discard(peer)
        self.log.info("node down for scheduling", peer=peer, graceful=graceful, reason=reason)
        fut = self._death.pop(peer, None)
        if fut is not None and not fut.done():
            fut.set_result(reason)
        self.perform(self.owner.node_dead(peer, graceful))
        self.perform_worker(self.worker.peer_dead(peer))


_OPTIONS = ("resources", "priority", "retries", "timeout", "executor", "key", "preemptible", "affinity", "policy",
            "after", "retry_on", "prefer")  # fmt: skip
