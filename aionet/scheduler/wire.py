"""Scheduler message layouts: the compact list forms of task specs, results, dependency
entries and control messages that owners and workers exchange, and the names of the scheduler's
channel and services. Data only (the bottom of the scheduler package): changing anything here
changes the wire format.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..codecs.envelope import M_CANCEL, M_DEPARTED, M_FREE, M_LOAD, M_RECONCILE, M_RESULTS, M_SUBMIT  # noqa: F401  (re-exported for the scheduler)


@dataclass(slots=True)
class DepRef:
    """Placeholder for the i-th dependency inside a task's arguments on the wire."""

    i: int


DEP_TYPE_NAME = "aionet.sched.Dep"

# A task spec is a list (compact msgpack, no per-field names):
S_TID, S_FN, S_ARGS, S_KWARGS, S_PRIO, S_RES, S_EXE, S_FLAGS, S_TIMEOUT, S_ATTEMPT, S_DEPS, S_CKPT, S_KEY = range(13)
SPEC_LEN = 13
F_PREEMPTIBLE = 1
F_HAS_DEPREFS = 2  # args contain DepRef placeholders (saves walking args of plain tasks)
F_PINNED = 4  # submitted with affinity, or placed by round-robin rotation: never stolen

EXE_AUTO, EXE_THREAD, EXE_PROCESS = 0, 1, 2
EXECUTORS = {None: EXE_AUTO, "auto": EXE_AUTO, "thread": EXE_THREAD, "process": EXE_PROCESS}

# A dependency entry: [i, mode, data]; mode DEP_VALUE: data is the value; DEP_AT: data is
# [holder node, owner's task id], fetched by the executing node from the holder.
DEP_VALUE, DEP_AT = 0, 1

# A result item: [tid, attempt, status, payload, runtime seconds, nbytes]
R_VALUE = 0  # payload = the value
R_HELD = 1  # value stays on the worker (large); payload None, nbytes its size
R_ERROR = 2  # payload = [type, message, traceback]
R_TIMEOUT = 3  # payload = message
R_DEPLOST = 4  # payload = [holder, dep tid]: a dependency could not be fetched
R_CKPT = 5  # payload = checkpoint state (not a completion)
R_MOVED = 6  # payload = thief node name (not a completion): a queued task was stolen
R_REJECT = 7  # payload = reason: this node cannot run the task (place it elsewhere)
R_LOST = 8  # payload = reason: this attempt is not here (answer to M_RECONCILE; the owner retries it)

# Scheduler messages on the node mailbox channel CHANNEL: [kind, sender, ...]
CHANNEL = "aionet.sched"
# message kinds (defined once, in codecs/envelope.py): [M_SUBMIT, owner, [spec, ...]],
# [M_CANCEL, owner, [tid, ...]], [M_FREE, owner, [tid, ...]], [M_RESULTS, worker, [item, ...], load],
# [M_LOAD, worker, load], [M_RECONCILE, owner, [[tid, attempt], ...], ask_back] (after a peer that was
# counted dead is alive again: the worker answers R_LOST for listed attempts it does not have, in its
# result stream so that results sent before the answer arrive before it; ask_back: reconcile the
# other way round too)

SVC_RESOURCES = "aionet.sched.resources"
SVC_FETCH = "aionet.sched.fetch"
SVC_STEAL = "aionet.sched.steal"
