"""What the owner and the worker decide, for ``service.Scheduler`` to do.

The owner's and worker's reactions to stimuli (results, a node's death, a reconciliation after
a wrong death verdict) change only their own tables and return these instructions; the service
performs them afterwards (decide, then do the I/O). Tests feed stimuli and assert on the list.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AcceptLocal",
    "Announce",
    "FailFuture",
    "Instruction",
    "Interrupt",
    "PostResult",
    "Resolve",
    "Resubmit",
    "SendCtrl",
    "SendSpecs",
    "Suspect",
]


@dataclass(frozen=True, slots=True)
class SendSpecs:
    """Send ``owner.outbox[peer]`` (the placements for ``peer``), then call ``owner.specs_sent``."""

    peer: str


@dataclass(frozen=True, slots=True)
class AcceptLocal:
    """Task specs the owner placed on this node: hand them to the local worker."""

    specs: list[Any]


@dataclass(frozen=True, slots=True)
class SendCtrl:
    """Cancel or free (``kind``: M_CANCEL / M_FREE) task ids on ``peer`` (this node included)."""

    peer: str
    kind: int
    tids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Resolve:
    """A task completed: resolve its future (once)."""

    fut: asyncio.Future[None]


@dataclass(frozen=True, slots=True)
class FailFuture:
    """A task failed, was cancelled or lost: fail its future with ``exc`` (once)."""

    fut: asyncio.Future[None]
    exc: BaseException


@dataclass(frozen=True, slots=True)
class Resubmit:
    """A placed task goes back to the placement queue (its node died, or lost it): attempt ``attempt``
    did not count; ``retries_left`` remain. Placement follows on the owner's own dispatch."""

    tid: int
    name: str
    attempt: int
    retries_left: int
    reason: str


@dataclass(frozen=True, slots=True)
class Suspect:
    """``peer`` could not be reached (a dependency fetch failed): ask membership's view."""

    peer: str


@dataclass(frozen=True, slots=True)
class Announce:
    """Tell ``peer`` which attempts this owner believes it runs (``M_RECONCILE``); with
    ``ask_back`` the peer announces its own to us too."""

    peer: str
    tasks: tuple[tuple[int, int], ...]
    ask_back: bool


@dataclass(frozen=True, slots=True)
class PostResult:
    """Worker: queue ``item`` (a result-stream entry) for ``owner``."""

    owner: str
    item: list[Any]


@dataclass(frozen=True, slots=True)
class Interrupt:
    """Worker: cancel a running async task (its completion callback frees the job)."""

    task: asyncio.Future[Any]


Instruction = SendSpecs | AcceptLocal | SendCtrl | Resolve | FailFuture | Resubmit | Suspect | Announce
WorkerInstruction = PostResult | Interrupt
