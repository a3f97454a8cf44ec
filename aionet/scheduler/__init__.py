"""Tasks: submit functions by import path, get results back wherever they ran.

``node.submit/map/gather`` delegate to the node's :class:`Scheduler`; placement policies are
pure functions in :mod:`aionet.scheduler.policies`.
"""

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
    "NodeView",
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
