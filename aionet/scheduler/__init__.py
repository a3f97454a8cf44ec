"""Tasks: submit functions by import path, get results back wherever they ran.

``node.submit/map/gather`` delegate to the node's :class:`Scheduler`; placement policies are
objects with ``choose(task, nodes, ctx)`` (:mod:`aionet.scheduler.placement`, docs/scheduler.md);
the built-in heuristics are pure functions in :mod:`aionet.scheduler.policies`, the learned one
is :mod:`aionet.scheduler.learned`.
"""

from .placement import Completion, LearningPolicy, PlacementPolicy, PolicyContext, PolicyRegistry
from .policies import POLICIES, NodeView, RuntimeEstimator, TaskReq, choose, window_size
from .service import Scheduler
from .state import normalize_resources
from .tasks import (
    TaskCancelled,
    TaskContext,
    TaskFailed,
    TaskLost,
    TaskRef,
    TaskTimeout,
    Unschedulable,
    task,
    task_context,
)

__all__ = [
    "POLICIES",
    "Completion",
    "LearningPolicy",
    "NodeView",
    "PlacementPolicy",
    "PolicyContext",
    "PolicyRegistry",
    "RuntimeEstimator",
    "Scheduler",
    "TaskCancelled",
    "TaskContext",
    "TaskFailed",
    "TaskLost",
    "TaskRef",
    "TaskReq",
    "TaskTimeout",
    "Unschedulable",
    "choose",
    "normalize_resources",
    "task",
    "task_context",
    "window_size",
]
