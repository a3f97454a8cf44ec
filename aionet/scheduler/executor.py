"""Where sync and process tasks run: the worker's own thread pool and the process pool.

Only the mechanics of running a function live here; which task runs when is the worker's
decision (``worker.py``), reached through the three calls of :class:`ThreadHost`.

The thread pool is our own rather than ``run_in_executor``: a thread that finishes a task
frees its resources and takes the next runnable sync task from the queue itself (under the
worker's lock; the resource pool still bounds concurrency), and only the first completion of
a burst wakes the loop. Thousands of short sync tasks thus cost a few loop wake-ups, not one
future, one thread hand-off and one wake-up each.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import queue
import threading
import time
from concurrent.futures import Executor
from typing import Any, Protocol

from .state import Job
from .tasks import _CURRENT, TaskContext, error_fields, import_fn

__all__ = ["ThreadHost", "ThreadRunner", "process_entry", "process_pool"]

_MAX_THREADS = 512


class ThreadHost(Protocol):
    """What task threads ask of the worker (``worker.Worker``)."""

    def make_context(self, job: Job) -> None: ...

    def thread_finished(self, job: Job) -> Job | None:
        """Free ``job``'s resources (called in the thread); the next sync job to run, if any."""

    def threads_done(self, items: list[Any]) -> None:
        """On the loop: a burst of (job, ok, value or error fields, seconds)."""


class ThreadRunner:
    """Threads running sync tasks; completions are handed to the loop in bursts."""

    def __init__(self, worker: ThreadHost, loop: asyncio.AbstractEventLoop, name: str):
        self._worker = worker
        self._loop = loop
        self._name = name
        self._q: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._done: list[Any] = []
        self._lock = threading.Lock()
        self._wake = False

    def submit(self, job: Job, running: int) -> None:
        """Run ``job`` (its resources are acquired); ``running`` sync tasks hold resources now,
        so that many threads must exist for none of them to wait for a thread."""
        if len(self._threads) < min(running, _MAX_THREADS):
            t = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True)
            self._threads.append(t)
            t.start()
        self._q.put(job)

    def _run(self) -> None:
        q = self._q
        worker = self._worker
        perf = time.perf_counter
        while True:
            job = q.get()
            if job is None:
                return
            while job is not None:
                if job.ctx is None:
                    worker.make_context(job)
                token = _CURRENT.set(job.ctx)
                t0 = perf()
                job.t0 = t0
                try:
                    fn = job.call
                    kw = job.kwargs
                    value = fn(*job.args, **kw) if kw else fn(*job.args)  # type: ignore[misc]
                    if inspect.iscoroutine(value):  # async def forced into a thread: its own loop
                        value = asyncio.run(value)
                    ok = True
                except BaseException as exc:  # the task's failure is its result; the thread lives on
                    value = error_fields(exc)
                    ok = False
                finally:
                    _CURRENT.reset(token)
                dt = perf() - t0
                nxt = worker.thread_finished(job)
                with self._lock:
                    self._done.append((job, ok, value, dt))
                    wake = not self._wake
                    self._wake = True
                if wake:
                    try:
                        self._loop.call_soon_threadsafe(self._drain)
                    except RuntimeError:  # loop closed: the node is gone
                        return
                job = nxt

    def _drain(self) -> None:
        with self._lock:
            items, self._done = self._done, []
            self._wake = False
        self._worker.threads_done(items)

    def shutdown(self) -> None:
        for _ in self._threads:
            self._q.put(None)
        self._threads.clear()


def process_entry(fn: str, args: list[Any], kwargs: dict[str, Any] | None, info: list[Any]) -> tuple[bool, Any, float]:
    """Runs in a pool process: import by path, call, report (ok, value or error fields, seconds)."""
    task_id, node, owner, attempt, ckpt, rank, devices = info
    ctx = TaskContext(task_id, node, owner, attempt, ckpt, None, rank=rank, devices=tuple(devices))
    token = _CURRENT.set(ctx)
    # the task's GPUs, for libraries this process initialises CUDA in from here on (a pool process
    # that already initialised CUDA keeps the devices it saw then: use ctx.devices to pick one)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
    t0 = time.perf_counter()
    try:
        f, _is_async = import_fn(fn)
        value = f(*args, **(kwargs or {}))
        if inspect.iscoroutine(value):
            value = asyncio.run(value)
        return True, value, time.perf_counter() - t0
    except BaseException as exc:
        return False, error_fields(exc), time.perf_counter() - t0
    finally:
        _CURRENT.reset(token)
        if devices:
            if visible is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = visible


def process_pool(workers: int) -> Executor:
    """A pool of ``workers`` fresh interpreters (spawned, never forked: the loop, its sockets
    and the task threads must not be copied into a child)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
