"""Per-node priority queue, resource accounting and preemption choice (no I/O, no clock).

The worker keeps tasks that arrived but cannot start yet in a :class:`TaskQueue` (highest
priority first, FIFO within a priority) and admits them while :class:`ResourcePool` says they
fit. :func:`pick_preemptions` decides which running tasks to cancel so a higher-priority one
fits; it is pure so the rules (only preemptible, only strictly lower priority, lowest
priority and most recently started first, and only if it actually makes room) are tested
without running anything.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .policies import EPS, fits

__all__ = ["Preemptible", "ResourcePool", "TaskQueue", "pick_preemptions"]


class Queued(Protocol):
    """What the queue needs from an entry."""

    prio: int
    seq: int
    queued: bool


class TaskQueue:
    """A priority queue with O(log n) push/pop and O(1) removal (lazy: removed entries are
    skipped when they reach the top). ``len()`` counts live entries only."""

    __slots__ = ("_count", "_heap", "_live")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Any]] = []
        self._live = 0
        self._count = itertools.count()

    def __len__(self) -> int:
        return self._live

    def next_seq(self) -> int:
        return next(self._count)

    def push(self, item: Any) -> None:
        """Queue ``item`` (its ``seq`` orders equal priorities; give a re-queued item its old one)."""
        item.queued = True
        heapq.heappush(self._heap, (-item.prio, item.seq, item))
        self._live += 1

    def _clean(self) -> None:
        heap = self._heap
        while heap and not heap[0][2].queued:
            heapq.heappop(heap)

    def peek(self) -> Any | None:
        self._clean()
        return self._heap[0][2] if self._heap else None

    def pop(self) -> Any | None:
        self._clean()
        if not self._heap:
            return None
        item = heapq.heappop(self._heap)[2]
        item.queued = False
        self._live -= 1
        return item

    def remove(self, item: Any) -> bool:
        """Drop ``item`` wherever it is (lazy). False if it was not queued."""
        if not item.queued:
            return False
        item.queued = False
        self._live -= 1
        if self._live == 0:
            self._heap.clear()
        return True

    def items(self) -> Iterator[Any]:
        """Live entries in no particular order."""
        return (e[2] for e in self._heap if e[2].queued)

    def first_fitting(self, avail: Mapping[str, float], limit: int) -> Any | None:
        """A queued item that fits ``avail``, among about the ``limit`` best (the front of the
        heap): backfilling behind a head that waits for a busy GPU keeps the CPUs working."""
        live = [e for e in itertools.islice(self._heap, limit * 2) if e[2].queued]
        for _neg, _seq, item in heapq.nsmallest(limit, live):
            if fits(item.res, avail):
                return item
        return None

    def tail(self, n: int, accept: Any = None) -> list[Any]:
        """Up to ``n`` of the *last* items in priority order (lowest priority, newest first)
        that ``accept(item)`` allows: what a thief may take without delaying the head."""
        out = []
        for _neg, _seq, item in heapq.nlargest(len(self._heap), self._heap):
            if len(out) >= n:
                break
            if item.queued and (accept is None or accept(item)):
                out.append(item)
        return out

    def clear(self) -> list[Any]:
        live = [e[2] for e in self._heap if e[2].queued]
        for item in live:
            item.queued = False
        self._heap.clear()
        self._live = 0
        return live


class ResourcePool:
    """Free amounts of a node's resources; acquire/release are exact inverses."""

    __slots__ = ("free", "total")

    def __init__(self, total: Mapping[str, float]):
        self.total = dict(total)
        self.free = dict(total)

    def fits(self, req: Mapping[str, float]) -> bool:
        return fits(req, self.free)

    def acquire(self, req: Mapping[str, float]) -> None:
        free = self.free
        for k, v in req.items():
            free[k] = free.get(k, 0.0) - v

    def release(self, req: Mapping[str, float]) -> None:
        free = self.free
        for k, v in req.items():
            free[k] = free.get(k, 0.0) + v

    def could_ever_fit(self, req: Mapping[str, float]) -> bool:
        return fits(req, self.total)

    def used(self) -> dict[str, float]:
        return {k: self.total.get(k, 0.0) - self.free.get(k, 0.0) for k in self.total}


class GpuSlots:
    """Which of a node's GPUs (indices 0..n-1, CUDA ordinals within what the process sees)
    running tasks hold, so that tasks asking whole GPUs get distinct ones (``ctx.devices``)."""

    __slots__ = ("use",)

    def __init__(self, n: int):
        self.use = [0.0] * n

    def take(self, want: float) -> tuple[int, ...]:
        """Devices for a task asking ``want`` GPUs (the resource pool already said they fit):
        whole GPUs take idle devices, lowest index first; a fraction packs onto the busiest
        device that still has room, keeping whole devices free for whole-GPU tasks."""
        use = self.use
        if not use:
            return ()
        if want >= 1.0:
            n = round(want)
            idle = [i for i, u in enumerate(use) if u <= EPS][:n]
            if len(idle) < n:  # fractions spread over more devices than needed: the least used
                idle = sorted(range(len(use)), key=lambda i: (use[i], i))[:n]
            for i in idle:
                use[i] += 1.0
            return tuple(sorted(idle))
        room = [i for i, u in enumerate(use) if u + want <= 1.0 + EPS]
        best = max(room, key=lambda i: (use[i], -i)) if room else min(range(len(use)), key=lambda i: (use[i], i))
        use[best] += want
        return (best,)

    def give(self, devices: tuple[int, ...], want: float) -> None:
        """Return what :meth:`take` gave for a request of ``want``."""
        each = 1.0 if want >= 1.0 else want
        for d in devices:
            self.use[d] = max(0.0, self.use[d] - each)


@dataclass(slots=True, frozen=True)
class Preemptible:
    """A running task as preemption sees it."""

    key: Any
    prio: int
    started: float  # any monotonic order; later = started more recently
    res: Mapping[str, float]


def pick_preemptions(
    needed: Mapping[str, float],
    prio: int,
    free: Mapping[str, float],
    running: Sequence[Preemptible],
) -> list[Any] | None:
    """Keys of running tasks to cancel so a task needing ``needed`` at priority ``prio`` fits.

    Only tasks of strictly lower priority are candidates (the caller passes only preemptible
    async ones), lowest priority first and, within one, the most recently started (it has
    lost the least work). Returns None when even cancelling every candidate would not make
    room: preempting then would destroy work for nothing.
    """
    if fits(needed, free):
        return []
    cands = sorted((r for r in running if r.prio < prio), key=lambda r: (r.prio, -r.started))
    avail = dict(free)
    chosen = []
    for r in cands:
        # only cancel tasks that free something the newcomer is short of
        if not any(v > EPS and avail.get(k, 0.0) + EPS < v and r.res.get(k, 0.0) > EPS for k, v in needed.items()):
            continue
        chosen.append(r.key)
        for k, v in r.res.items():
            avail[k] = avail.get(k, 0.0) + v
        if fits(needed, avail):
            return chosen
    return None
