"""Typed statistics: what every layer reports about itself, as frozen dataclasses.

One method name everywhere: ``stats()`` returns a snapshot of one of these (anyio's
``statistics()`` pattern). Counters stay plain integers on the objects that count them (the hot
paths never build a dataclass); ``stats()`` copies them out when asked. ``as_dict()`` gives the
same snapshot as plain JSON-able data: it is what ``node.info()`` and the ``aionet.info``
service return, and what an exporter walks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_EMPTY: Mapping[str, Any] = {}


class Stats:
    """Base of every statistics snapshot."""

    __slots__ = ()

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as plain dicts, lists and scalars (nested snapshots included)."""
        return _plain(self)


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


# ---------------------------------------------------------------------------- transports, core
@dataclass(frozen=True, slots=True)
class ConnectionStats(Stats):
    """One transport connection. ``queued_*`` are bytes and messages buffered in aionet and the
    transport, not yet written / not yet taken by the reader; ``extra`` holds details only some
    transports have (TLS cipher, ZeroMQ socket type, RDMA credits)."""

    local: str = ""
    remote: str = ""
    outgoing: bool = False
    compress: bool = False
    queued_send_bytes: int = 0
    queued_recv_bytes: int = 0
    queued_recv_messages: int = 0
    read_paused: bool = False
    write_paused: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LinkStats(Stats):
    """A reliable link's sequence state: what is in flight, acknowledged and lost."""

    connected: bool
    dead: str | None
    inflight_bytes: int
    unacked_messages: int
    next_seq: int
    acked: int
    recv_seq: int
    undeliverable: int
    sent_bytes: int = 0  # sequenced payload bytes posted on this link (this link's lifetime)
    recv_bytes: int = 0  # bytes of the sequenced messages received on it
    replayed: int = 0  # messages written again after a reconnect
    acks_sent: int = 0  # standalone ACK frames sent (acks not carried by our own traffic)
    requests_out: int = 0  # our unanswered requests to the peer (within the window it advertises)
    requests_waiting: int = 0  # our requests waiting here for room in that window


@dataclass(frozen=True, slots=True)
class PeerStats(Stats):
    """One peer as this node sees it: state, addresses, queued bytes, its link and connections."""

    state: str
    addresses: tuple[str, ...]
    inflight_bytes: int
    queued_send_bytes: int
    queued_recv_bytes: int
    undeliverable: int
    link: LinkStats | None
    connections: tuple[ConnectionStats, ...]


@dataclass(frozen=True, slots=True)
class RouterStats(Stats):
    """Services, mailboxes (messages and bytes waiting per channel) and requests in progress."""

    services: tuple[str, ...]
    mailboxes: Mapping[str, int]
    mailbox_bytes: Mapping[str, int]
    pending_requests: int
    running_handlers: int


@dataclass(frozen=True, slots=True)
class BusyPollStats(Stats):
    """``node.busy_poll_us``: windows the loop was kept awake after a message, the loop
    iterations spent polling in them, and their total length (``busy_s``, the CPU time polling
    may have cost; the open window not counted yet)."""

    window_us: float
    windows: int
    spins: int
    busy_s: float
    active: bool


# ---------------------------------------------------------------------------- devices
@dataclass(frozen=True, slots=True)
class BufferPoolStats(Stats):
    """The staging buffer pool: loans, reuse and the memory it holds."""

    acquires: int
    allocations: int
    reuses: int
    evictions: int
    waits: int
    allocated_bytes: int
    max_bytes: int
    in_use: int
    idle: int
    waiters: int
    pinned: bool
    registered_with: int


@dataclass(frozen=True, slots=True)
class DeviceTransferStats(Stats):
    """Device arrays sent and received per path; ``pool`` once staging was first used."""

    sent_inline: int = 0
    sent_staged: int = 0
    sent_device_frames: int = 0
    chunks_sent: int = 0
    received_inline: int = 0
    received_staged: int = 0
    undeliverable: int = 0
    dropped_transfers: int = 0
    incomplete_transfers: int = 0
    incomplete_bytes: int = 0
    backend: str | None = None
    pool: BufferPoolStats | None = None


# ---------------------------------------------------------------------------- services
@dataclass(frozen=True, slots=True)
class MembershipStats(Stats):
    """Gossip traffic, failure-detector verdicts and the event loop's health."""

    sent_msgs: int
    sent_bytes: int  # counted only when Membership.count_bytes is set (costs a serialization)
    recv_msgs: int
    suspicions: int
    refutations: int
    deaths_declared: int
    probes_sent: int
    max_phi: float
    targets: tuple[str, ...]
    loop_lag_ms: float
    stalled_s: float
    phi: Mapping[str, float] = field(default_factory=dict)  # watched member -> phi now
    rtt_s: Mapping[str, float] = field(default_factory=dict)  # watched member -> smoothed heartbeat RTT


@dataclass(frozen=True, slots=True)
class NodeViewStats(Stats):
    """The owner's view of one executing node: tasks in flight, its window and backlog."""

    inflight: int
    window: int
    other: int
    backlog_s: float


@dataclass(frozen=True, slots=True)
class OwnerStats(Stats):
    """Tasks submitted from this node and what became of them."""

    submitted: int
    completed: int
    failed: int
    cancelled: int
    resubmitted: int
    duplicates_dropped: int
    moved: int
    rejected: int
    reconciled_lost: int
    owned: int
    ready: int
    nodes: Mapping[str, NodeViewStats]


@dataclass(frozen=True, slots=True)
class WorkerStats(Stats):
    """Task attempts run on this node, its queue and its free resources."""

    accepted: int
    ran: int
    errors: int
    rejected: int
    refused: int
    stolen_in: int
    stolen_out: int
    preempted: int
    cancelled: int
    results_held: int
    queued: int
    running: int
    held_results: int
    total: Mapping[str, float]
    free: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class SchedulerStats(Stats):
    owner: OwnerStats
    worker: WorkerStats
    alive: tuple[str, ...]
    down: tuple[str, ...]


# ---------------------------------------------------------------------------- the node
@dataclass(frozen=True, slots=True)
class NodeStats(Stats):
    """Everything one node reports: identity, peers, router, device transfers, membership and
    scheduler. ``devices`` is the CPU/memory/GPU inventory as of the last load report."""

    name: str
    node_id: str
    pid: int
    version: str
    protocol: int
    listen: tuple[str, ...]
    advertise: str | None
    transports: tuple[str, ...]
    uptime: float
    peers: Mapping[str, PeerStats]
    router: RouterStats
    device: DeviceTransferStats
    membership: MembershipStats
    scheduler: SchedulerStats
    devices: Mapping[str, Any] = field(default_factory=dict)
    busy_poll: BusyPollStats | None = None  # None: node.busy_poll_us is 0 (off)


__all__ = [
    "BufferPoolStats",
    "BusyPollStats",
    "ConnectionStats",
    "DeviceTransferStats",
    "LinkStats",
    "MembershipStats",
    "NodeStats",
    "NodeViewStats",
    "OwnerStats",
    "PeerStats",
    "RouterStats",
    "SchedulerStats",
    "Stats",
    "WorkerStats",
]
