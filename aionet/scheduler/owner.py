"""The submitting side: the ownership table.

The node that submits a task owns it, as in Ray's ownership model: it alone knows whether the
task waits for dependencies, where it was placed, which attempt counts and where its result
lives, so there is no central scheduler to lose. Everything here is O(1) per task: records
sit in dicts keyed by task id, per-node indexes make a node death cost O(tasks on that node),
and placement runs in bounded batches on the loop so heartbeats never starve.

Exactly-once: a record accepts the first completion of any attempt while it is placed; every
later completion (an old attempt from a node wrongly presumed dead, a stolen copy) is dropped,
so each future is resolved once. A task's state changes only in :meth:`Owner._transition`.

The owner decides, the service (:class:`.host.SchedulerHost`) does the I/O: the stimuli
(``on_results``, ``node_dead``, ``announce``) return :mod:`.instructions`; user entry points
and the owner's loop callbacks hand theirs to ``sched.perform``. After a wrong death verdict the
owner announces what it believes runs on the peer; the worker answers ``R_LOST`` for what it
dropped, and the owner resubmits that under the retry rules (the first completion still wins).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
from collections.abc import Mapping
from typing import Any

from ..errors import TaskError
from ..stats import NodeViewStats, OwnerStats
from .allow import is_never_run, never_run_reason
from .host import SchedulerHost
from .instructions import (
    AcceptLocal,
    Announce,
    FailFuture,
    Instruction,
    Resolve,
    Resubmit,
    SendCtrl,
    SendSpecs,
    Suspect,
)
from .placement import PlacementPolicy, PolicySet, task_req
from .policies import NodeView, RuntimeEstimator, TaskReq, feasible, least_loaded, unsatisfiable_reason, window_size
from .state import DEFAULT_RES, TASK_NEXT, TERMINAL, InvalidTransition, Rec, TaskState, normalize_resources
from .tasks import (
    TaskCancelled,
    TaskFailed,
    TaskLost,
    TaskRef,
    TaskTimeout,
    Unschedulable,
    dep_error,
    extract_refs,
    fn_path,
    locality_keys,
    order_refs,
    retry_names,
)
from .wire import (
    DEP_AT,
    DEP_VALUE,
    EXECUTORS,
    F_HAS_DEPREFS,
    F_PINNED,
    F_PREEMPTIBLE,
    M_CANCEL,
    M_FREE,
    R_CKPT,
    R_DEPLOST,
    R_ERROR,
    R_HELD,
    R_LOST,
    R_MOVED,
    R_REJECT,
    R_TIMEOUT,
    R_VALUE,
)

__all__ = ["Owner"]

WAITING, READY, PLACED, DONE, FAILED, CANCELLED = TaskState
NO_PRIO = -(2**62)
MAX_DEPLOST = 20


class Owner:
    """Ownership table, placement and recovery for the tasks this node submits."""

    def __init__(self, sched: SchedulerHost):
        self.sched = sched
        self.name = sched.name
        cfg = sched.cfg
        self.policy = cfg.policy
        self.default_retries = cfg.default_retries
        self.batch_size = max(1, cfg.batch_size)
        self.queue_time = cfg.queue_time
        self.max_per_slot = max(1, cfg.max_queued_per_slot)
        self.wait_for_nodes = cfg.wait_for_nodes
        self.estimator = RuntimeEstimator()
        self.policies = PolicySet(self.estimator, sched.clock)
        self.policy_obj = self.policies.get(self.policy)
        self.views: dict[str, NodeView] = {}
        self._live: list[NodeView] | None = None
        self.dead: set[str] = set()
        self.recs: dict[int, Rec] = {}
        self.by_key: dict[str, Rec] = {}
        self.placed: dict[str, dict[int, Rec]] = {}
        self.held: dict[str, dict[int, Rec]] = {}
        self.ready: list[tuple[int, int, Rec]] = []
        self.rr_seq = 0
        self._tid = itertools.count(1)
        self._seq = itertools.count()
        self._dispatch_pending = False
        self._retry_timer: asyncio.TimerHandle | None = None
        self.outbox: dict[str, list[Any]] = {}
        self._dirty: set[str] = set()
        self._sending: set[str] = set()  # peers whose outbox the service is sending
        self._ctrl: dict[tuple[str, int], list[int]] = {}
        self._ctrl_pending = False
        self._out: list[Instruction] = []  # decided, not yet performed (see _take)
        self._thread = threading.get_ident()
        self.closed = False
        # plain ints on the hot path; stats() copies them out (the fields of OwnerStats)
        counted = ("submitted", "completed", "failed", "cancelled", "resubmitted", "duplicates_dropped")
        self.counts = dict.fromkeys((*counted, "moved", "rejected", "reconciled_lost"), 0)

    @staticmethod
    def _transition(rec: Rec, new: TaskState) -> None:
        """The one place a task's state changes on its owner: checked against the table."""
        if new not in TASK_NEXT[rec.state]:
            raise InvalidTransition(rec.name, rec.state, new, "owner")
        rec.state = new

    def _take(self) -> list[Instruction]:
        """The instructions decided so far (batched cancels and frees last), for the service."""
        if self._ctrl:
            ctrl, self._ctrl = self._ctrl, {}
            self._out.extend(SendCtrl(node, kind, tuple(tids)) for (node, kind), tids in ctrl.items())
        out, self._out = self._out, []
        return out

    def _perform(self) -> None:
        """Hand what was decided to the service (for entry points that return nothing)."""
        if self._out or self._ctrl:
            self.sched.perform(self._take())

    # ------------------------------------------------------------------ submitting
    def submit(
        self,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        *,
        resources: Mapping[str, Any] | None = None,
        priority: int = 0,
        retries: int | None = None,
        timeout: float | None = None,
        executor: str | None = None,
        key: str | None = None,
        preemptible: bool = False,
        affinity: str | None = None,
        policy: str | PlacementPolicy | None = None,
        after: Any = None,
        retry_on: Any = None,
        prefer: str | None = None,
    ) -> TaskRef:
        if self.closed:
            raise TaskError("the scheduler is stopped (node not running)")
        if self.sched.loop is None:
            raise TaskError("start the node (await node.start() or async with) before submitting tasks")
        if key is not None:
            existing = self.by_key.get(key)
            if existing is not None:
                return TaskRef(self, existing)
        path = fn_path(fn)
        module = path.partition(":")[0]
        if is_never_run(module):  # no node runs it (the worker checks too): fail at once
            raise TaskError(f"task function {path!r} refused: {never_run_reason(module)}")
        try:
            exe = EXECUTORS[executor]
        except (KeyError, TypeError):
            raise ValueError(f"executor must be None, 'thread' or 'process', not {executor!r}") from None
        if policy is not None:
            self.policies.get(policy)  # ConfigError naming the choices for a bad name
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be positive, not {timeout!r}")
        prio = int(priority)
        tid = next(self._tid)
        rec = Rec(tid, key if key is not None else f"{self.name}:{tid}", path, self.sched.loop.create_future())
        rec.key = key
        rec.prio = prio
        if resources:
            rec.res = normalize_resources(resources)
            rec.res_wire = rec.res
        rec.exe = exe
        rec.timeout = timeout
        rec.retries = self.default_retries if retries is None else int(retries)
        rec.affinity, rec.policy, rec.prefer = affinity, policy, prefer
        rec.locality = locality_keys(args, kwargs) if self.sched.locate is not None else ()
        rec.retry_on = retry_names(retry_on) if retry_on else rec.retry_on
        rec.submitted = self.sched.clock()
        found: dict[int, tuple[int, TaskRef]] = {}
        rec.args = extract_refs(list(args), found) if args else []
        rec.kwargs = extract_refs(kwargs, found) if kwargs else None
        pinned = affinity is not None or (policy or self.policy) == "round-robin"  # stealing would undo a rotation
        flags = (F_PREEMPTIBLE if preemptible else 0) | (F_PINNED if pinned else 0)
        order_only = order_refs(after, self)
        self.recs[tid] = rec
        if key is not None:
            self.by_key[key] = rec
        ref = TaskRef(self, rec)
        self.counts["submitted"] += 1
        if found or order_only:
            deps: list[Rec] = []
            for _i, r in sorted(found.values(), key=lambda e: e[0]):
                if r._owner is not self:
                    self.recs.pop(tid, None)
                    raise TaskError(f"{r!r} belongs to another node's scheduler; TaskRefs do not travel")
                deps.append(r._rec)
            if deps:
                flags |= F_HAS_DEPREFS
            rec.n_vdeps = len(deps)
            deps += order_only  # waited for, never sent: the worker fetches only deps[:n_vdeps]
            rec.deps = deps
            rec.flags = flags
            for d in deps:
                d.pins += 1
            if self._deps_ready(rec):
                self._make_ready(rec)
        else:
            rec.flags = flags
            self._make_ready(rec)
        self._perform()  # a dependency that already failed failed this task too
        return ref

    def set_priority(self, rec: Rec, priority: int) -> bool:
        """A task still at its owner (waiting or ready) takes ``priority`` from now on."""
        if rec.state not in (WAITING, READY) or rec.tid not in self.recs:
            return False
        if rec.prio != priority:
            rec.prio = priority
            if rec.state == READY:
                self._make_ready(rec)  # the old heap entry goes stale (skipped by _dispatch)
        return True

    def _deps_ready(self, rec: Rec) -> bool:
        """True when every dependency has a result; otherwise registers ``rec`` to wait (or
        fails it when a dependency failed)."""
        n = 0
        for d in rec.deps or ():
            st = d.state
            if st == DONE:
                continue
            if st in (FAILED, CANCELLED):
                self._fail(rec, dep_error(rec, d))
                return False
            n += 1
            if d.dependents is None:
                d.dependents = [rec]
            else:
                d.dependents.append(rec)
        if n:
            if rec.state is not WAITING:
                self._transition(rec, WAITING)
            rec.waiting = n
            return False
        return True

    def _make_ready(self, rec: Rec) -> None:
        if rec.state is not READY:  # a re-queued record keeps its state
            self._transition(rec, READY)
        heapq.heappush(self.ready, (-rec.prio, next(self._seq), rec))
        if not self._dispatch_pending:
            self._dispatch_pending = True
            self.sched.loop.call_soon(self._dispatch)

    def schedule_dispatch(self) -> None:
        if not self._dispatch_pending and self.ready:
            self._dispatch_pending = True
            self.sched.loop.call_soon(self._dispatch)

    # ------------------------------------------------------------------ placement
    def _live_views(self) -> list[NodeView]:
        if self._live is None:
            self._live = list(self.views.values())
        return self._live

    def _req(self, rec: Rec) -> TaskReq:
        return task_req(rec, self.name, self.sched.locate)

    def _dispatch(self) -> None:
        self._dispatch_pending = False
        heap = self.ready
        if not heap or self.closed:
            return
        live = self._live_views()
        budget = self.batch_size
        deferred: list[tuple[int, int, Rec]] = []
        retry_later = False
        now = self.sched.clock()
        ctx = self.policies.ctx
        ctx.now = now
        while heap and budget > 0:
            prio, _, rec = heap[0]
            if rec.state != READY or prio != -rec.prio:  # done elsewhere, or re-prioritized
                heapq.heappop(heap)
                continue
            if rec.deps is not None and not self._deps_ready(rec):
                heapq.heappop(heap)
                continue
            req = self._req(rec)
            ctx.seq = self.rr_seq
            name = (self.policy_obj if rec.policy is None else self.policies.get(rec.policy)).choose(req, live, ctx)
            if name is None:
                entry = heapq.heappop(heap)
                if not feasible(req, live):
                    waiting_for_nodes = not live and now - rec.submitted < self.wait_for_nodes
                    if self.sched.info_pending() or waiting_for_nodes:
                        deferred.append(entry)
                        retry_later = True
                        continue
                    self._fail(rec, Unschedulable(unsatisfiable_reason(req, live)))
                    continue
                deferred.append(entry)
                # a plain cpu task that finds no room means no cpu task has room: stop scanning
                if rec.res is DEFAULT_RES or len(deferred) >= 64:
                    break
                continue
            heapq.heappop(heap)
            view = self.views.get(name) or self.views[least_loaded(req, live) or live[0].name]  # not offered: ours
            rec.placed_at = now
            self._place(rec, view)
            budget -= 1
        for e in deferred:
            heapq.heappush(heap, e)
        if heap and budget == 0:
            self.schedule_dispatch()
        elif retry_later and self._retry_timer is None:
            self._retry_timer = self.sched.loop.call_later(0.05, self._retry_dispatch)
        self._flush()
        self._perform()

    def _retry_dispatch(self) -> None:
        self._retry_timer = None
        self.schedule_dispatch()

    def _place(self, rec: Rec, view: NodeView) -> None:
        name = view.name
        self._transition(rec, PLACED)
        rec.node = name
        rec.attempt += 1
        pl = self.placed.get(name)
        if pl is None:
            pl = self.placed[name] = {}
        pl[rec.tid] = rec
        view.inflight += 1
        est = self.estimator.estimate(rec.fn, name)
        if est is None:
            est = self.estimator.mean(rec.fn) or 0.0
        rec.est = est
        view.backlog += est
        if rec.prio > view.max_prio:
            view.max_prio = rec.prio
        if rec.res is not DEFAULT_RES:
            free = view.free
            for k, v in rec.res.items():
                if k != "cpu":
                    free[k] = free.get(k, 0.0) - v
        self.rr_seq += 1
        deps = self._deps_wire(rec, name) if rec.deps is not None and rec.n_vdeps else None
        # the S_* fields of wire.py, in order
        spec = [rec.tid, rec.fn, rec.args, rec.kwargs, rec.prio, rec.res_wire, rec.exe, rec.flags, rec.timeout,
                rec.attempt, deps, rec.ckpt, rec.key]  # fmt: skip
        box = self.outbox.get(name)
        if box is None:
            box = self.outbox[name] = []
        box.append(spec)
        self._dirty.add(name)

    def _deps_wire(self, rec: Rec, target: str) -> list[list[Any]]:
        out = []
        for i, d in enumerate((rec.deps or ())[: rec.n_vdeps]):
            if d.holder is not None and (d.holder == target or not d.has_value):
                out.append([i, DEP_AT, [d.holder, d.tid]])
            else:
                out.append([i, DEP_VALUE, d.value])
        return out

    def _unplace(self, rec: Rec) -> None:
        """Undo a placement's bookkeeping (the task finished, failed, moved or its node died)."""
        node = rec.node
        pl = self.placed.get(node) if node is not None else None
        if pl is not None:
            pl.pop(rec.tid, None)
        view = self.views.get(node) if node is not None else None
        if view is not None:
            view.inflight -= 1
            view.backlog -= rec.est
            if view.inflight <= 0:
                view.inflight = 0
                view.backlog = 0.0
                view.max_prio = NO_PRIO
            if rec.res is not DEFAULT_RES:
                free = view.free
                for k, v in rec.res.items():
                    if k != "cpu":
                        free[k] = free.get(k, 0.0) + v

    # ------------------------------------------------------------------ sending
    def _flush(self) -> None:
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        for name in dirty:
            if name == self.name:
                box = self.outbox.pop(name, None)
                if box:
                    self._out.append(AcceptLocal(box))
            elif name not in self._sending:
                self._sending.add(name)  # until specs_sent(): the service drains outbox[name]
                self._out.append(SendSpecs(name))

    def specs_sent(self, name: str) -> None:
        """The service finished sending ``name``'s outbox (see :meth:`_flush`)."""
        self._sending.discard(name)

    def spec_unsendable(self, tid: int, exc: BaseException) -> None:
        """A placed task's spec does not serialize: fail the task (its batch-mates are sent)."""
        rec = self.recs.get(tid)
        if rec is not None and rec.state == PLACED:
            self._fail(rec, TaskError(f"task {rec.name}: cannot send its arguments: {exc}"))
            self._perform()

    def _send_ctrl(self, node: str, kind: int, tid: int) -> None:
        """Cancel/free messages, batched per loop iteration."""
        if node in self.dead:
            return
        k = (node, kind)
        lst = self._ctrl.get(k)
        if lst is None:
            lst = self._ctrl[k] = []
        lst.append(tid)
        if not self._ctrl_pending:
            self._ctrl_pending = True
            self.sched.loop.call_soon(self._flush_ctrl)

    def _flush_ctrl(self) -> None:
        self._ctrl_pending = False
        self._perform()

    # ------------------------------------------------------------------ results
    def on_results(self, worker: str, items: list[Any], load: Any) -> list[Instruction]:
        """Results, checkpoints, moves and answers from ``worker``: what to do about them."""
        view = self.views.get(worker)
        if view is not None and load:
            self._apply_load(view, load, mine=True)
        recs = self.recs
        stats = self.counts
        est = self.estimator
        policies = self.policies
        for item in items:
            tid, _attempt, status, payload, runtime, nbytes = item
            rec = recs.get(tid)
            if rec is None or rec.state != PLACED:
                if status == R_CKPT:
                    if rec is not None and rec.state not in TERMINAL:
                        rec.ckpt = payload
                elif status == R_HELD:
                    self._send_ctrl(worker, M_FREE, tid)  # a late duplicate: let the worker drop it
                    stats["duplicates_dropped"] += 1
                elif status != R_MOVED and status != R_LOST:
                    stats["duplicates_dropped"] += 1
                continue
            if status == R_CKPT:
                rec.ckpt = payload
                continue
            if status == R_MOVED:
                if rec.node == worker:
                    self._move(rec, payload)
                continue
            if status == R_LOST:  # the worker does not have this attempt (it took us for dead)
                if rec.node == worker and rec.attempt == _attempt:
                    stats["reconciled_lost"] += 1
                    self._unplace(rec)
                    rec.node = None  # nothing to cancel there
                    self._retry(rec, f"node {worker} lost it ({payload})", count=True)
                continue
            where = rec.node
            self._unplace(rec)
            if where is not None and where != worker:
                self._send_ctrl(where, M_CANCEL, tid)  # another attempt may still run there
            rec.node = worker
            if status in (R_VALUE, R_HELD, R_ERROR):
                est.update(rec.fn, worker, runtime)
                if policies.observers:
                    policies.observe(rec.tid, rec.fn, self.views.get(worker), worker, runtime, rec.placed_at, status)
            if status == R_VALUE:
                rec.value = payload
                rec.has_value = True
                rec.nbytes = nbytes
                self._done(rec)
            elif status == R_HELD:
                rec.holder = worker
                rec.nbytes = nbytes
                h = self.held.get(worker)
                if h is None:
                    h = self.held[worker] = {}
                h[tid] = rec
                self._done(rec)
            elif status == R_ERROR:
                rtype, msg, tb = payload[:3]
                bases = payload[3] if len(payload) > 3 and isinstance(payload[3], list) else [rtype]
                if rec.retry_on and rec.retries > 0 and not rec.retry_on.isdisjoint(map(str, bases)):
                    self._retry(rec, f"it raised {rtype}: {msg}", count=True)  # retry_on=
                else:
                    self._fail(rec, TaskFailed(rec.name, worker, str(rtype), str(msg), str(tb)))
            elif status == R_TIMEOUT:
                self._fail(rec, TaskTimeout(f"task {rec.name} ({rec.fn}) on {worker}: {payload}"))
            elif status == R_DEPLOST:
                self._dep_lost(rec, payload)
            elif status == R_REJECT:
                stats["rejected"] += 1
                rec.exclude = rec.exclude | {worker}
                rec.attempt -= 1
                self._make_ready(rec)
        if view is not None:
            view.window = window_size(
                view.slots, est.node_mean(worker), queue_time=self.queue_time, max_per_slot=self.max_per_slot
            )
        self.schedule_dispatch()
        return self._take()

    def _apply_load(self, view: NodeView, load: Any, mine: bool) -> None:
        try:
            q, r, m, free = load[:4]
            view.other = max(0, int(q) + int(r) - (int(m) if mine else view.inflight))
            if isinstance(free, dict):
                view.free = {k: float(v) for k, v in free.items()}
        except (TypeError, ValueError):
            pass

    def load_report(self, node: str, load: Any) -> None:
        if isinstance(load, list) and len(load) > 4 and load[4] is False:
            self.node_up(node, {}, run_tasks=False)  # it is draining: place nothing more there
            return
        view = self.views.get(node)
        if view is not None:
            self._apply_load(view, load, mine=False)

    def _move(self, rec: Rec, thief: Any) -> None:
        """A queued task was stolen by ``thief``: it is now accounted there."""
        self.counts["moved"] += 1
        self._unplace(rec)
        thief = str(thief)
        rec.node = thief
        if thief in self.dead or (thief not in self.views and thief != self.name):
            # Placed again, without using up a retry: the task never ran on the thief as far as
            # this owner knows (a thief that dies while running it is a death of a node it was
            # placed on, counted there). A thief declared dead can still be alive and stealing
            # (a false suspicion, a partition only some nodes see): counting each of its steals
            # lost tasks that nothing had killed. Its copy's result is still taken if it is first.
            self._retry(rec, f"node {thief} (which took it over) is dead to this owner", count=False)
            return
        pl = self.placed.get(thief)
        if pl is None:
            pl = self.placed[thief] = {}
        pl[rec.tid] = rec
        view = self.views.get(thief)
        if view is not None:
            view.inflight += 1
            view.backlog += rec.est

    def _dep_lost(self, rec: Rec, payload: Any) -> None:
        """The executing node could not fetch a dependency: its holder is probably dead."""
        rec.deplost += 1
        try:
            holder = str(payload[0])
        except Exception:
            holder = ""
        if rec.deplost > MAX_DEPLOST:
            self._fail(rec, TaskLost(f"task {rec.name}: dependency on {holder} could not be fetched"))
            return
        if holder:
            self._out.append(Suspect(holder))
        rec.attempt -= 1  # not the task's fault: does not count as an attempt
        self._transition(rec, READY)
        self.sched.loop.call_later(min(0.02 * rec.deplost, 0.5), self._requeue_if_ready, rec)

    def _requeue_if_ready(self, rec: Rec) -> None:
        if rec.state == READY:
            self._make_ready(rec)

    def _done(self, rec: Rec) -> None:
        self._transition(rec, DONE)
        self.counts["completed"] += 1
        fut = rec.fut
        if not fut.done():
            self._out.append(Resolve(fut))
        deps = rec.dependents
        if deps is not None:
            rec.dependents = None
            for d in deps:
                if d.state == WAITING:
                    d.waiting -= 1
                    if d.waiting <= 0:
                        self._make_ready(d)
        if rec.holder is None:
            # value is here: nothing to re-run, nothing to free remotely
            self.recs.pop(rec.tid, None)
            rec.args = rec.kwargs = rec.ckpt = None
            self._release_deps(rec)
            if rec.nrefs <= 0 and rec.pins <= 0 and rec.key is not None:
                self._forget(rec)
        elif rec.nrefs <= 0 and rec.pins <= 0:
            self._forget(rec)

    def _fail(self, rec: Rec, exc: BaseException) -> None:
        """Finish ``rec`` with an error, and every task waiting on it (iteratively)."""
        stack: list[tuple[Rec, BaseException]] = [(rec, exc)]
        while stack:
            r, e = stack.pop()
            if r.state in TERMINAL:
                continue
            if r.state == PLACED:
                self._unplace(r)
                if r.node is not None:
                    self._send_ctrl(r.node, M_CANCEL, r.tid)
            cancelled = isinstance(e, TaskCancelled)
            self._transition(r, CANCELLED if cancelled else FAILED)
            self.counts["cancelled" if cancelled else "failed"] += 1
            fut = r.fut
            if not fut.done():
                self._out.append(FailFuture(fut, e))
            self.recs.pop(r.tid, None)
            r.args = r.kwargs = r.ckpt = None
            self._release_deps(r)
            if r.nrefs <= 0 and r.key is not None:
                self._forget(r)
            deps = r.dependents
            if deps is not None:
                r.dependents = None
                for d in deps:
                    if d.state == WAITING:
                        stack.append((d, dep_error(d, r, e)))

    def _release_deps(self, rec: Rec) -> None:
        deps = rec.deps
        if deps is None:
            return
        rec.deps = None
        for d in deps:
            d.pins -= 1
            if d.pins <= 0 and d.nrefs <= 0 and d.state in TERMINAL:
                self._forget(d)

    def _forget(self, rec: Rec) -> None:
        """Nobody can ask for ``rec`` any more: drop it here and its result where it lives."""
        if rec.key is not None and self.by_key.get(rec.key) is rec:
            del self.by_key[rec.key]
        holder = rec.holder
        if holder is not None:
            rec.holder = None
            h = self.held.get(holder)
            if h is not None:
                h.pop(rec.tid, None)
            self._send_ctrl(holder, M_FREE, rec.tid)
        self.recs.pop(rec.tid, None)
        self._release_deps(rec)

    def ref_dropped(self, rec: Rec) -> None:
        """A TaskRef was garbage-collected (possibly in another thread)."""
        if threading.get_ident() != self._thread:
            self.sched.loop.call_soon_threadsafe(self.ref_dropped, rec)
            return
        rec.nrefs -= 1
        if rec.nrefs <= 0 and rec.pins <= 0 and rec.state in TERMINAL and (rec.holder or rec.key):
            self._forget(rec)

    def cancel(self, rec: Rec) -> bool:
        if rec.state in TERMINAL:
            return False
        self._fail(rec, TaskCancelled(f"task {rec.name} ({rec.fn}) was cancelled"))
        self._perform()
        return True

    # ------------------------------------------------------------------ awaiting
    async def result(self, rec: Rec) -> Any:
        """The value of ``rec`` once done, fetched from its holder if need be (the service's I/O)."""
        return await self.sched.await_result(rec)

    def result_lost(self, rec: Rec) -> list[Instruction]:
        """The holder no longer has the result (restarted): run the task again."""
        holder = rec.holder
        if holder is not None:
            h = self.held.get(holder)
            if h is not None:
                h.pop(rec.tid, None)
        self._rerun(rec, f"its result on {holder} was lost")
        return self._take()

    def _rerun(self, rec: Rec, why: str) -> None:
        rec.holder = None
        self._transition(rec, READY)
        rec.fut = self.sched.loop.create_future()
        self.recs[rec.tid] = rec
        self._retry(rec, why, count=True)

    # ------------------------------------------------------------------ membership
    def node_up(self, name: str, total: Mapping[str, float], run_tasks: bool) -> None:
        self.dead.discard(name)
        if not run_tasks:
            if self.views.pop(name, None) is not None:
                self._live = None
            return
        view = self.views.get(name)
        if view is None:
            view = NodeView(name, dict(total), free=dict(total))
            view.window = window_size(
                view.slots, self.estimator.node_mean(name), queue_time=self.queue_time, max_per_slot=self.max_per_slot
            )
            self.views[name] = view
            self._live = None
        else:
            view.total = dict(total)
        self.schedule_dispatch()

    def node_dead(self, name: str, graceful: bool) -> list[Instruction]:
        """Re-run what was placed on ``name`` (counting against retries unless it left
        cleanly) and what only ``name`` held a result of and is still wanted."""
        self.dead.add(name)
        if self.views.pop(name, None) is not None:
            self._live = None
        lost = self.placed.pop(name, None) or {}
        for rec in list(lost.values()):
            if rec.state == PLACED and rec.node == name:
                self._retry(rec, f"node {name} {'left' if graceful else 'died'}", count=not graceful)
        held = self.held.pop(name, None) or {}
        for rec in list(held.values()):
            if rec.holder != name:
                continue
            if rec.nrefs <= 0 and rec.pins <= 0:
                rec.holder = None
                self._forget(rec)
            elif rec.has_value:
                rec.holder = None  # we fetched it already: the copy here is the result now
            else:
                self._rerun(rec, f"its result was on node {name}, which {'left' if graceful else 'died'}")
        for k in [k for k in self._ctrl if k[0] == name]:
            del self._ctrl[k]
        self.outbox.pop(name, None)
        self.schedule_dispatch()
        return self._take()

    def announce(self, peer: str, ask_back: bool) -> list[Instruction]:
        """``peer``, counted dead by one of us, is alive (or asks): list the attempts we believe
        it runs (not those still unsent in our outbox), so that it answers for those it lost."""
        unsent = {spec[0] for spec in self.outbox.get(peer) or ()}
        pl = (self.placed.get(peer) or {}).values()
        tasks = tuple((r.tid, r.attempt) for r in pl if r.state == PLACED and r.node == peer and r.tid not in unsent)
        if tasks or ask_back:
            self._out.append(Announce(peer, tasks, ask_back))
        return self._take()

    def _retry(self, rec: Rec, why: str, count: bool) -> None:
        if count:
            rec.retries -= 1
        if rec.retries < 0:
            self._fail(rec, TaskLost(f"task {rec.name} ({rec.fn}) lost: {why}, and its retries are used up"))
            return
        self.counts["resubmitted"] += 1
        self._out.append(Resubmit(rec.tid, rec.name, rec.attempt, rec.retries, why))
        rec.node = None
        if rec.deps is not None:
            if self._deps_ready(rec):
                self._make_ready(rec)
        else:
            self._make_ready(rec)

    # ------------------------------------------------------------------ lifecycle
    def shutdown(self, why: str) -> None:
        self.closed = True
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        for rec in list(self.recs.values()):
            if rec.state not in TERMINAL:
                self._fail(rec, TaskLost(f"task {rec.name}: {why}"))
        self._perform()

    def stats(self) -> OwnerStats:
        return OwnerStats(
            **self.counts,
            owned=len(self.recs),
            ready=len(self.ready),
            nodes={
                n: NodeViewStats(inflight=v.inflight, window=v.window, other=v.other, backlog_s=round(v.backlog, 6))
                for n, v in self.views.items()
            },
        )
