"""The executing side: every node that runs tasks has one Worker.

Tasks arrive in batches (one message carries many specs), wait in a priority queue until
their resources are free, and run where their kind says: ``async def`` on the event loop,
plain functions in the thread pool of :mod:`.executor`, ``executor="process"`` in a process
pool. Completions are batched back to each owner (one message per owner per loop turn), large
results stay here until their owner frees them, and idle workers steal queued tasks from busy
ones. An attempt's state (:class:`.state.JobState`) changes only in :meth:`Worker._transition`.

Reactions to owners (:meth:`Worker.cancel`, :meth:`Worker.peer_dead`, :meth:`Worker.reconcile`)
change the tables here and return :mod:`.instructions` (interrupt a running async task, post a
result-stream entry) that the service performs.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

from ..codecs.envelope import M_RESULTS
from ..errors import PeerUnavailable, RemoteError, SerializationError, TaskError
from ..stats import WorkerStats
from .allow import normalize_allow, refuse_name, refuse_object
from .executor import ThreadRunner, process_entry, process_pool
from .host import SchedulerHost
from .instructions import Interrupt, PostResult, WorkerInstruction
from .policies import fits
from .queue import GpuSlots, Preemptible, ResourcePool, TaskQueue, pick_preemptions
from .state import DEFAULT_RES, JOB_NEXT, InvalidTransition, Job, JobState
from .tasks import (
    _CURRENT,
    TaskContext,
    error_fields,
    estimate_nbytes,
    resolve_fn,
    substitute,
)
from .wire import (
    DEP_VALUE,
    EXE_PROCESS,
    EXE_THREAD,
    F_PINNED,
    F_PREEMPTIBLE,
    R_CKPT,
    R_DEPLOST,
    R_ERROR,
    R_HELD,
    R_LOST,
    R_MOVED,
    R_REJECT,
    R_TIMEOUT,
    R_VALUE,
    SVC_STEAL,
)

__all__ = ["Worker"]

FETCHING, QUEUED, RUNNING, FINISHED = JobState
_BACKFILL_SCAN = 32
_BAD_FNS_KEPT = 256  # refused / unimportable function paths remembered


class _Refused(TaskError):
    """A task function this node does not allow (counted in ``stats().refused``)."""


class Worker:
    """Runs tasks handed to this node by owners (itself included)."""

    def __init__(self, sched: SchedulerHost):
        self.sched = sched
        self.name = sched.name
        cfg = sched.cfg
        self.run_tasks = cfg.run_local
        self.inline_max = cfg.inline_max_bytes
        self.batch_size = max(1, cfg.batch_size)
        self.steal_enabled = cfg.steal
        self.process_workers = cfg.process_workers
        self.allow_modules = normalize_allow(cfg.allow_modules)
        self.pool, self.gpus = ResourcePool({}), GpuSlots(0)
        self.queue = TaskQueue()
        self.jobs: dict[tuple[str, int], Job] = {}
        self.idle: asyncio.Event | None = None  # set when the last job leaves (made by drain())
        self.active: dict[str, int] = {}  # owner -> tasks here (fetching, queued or running)
        self.async_running: dict[tuple[str, int], Job] = {}
        self.n_preemptible = 0
        self.preempting = 0
        self.n_running = 0
        self.sync_running = 0
        # guards queue, pool, n_running/sync_running and Job.state/released: threads take work
        self._wlock = threading.Lock()
        self.store: dict[tuple[str, int], Any] = {}
        self.fns: dict[str, tuple[Callable[..., Any], bool]] = {}
        self._bad_fns: dict[str, TaskError] = {}
        self._refused_logged = -1e9
        self.outbox: dict[str, list[Any]] = {}
        self._flushing: set[str] = set()
        self._fetches: dict[tuple[str, int], asyncio.Future[Any]] = {}
        self._threads: ThreadRunner | None = None
        self._ppool: Any = None
        self._pump_pending = False
        self._loop_thread = threading.get_ident()
        self.peer_load: dict[str, list[Any]] = {}
        self._stealing = False
        self._last_report: tuple[int, float] = (-1, 0.0)
        self.counts = {  # plain ints on the hot path; stats() copies them out
            "accepted": 0,
            "ran": 0,
            "errors": 0,
            "rejected": 0,
            "refused": 0,
            "stolen_in": 0,
            "stolen_out": 0,
            "preempted": 0,
            "cancelled": 0,
            "results_held": 0,
        }

    def _transition(self, job: Job, new: JobState) -> None:
        """The one place an attempt's state changes on this node: checked against the table,
        reported to the ``task_changed`` hook (on the loop, also when a thread moved it)."""
        if new not in JOB_NEXT[job.state]:
            raise InvalidTransition(job.name, job.state, new, "worker")
        job.state = new
        if (hook := self.sched.instruments.task_changed) is not None:
            args = (job.owner, job.tid, job.attempt, job.name, new.name.lower(), job.device)
            if threading.get_ident() == self._loop_thread:
                hook(*args)
            else:
                self.sched.loop.call_soon_threadsafe(hook, *args)

    def start(self, total: dict[str, float]) -> None:
        self.pool = ResourcePool(total)
        # GPUs as indices 0..n-1 (CUDA ordinals within what this process sees); how much of each
        # running tasks hold, so that tasks asking whole GPUs get distinct ones
        self.gpus = GpuSlots(int(total.get("gpu", 0.0)))
        self._loop_thread = threading.get_ident()
        self._threads = ThreadRunner(self, self.sched.loop, f"aionet-task-{self.name}")

    # ------------------------------------------------------------------ arrivals
    def accept(self, owner: str, specs: list[Any], local: bool) -> None:
        """A batch of task specs from ``owner``."""
        jobs = self.jobs
        for spec in specs:
            try:
                job = Job(owner, spec, local)
            except (ValueError, TypeError, AttributeError) as exc:
                self.sched.log.warning("malformed task spec dropped", owner=owner, error=str(exc))
                continue
            k = (owner, job.tid)
            if k in jobs:
                continue  # this attempt (or an earlier one) is already here
            if not self.run_tasks or not self.pool.could_ever_fit(job.res):
                self.counts["rejected"] += 1
                why = "does not run tasks" if not self.run_tasks else f"cannot provide {job.res}"
                self.post(owner, [job.tid, job.attempt, R_REJECT, f"node {self.name} {why}", 0.0, 0])
                continue
            jobs[k] = job
            self.active[owner] = self.active.get(owner, 0) + 1
            self.counts["accepted"] += 1
            if job.deps is not None:
                self._resolve_deps(job)
            else:
                self._enqueue(job)
        self._pump()

    def _enqueue(self, job: Job) -> None:
        """Queue ``job`` (dependencies resolved). Imports its function first: a task that
        cannot run here fails now rather than after waiting for resources."""
        if job.call is None:
            entry = self.fns.get(job.fn) or self._bad_fns.get(job.fn) or self._load_fn(job.fn)
            if isinstance(entry, TaskError):
                if isinstance(entry, _Refused):
                    self.counts["refused"] += 1
                self._finish(job, R_ERROR, ["aionet.TaskError", str(entry), ""], 0.0)
                return
            job.call, is_async = entry
            job.sync = job.exe == EXE_THREAD or (job.exe != EXE_PROCESS and not is_async)
        with self._wlock:
            self._transition(job, QUEUED)
            if job.seq < 0:
                job.seq = self.queue.next_seq()
            self.queue.push(job)

    def _load_fn(self, path: str) -> tuple[Callable[..., Any], bool] | TaskError:
        """Check ``path`` against ``scheduler.allow_modules`` (by name, before importing
        anything), import it, check what it resolved to. Successes are cached; refusals and
        import errors only in a bounded cache (peers choose the paths)."""
        allow = self.allow_modules
        why = refuse_name(path, allow)
        entry: tuple[Callable[..., Any], bool] | TaskError
        if why is None:
            try:
                obj, hops = resolve_fn(path)
                if not callable(obj):
                    raise TaskError(f"task function {path!r} is not callable")
                why = refuse_object(path, obj, hops, allow)
                if why is None:
                    entry = (obj, inspect.iscoroutinefunction(obj))
                    self.fns[path] = entry
                    return entry
            except TaskError as exc:
                entry = TaskError(f"{exc} (on node {self.name!r})")
        if why is not None:
            now = time.monotonic()
            if now - self._refused_logged >= 10.0:  # peers choose the paths: at most one line per 10 s
                self._refused_logged = now
                n = self.counts["refused"] + 1
                self.sched.log.warning("task function refused", fn=path[:200], reason=why, refused_so_far=n)
            entry = _Refused(f"task function {path!r} refused on node {self.name!r}: {why}")
        bad = self._bad_fns
        bad[path] = entry
        if len(bad) > _BAD_FNS_KEPT:
            del bad[next(iter(bad))]
        return entry

    def _resolve_deps(self, job: Job) -> None:
        deps = job.deps or []
        values: list[Any] = [None] * len(deps)
        missing: list[tuple[int, str, int]] = []
        for entry in deps:
            i, mode, data = entry
            if mode == DEP_VALUE:
                values[i] = data
                continue
            holder, dtid = data
            if holder == self.name:
                try:
                    values[i] = self.store[(job.owner, dtid)]
                except KeyError:
                    self._dep_lost(job, holder, dtid)
                    return
            else:
                missing.append((i, holder, dtid))
        if not missing:
            self._bind(job, values)
            self._enqueue(job)
            return
        self.sched.spawn(self._fetch_deps(job, values, missing), f"aionet-sched-deps-{job.name}")

    def _bind(self, job: Job, values: list[Any]) -> None:
        job.args = substitute(job.args, values)
        if job.kwargs:
            job.kwargs = substitute(job.kwargs, values)
        job.deps = None

    async def _fetch_deps(self, job: Job, values: list[Any], missing: list[tuple[int, str, int]]) -> None:
        try:
            got = await asyncio.gather(*(self._fetch(job.owner, h, t) for _i, h, t in missing))
        except (PeerUnavailable, RemoteError, TimeoutError, OSError) as exc:
            if job.state == FETCHING and not job.cancelled:
                bad = next(((h, t) for _i, h, t in missing), ("", 0))
                self.sched.log.info("dependency fetch failed", task=job.name, error=str(exc))
                self._dep_lost(job, *bad)
            return
        if job.cancelled or job.state != FETCHING:
            return
        for (i, _h, _t), v in zip(missing, got, strict=True):
            values[i] = v
        self._bind(job, values)
        self._enqueue(job)
        self._pump()

    def _fetch(self, owner: str, holder: str, tid: int) -> asyncio.Future[Any]:
        """One fetch per result, shared by every task here that needs it."""
        k = (owner, tid)
        fut = self._fetches.get(k)
        if fut is None or fut.done():
            task = self.sched.spawn(self.sched.fetch(holder, owner, tid), f"aionet-sched-fetch-{tid}", log_errors=False)
            if task is None:
                raise PeerUnavailable("the local scheduler is stopped")
            fut = self._fetches[k] = task
            fut.add_done_callback(lambda f, k=k: self._fetches.pop(k, None) if self._fetches.get(k) is f else None)
        return fut

    def _dep_lost(self, job: Job, holder: str, dtid: int) -> None:
        self._drop(job)
        self.post(job.owner, [job.tid, job.attempt, R_DEPLOST, [holder, dtid], 0.0, 0])

    # ------------------------------------------------------------------ admission
    def _pump(self) -> None:
        """Start queued tasks while their resources fit (priority order, bounded backfill)."""
        self._pump_pending = False
        started: list[Job] = []
        with self._wlock:
            q = self.queue
            pool = self.pool
            while len(q):
                job = q.peek()
                if pool.fits(job.res):
                    q.pop()
                    self._acquire_locked(job)
                    started.append(job)
                    continue
                if self.preempting or (self.n_preemptible and self._try_preempt(job)):
                    break
                if job.res is DEFAULT_RES:
                    break  # a plain one-cpu task does not fit: nothing behind it can either
                other = q.first_fitting(pool.free, _BACKFILL_SCAN)
                if other is None:
                    break
                q.remove(other)
                self._acquire_locked(other)
                started.append(other)
        for job in started:
            self._start(job)

    def _acquire_locked(self, job: Job) -> None:
        self.pool.acquire(job.res)
        if job.res.get("gpu", 0.0) > 0.0:
            job.devices = self.gpus.take(job.res["gpu"])
        self.n_running += 1
        self._transition(job, RUNNING)
        if job.sync:
            self.sync_running += 1

    def _release_locked(self, job: Job) -> None:
        if job.released:
            return
        job.released = True
        self.pool.release(job.res)
        if job.devices:
            self.gpus.give(job.devices, job.res.get("gpu", 0.0))
        self.n_running -= 1
        if job.sync:
            self.sync_running -= 1

    def thread_finished(self, job: Job) -> Job | None:
        """Called by a task thread: free ``job``'s resources and take the next sync task if it
        is at the head of the queue and fits (so the thread needs no loop round trip)."""
        with self._wlock:
            self._release_locked(job)
            q = self.queue
            if not len(q) or self.preempting:
                return None
            nxt = q.peek()
            if not nxt.sync or nxt.timeout or not self.pool.fits(nxt.res):
                return None
            q.pop()
            self._acquire_locked(nxt)
            return nxt

    def make_context(self, job: Job) -> None:
        sink = None if job.exe == EXE_PROCESS else functools.partial(self._checkpoint, job)
        node, rank = None if job.exe == EXE_PROCESS else self.sched.task_node, self.sched.rank
        job.ctx = TaskContext(job.name, self.name, job.owner, job.attempt, job.ckpt, sink, node=node, rank=rank,
                              devices=job.devices)  # fmt: skip

    def _schedule_pump(self) -> None:
        if not self._pump_pending:
            self._pump_pending = True
            self.sched.loop.call_soon(self._pump)

    def _try_preempt(self, head: Job) -> bool:
        running = [
            Preemptible(k, j.prio, j.t0, j.res)
            for k, j in self.async_running.items()
            if j.flags & F_PREEMPTIBLE and not j.preempting and j.prio < head.prio
        ]
        if not running:
            return False
        keys = pick_preemptions(head.res, head.prio, self.pool.free, running)
        if not keys:
            return False
        for k in keys:
            j = self.async_running[k]
            j.preempting = True
            self.preempting += 1
            if j.task is not None:
                j.task.cancel()
        self.sched.log.info("preempting", for_task=head.name, priority=head.prio, victims=len(keys))
        return True

    def _start(self, job: Job) -> None:
        """Run an admitted job (its resources are acquired) where its kind says."""
        self.make_context(job)
        loop = self.sched.loop
        job.t0 = time.perf_counter()
        if job.timeout:
            job.timer = loop.call_later(job.timeout, self._on_timeout, job)
        if job.sync:
            assert self._threads is not None
            self._threads.submit(job, self.sync_running)
        elif job.exe == EXE_PROCESS:
            self._start_process(job)
        else:
            context = contextvars.copy_context()
            context.run(_CURRENT.set, job.ctx)
            try:
                coro = context.run(job.call, *job.args, **(job.kwargs or {}))  # type: ignore[arg-type]
            except BaseException as exc:
                self._finish(job, R_ERROR, error_fields(exc), 0.0)
                return
            if not inspect.isawaitable(coro):
                self._finish(job, R_VALUE, coro, time.perf_counter() - job.t0)
                return
            task = loop.create_task(coro, context=context)  # type: ignore[arg-type]
            job.task = task
            self.async_running[(job.owner, job.tid)] = job
            if job.flags & F_PREEMPTIBLE:
                self.n_preemptible += 1
            task.add_done_callback(functools.partial(self._async_done, job))

    def _start_process(self, job: Job) -> None:
        if self._ppool is None:
            self._ppool = process_pool(self.process_workers or int(max(self.pool.total.get("cpu", 1.0), 1.0)))
        info = [job.name, self.name, job.owner, job.attempt, job.ckpt, self.sched.rank, list(job.devices)]
        fut = self.sched.loop.run_in_executor(self._ppool, process_entry, job.fn, job.args, job.kwargs, info)
        job.task = fut
        fut.add_done_callback(functools.partial(self._process_done, job))

    # ------------------------------------------------------------------ completions
    def threads_done(self, items: list[Any]) -> None:
        for job, ok, value, dt in items:
            self._completed(job, ok, value, dt)
        self._pump()

    def _process_done(self, job: Job, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            ok, value, dt = False, ["asyncio.CancelledError", "process task cancelled", ""], 0.0
        elif fut.exception() is not None:
            exc = fut.exception()
            ok, value, dt = False, error_fields(exc), time.perf_counter() - job.t0  # type: ignore[arg-type]
            if type(exc).__name__ == "BrokenProcessPool":
                self._ppool = None  # a pool process died: start a fresh pool next time
        else:
            ok, value, dt = fut.result()
        self._completed(job, ok, value, dt)
        self._pump()

    def _completed(self, job: Job, ok: bool, value: Any, dt: float) -> None:
        if job.state != RUNNING:
            with self._wlock:
                self._release_locked(job)
            return
        if job.cancelled or job.reported:
            self._drop(job)  # cancelled or already reported as timed out: just free its resources
            return
        self._finish(job, R_VALUE if ok else R_ERROR, value, dt)

    def _async_done(self, job: Job, task: asyncio.Task[Any]) -> None:
        self.async_running.pop((job.owner, job.tid), None)
        if job.flags & F_PREEMPTIBLE:
            self.n_preemptible -= 1
        if job.preempting:
            self.preempting -= 1
            job.preempting = False
            if task.cancelled() and not job.cancelled:
                self._requeue_preempted(job)
                self._pump()
                return
        if job.state != RUNNING:
            return
        dt = time.perf_counter() - job.t0
        if job.cancelled:
            self._drop(job)
        elif task.cancelled():
            if job.timed_out:
                self._finish(job, R_TIMEOUT, f"exceeded its timeout of {job.timeout} s", dt)
            else:
                self._finish(job, R_ERROR, ["asyncio.CancelledError", f"cancelled on node {self.name}", ""], dt)
        else:
            exc = task.exception()
            if exc is None:
                self._finish(job, R_VALUE, task.result(), dt)
            else:
                self._finish(job, R_ERROR, error_fields(exc), dt)
        self._pump()

    def _requeue_preempted(self, job: Job) -> None:
        with self._wlock:
            self._release_locked(job)
            job.released = False
        if job.timer is not None:
            job.timer.cancel()
            job.timer = None
        job.ckpt = job.ctx.restore() if job.ctx is not None else job.ckpt
        job.ctx = None
        job.task = None
        self.counts["preempted"] += 1
        self._enqueue(job)  # keeps its original place among equals

    def _on_timeout(self, job: Job) -> None:
        job.timer = None
        if job.state != RUNNING or job.reported:
            return
        job.timed_out = True
        if job.task is not None and job.exe != EXE_PROCESS:
            job.task.cancel()  # async: _async_done reports the timeout
            return
        # a thread or process cannot be interrupted: report now, free its slot when it returns
        job.reported = True
        self.post(job.owner, [job.tid, job.attempt, R_TIMEOUT, f"exceeded its timeout of {job.timeout} s", 0.0, 0])

    def _finish(self, job: Job, status: int, payload: Any, dt: float) -> None:
        nbytes = 0
        if status == R_VALUE:
            self.counts["ran"] += 1
            if not job.local:
                nbytes = estimate_nbytes(payload)
                if nbytes >= self.inline_max:
                    self.store[(job.owner, job.tid)] = payload
                    self.counts["results_held"] += 1
                    status, payload = R_HELD, None
        else:
            self.counts["errors"] += 1
        self._drop(job)
        self.post(job.owner, [job.tid, job.attempt, status, payload, dt, nbytes])

    def _drop(self, job: Job) -> None:
        """Forget ``job`` here, releasing its resources if it held them. Only for jobs that
        are not running in a thread (finished, queued under our control, fetching, async)."""
        with self._wlock:
            if job.state == FINISHED:
                return
            if job.state == RUNNING:
                self._release_locked(job)
            elif job.state == QUEUED:
                self.queue.remove(job)
            self._transition(job, FINISHED)
        self._unregister(job)

    def _unregister(self, job: Job) -> None:
        if job.timer is not None:
            job.timer.cancel()
            job.timer = None
        k = (job.owner, job.tid)
        if self.jobs.get(k) is job:
            del self.jobs[k]
            if not self.jobs and self.idle is not None:  # drain() waits for this
                if threading.get_ident() == self._loop_thread:
                    self.idle.set()
                else:
                    self.sched.loop.call_soon_threadsafe(self.idle.set)
            n = self.active.get(job.owner, 1) - 1
            if n > 0:
                self.active[job.owner] = n
            else:
                self.active.pop(job.owner, None)

    def _checkpoint(self, job: Job, state: Any) -> None:
        """TaskContext.checkpoint: keep locally (preemption) and tell the owner (node death)."""
        if threading.get_ident() != self._loop_thread:
            self.sched.loop.call_soon_threadsafe(self.post, job.owner, [job.tid, job.attempt, R_CKPT, state, 0.0, 0])
        else:
            self.post(job.owner, [job.tid, job.attempt, R_CKPT, state, 0.0, 0])

    # ------------------------------------------------------------------ sending results
    def load(self, owner: str | None) -> list[Any]:
        free = self.pool.free
        return [len(self.queue), self.n_running, self.active.get(owner, 0) if owner else 0, dict(free)]

    def post(self, owner: str, item: list[Any]) -> None:
        """Queue a result-stream entry for ``owner`` (batched: one message per owner per turn)."""
        box = self.outbox.get(owner)
        if box is None:
            box = self.outbox[owner] = []
        box.append(item)
        if owner in self._flushing:
            return
        self._flushing.add(owner)
        if owner == self.name:
            self.sched.loop.call_soon(self._flush_local)
        else:
            self.sched.spawn(self._flush_remote(owner), f"aionet-sched-results-{owner}")

    def unsent(self) -> bool:  # results posted but not yet handed to their links
        return bool(self._flushing) or any(self.outbox.values())

    def _flush_local(self) -> None:
        self._flushing.discard(self.name)
        box = self.outbox.pop(self.name, None)
        if box:
            self.sched.results_local(box)

    async def _flush_remote(self, owner: str) -> None:
        try:
            while True:
                box = self.outbox.get(owner)
                if not box:
                    return
                self.outbox[owner] = []
                step = self.batch_size
                for i in range(0, len(box), step):
                    chunk = box[i : i + step]
                    msg = [M_RESULTS, self.name, chunk, self.load(owner)]
                    try:
                        await self.sched.send(owner, msg)
                    except SerializationError:
                        await self.sched.send(owner, [M_RESULTS, self.name, self._sanitize(chunk), self.load(owner)])
                    except PeerUnavailable:
                        self.sched.perform_worker(self.owner_gone(owner))
                        return
        except PeerUnavailable:
            self.sched.perform_worker(self.owner_gone(owner))
        finally:
            self._flushing.discard(owner)

    def _sanitize(self, chunk: list[Any]) -> list[Any]:
        """Replace results that cannot be serialized by errors saying so."""
        dumps = self.sched.dumps
        out = []
        for item in chunk:
            try:
                dumps(item)
                out.append(item)
            except Exception as exc:
                tid, attempt, status, _payload, dt, _nb = item
                what = "checkpoint state" if status == R_CKPT else "result"
                if status == R_CKPT:
                    continue  # a checkpoint that cannot travel is simply not kept remotely
                out.append(
                    [tid, attempt, R_ERROR, ["aionet.SerializationError", f"cannot send the {what}: {exc}", ""], dt, 0]
                )
        return out

    # ------------------------------------------------------------------ owner requests
    def cancel(self, owner: str, tids: list[int]) -> list[WorkerInstruction]:
        """The owner cancels these tasks: drop queued and fetching ones; running async ones are
        interrupted (returned); threads and processes cannot be, they are freed when they return."""
        out: list[WorkerInstruction] = []
        for tid in tids:
            job = self.jobs.get((owner, tid))
            if job is None:
                continue
            self.counts["cancelled"] += 1
            job.cancelled = True
            with self._wlock:
                state = job.state
                if state == QUEUED:
                    self.queue.remove(job)
                    self._transition(job, FINISHED)
            if state == QUEUED:
                self._unregister(job)
            elif state == RUNNING:
                if job.task is not None and job.exe != EXE_PROCESS:
                    out.append(Interrupt(job.task))  # async: _async_done frees it
            elif state == FETCHING:
                self._drop(job)
        self._schedule_pump()
        return out

    def free(self, owner: str, tids: list[int]) -> None:
        store = self.store
        for tid in tids:
            store.pop((owner, tid), None)

    def fetch_local(self, owner: str, tid: int) -> Any:
        """Service body: a held result, by its owner's task id (KeyError if not here)."""
        return self.store[(owner, tid)]

    def owner_gone(self, owner: str) -> list[WorkerInstruction]:
        """The owner died: nobody will collect its tasks' results. (If it was a wrong verdict,
        :meth:`reconcile` answers for what was dropped here.)"""
        out = self.cancel(owner, [tid for o, tid in self.jobs if o == owner])
        for k in [k for k in self.store if k[0] == owner]:
            del self.store[k]
        self.outbox.pop(owner, None)
        return out

    def reconcile(self, owner: str, tasks: list[Any]) -> list[WorkerInstruction]:
        """``owner`` lists the attempts ``[[tid, attempt], ...]`` it believes run here (after one
        of us counted the other dead). Answer ``R_LOST`` for each that is neither here (fetching,
        queued or running) nor finished with a result here or on its way: those were dropped
        when the owner was taken for dead. The answers follow the results already queued for
        the owner in the same stream, so the owner sees a result before a stale 'lost'."""
        out: list[WorkerInstruction] = []
        queued = {item[0] for item in self.outbox.get(owner) or () if item[2] != R_CKPT}
        for entry in tasks:
            try:
                tid, attempt = int(entry[0]), int(entry[1])
            except (TypeError, ValueError, IndexError):
                continue
            job = self.jobs.get((owner, tid))
            if job is not None and job.state != FINISHED and not job.cancelled:
                continue  # its result will follow (a cancelled one reports nothing)
            if (owner, tid) in self.store or tid in queued:
                continue
            out.append(PostResult(owner, [tid, attempt, R_LOST, f"not on node {self.name}", 0.0, 0]))
        return out

    # ------------------------------------------------------------------ stealing
    def steal(self, req: Any) -> list[list[Any]]:
        """Service body (victim side): hand some queued, not-started tasks to an idle node."""
        thief = str(req["thief"])
        total = {str(k): float(v) for k, v in dict(req["total"]).items()}
        want = max(1, int(req.get("n", 1)))
        q = self.queue
        if not len(q):
            return []
        n = min(want, max(1, len(q) // 2))

        def ok(j: Job) -> bool:
            return not j.local and not j.flags & F_PINNED and j.deps is None and fits(j.res, total)

        with self._wlock:
            jobs = q.tail(n, ok)
            for j in jobs:
                q.remove(j)
                self._transition(j, FINISHED)
        out = []
        for j in jobs:
            spec = j.spec()
            self._unregister(j)
            self.post(j.owner, [j.tid, j.attempt, R_MOVED, thief, 0.0, 0])
            out.append([j.owner, spec])
        if out:
            self.counts["stolen_out"] += len(out)
            self.sched.log.debug("tasks stolen from here", thief=thief, n=len(out))
        return out

    def tick(self) -> None:
        """Periodic: publish this node's queue length when it changed, steal when idle."""
        q = len(self.queue)
        last_q, last_t = self._last_report
        now = time.monotonic()
        changed = (q == 0) != (last_q == 0) or abs(q - last_q) > max(4, last_q // 4)
        if changed or (q > 0 and now - last_t > 1.0):
            self._last_report = (q, now)
            self.sched.broadcast_load(self.load(None))
        if (
            self.steal_enabled
            and self.run_tasks
            and not self._stealing
            and q == 0
            and self.pool.free.get("cpu", 0.0) >= 1.0
        ):
            best = None
            for name, load in self.peer_load.items():
                try:
                    pq = int(load[0])
                except (TypeError, ValueError, IndexError):
                    continue
                if pq > 0 and self.sched.is_alive(name) and (best is None or pq > best[0]):
                    best = (pq, name)
            if best is not None:
                self._stealing = True
                self.sched.spawn(self._steal_from(best[1]), "aionet-sched-steal")

    async def _steal_from(self, victim: str) -> None:
        free_cpu = int(self.pool.free.get("cpu", 1.0))
        req = {"thief": self.name, "total": self.pool.total, "n": max(1, free_cpu * 2)}
        try:
            got = await self.sched.request_unless_dead(victim, SVC_STEAL, req, timeout=2.0)
        except (PeerUnavailable, RemoteError, TimeoutError) as exc:
            self.sched.log.debug("steal failed", victim=victim, error=str(exc))
            self.peer_load.pop(victim, None)
            return
        finally:
            self._stealing = False
        if not got:
            load = self.peer_load.get(victim)
            if load:
                load[0] = 0
            return
        self.counts["stolen_in"] += len(got)
        by_owner: dict[str, list[Any]] = {}
        for owner, spec in got:
            by_owner.setdefault(str(owner), []).append(spec)
        for owner, specs in by_owner.items():
            self.accept(owner, specs, local=owner == self.name)

    # ------------------------------------------------------------------ lifecycle
    def peer_dead(self, name: str) -> list[WorkerInstruction]:
        self.peer_load.pop(name, None)
        return self.owner_gone(name)

    def shutdown(self) -> list[asyncio.Future[Any]]:
        """Drop queued work and cancel running async tasks; returns those tasks, for the
        scheduler to await (threads and processes cannot be interrupted: they are abandoned)."""
        running: list[asyncio.Future[Any]] = []
        for job in list(self.jobs.values()):
            job.cancelled = True
            if job.task is not None and job.state == RUNNING and job.exe != EXE_PROCESS:
                job.task.cancel()
                running.append(job.task)
        with self._wlock:
            self.queue.clear()
        if self._threads is not None:
            self._threads.shutdown()
        if self._ppool is not None:
            self._ppool.shutdown(wait=False, cancel_futures=True)
            self._ppool = None
        return running

    def stats(self) -> WorkerStats:
        return WorkerStats(
            **self.counts,
            queued=len(self.queue),
            running=self.n_running,
            held_results=len(self.store),
            total=dict(self.pool.total),
            free=dict(self.pool.free),
        )
