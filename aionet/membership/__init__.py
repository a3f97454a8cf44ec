"""Membership: who is in the cluster, how loaded each node is, and who has died.

Design (SWIM with phi-accrual heartbeats, Lifeguard-style caution):

* **Ring heartbeats, O(1) per node.** Members are ordered by name on a ring; every node sends a
  heartbeat (HB) each ``heartbeat.interval`` to its ``fanout`` ring successors and answers the
  HBs it gets with an ACK. A node therefore sends and receives about ``2 * fanout`` small
  messages per interval whatever the cluster size, and each node is watched by ``fanout``
  others. Each watcher runs a :class:`~.detector.PhiAccrualDetector` over the ACK arrivals.
* **Gossip piggybacked on heartbeats.** Membership updates (``[name, node_id, incarnation,
  state, addresses]``) ride on HB/ACK messages, each retransmitted ``3 * log2(n)`` times, and
  are also pushed once, immediately, to the ring neighbours of every node that learns something
  new (so a death reaches everyone in milliseconds, not intervals). Load reports ride along
  the same way: a node's own report on every HB/ACK it sends (when it changed) and a couple of
  other members' reports relayed per message, round-robin.
* **Suspicion is verified before anyone is declared dead.** A watcher suspects a peer when phi
  crosses ``phi_threshold`` or, on the fast path, when the connection to it drops without a
  goodbye (a killed process). Verification runs a direct probe (a fresh connection and a
  HELLO exchange: it proves the peer's event loop runs even when the data connection is
  back-pressured) and asks ``indirect_probes`` other members to probe too, so one bad link
  cannot kill a healthy node. A refused connection (nothing listens: the process is gone)
  or no proof of life with at least one other member confirming within ``probe_timeout`` is
  death. When nobody can confirm either way we may be the one cut off, so the suspicion is
  gossiped instead, the peer may refute it, and death waits for ``suspect_timeout``.
* **Incarnations.** A node's incarnation starts at its start time in milliseconds (a restarted
  process outranks its old self) and is bumped to refute a suspicion or a death it hears
  about itself (a node that was only frozen rejoins this way after SIGCONT). For one process,
  higher incarnation wins, and at equal incarnation left > dead > suspect > alive.
* **Local stalls are not peers' failures.** Detection runs on a :class:`~.detector.LagClock`
  fed by a tiny task that measures how late it wakes: time this node's loop could not run does
  not count as peers' silence.

Layout, one file per concern (the memberlist style): :mod:`.table` holds the member records
and the pure merge rules (updates in, effects out; member states as an enum with a transition
table), :mod:`.gossip` the dissemination queue and load relays, :mod:`.detector` phi-accrual
and the lag-aware clock, :mod:`.awareness` local health, :mod:`.wire` the message layouts,
:mod:`.load` load reports, :mod:`.probe` the probe client, :mod:`.events` what users see, and
:mod:`.service` the one driver that performs the effects (tasks, timers, sockets): its
heartbeats, gossip and member table there, its suspicions, probe rounds and verdicts in
:mod:`.verification` (a mixin the driver inherits).
"""

from .awareness import recurring_stall, verify_timeout
from .detector import LagClock, PhiAccrualDetector, phi_of
from .events import MemberEvent, MemberEventStream, MembershipCounters
from .gossip import GossipQueue, gossip_budget
from .load import GpuLoad, LoadReport, LoadSampler
from .probe import MAX_PROBE_CONNECTIONS, MAX_SERVED_PROBES, PROBE_REUSE
from .service import Membership
from .table import (
    ALIVE,
    DEAD,
    LEFT,
    MAX_MEMBERS,
    STATES,
    SUSPECT,
    InvalidTransition,
    Member,
    MemberState,
    Update,
    ring_predecessors,
    ring_successors,
    supersedes,
)
from .wire import GOSSIP, HB, HB_ACK, MEMBERS_SERVICE, PROBE_REQ, PROBE_RSP, SYNC_SERVICE

__all__ = [
    "ALIVE",
    "DEAD",
    "GOSSIP",
    "HB",
    "HB_ACK",
    "LEFT",
    "MAX_MEMBERS",
    "MAX_PROBE_CONNECTIONS",
    "MAX_SERVED_PROBES",
    "MEMBERS_SERVICE",
    "PROBE_REQ",
    "PROBE_REUSE",
    "PROBE_RSP",
    "STATES",
    "SUSPECT",
    "SYNC_SERVICE",
    "GossipQueue",
    "GpuLoad",
    "InvalidTransition",
    "LagClock",
    "LoadReport",
    "LoadSampler",
    "Member",
    "MemberEvent",
    "MemberEventStream",
    "MemberState",
    "Membership",
    "MembershipCounters",
    "PhiAccrualDetector",
    "Update",
    "gossip_budget",
    "phi_of",
    "recurring_stall",
    "ring_predecessors",
    "ring_successors",
    "supersedes",
    "verify_timeout",
]
