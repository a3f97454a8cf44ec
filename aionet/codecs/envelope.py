"""Every envelope kind, defined once (sans-I/O: no asyncio, no sockets).

Element 0 of every message aionet sends is a small int naming its kind. Three namespaces
exist, each an :class:`~enum.IntEnum` with unique values:

- :class:`Kind`: envelopes on an established link (one connection's traffic after its
  handshake). Sequenced kinds carry ``[kind, seq, ack, *fields]`` and are replayed after a
  reconnect; the others are unsequenced and best effort. Kinds ``>= CONTROL_MIN`` are control
  envelopes that services register with ``Node.add_control_handler`` (membership's).
- :class:`HandshakeKind`: the first messages of a connection, before any link exists
  (``codecs/handshake.py``). HELLO, REJECT and CONFIRM avoid the link's values; WELCOME and
  RESUME reuse 11 and 12 (HB, HB_ACK), which is safe because each side reads them only before
  its link attaches: a peer sends control envelopes only after its own handshake completed.
- :class:`SchedKind`: scheduler messages, the payload ``[kind, sender, ...]`` of a SEND on the
  mailbox channel ``aionet.sched`` (``scheduler/tasks.py``).

The values are the wire format: never renumber one. The hot path (``Node``'s reader, the
router, the link) compares plain ints, so the module-level constants below are ``int`` copies
of the members (module globals are faster to read than enum attributes, and msgpack packs
them without a subclass check); ``tests/unit/codecs/test_envelope.py`` keeps them in step.
"""

from __future__ import annotations

from enum import IntEnum, unique
from typing import Final


@unique
class Kind(IntEnum):
    """Envelopes on an established link."""

    SEND = 1  # [SEND, seq, ack, channel, payload]
    REQ = 2  # [REQ, seq, ack, req_id, service, payload, *more triples to an rpc_batch peer] (codecs/batch.py)
    REP = 3  # [REP, seq, ack, req_id, payload, *more pairs to an rpc_batch peer]
    ERR = 4  # [ERR, seq, ack, req_id, remote_type, message, traceback]
    PEERS = 5  # [PEERS, seq, ack, {name: [addresses]}]
    BYE = 6  # [BYE, seq, ack]  graceful leave
    ACK = 7  # [ACK, recv_seq]  unsequenced: the link's cumulative ack (link.py)
    # one chunk of a staged device array, sent ahead of the message that refers to it
    # (device_transfer.py): [XFER, seq, ack, transfer_id, chunk index (-1 = abort),
    # staging header (chunk 0) | None, chunk bytes]. Sequenced although it is > ACK.
    XFER = 8
    # the caller gave up on request req_id (its task was cancelled, or its timeout passed):
    # the peer cancels the handler if it still runs (router.py). Sequenced, so it comes after
    # its REQ, once, and is replayed after a cut; sent only to a peer whose HELLO announced
    # the "cancel" feature. 9 is the handshake's REJECT, which a link never reads (a link
    # message always follows the handshake's last one on the connection, as for 11 and 12).
    CANCEL = 9  # [CANCEL, seq, ack, req_id]
    # 10 is unused on a link (the handshake's CONFIRM)
    # control envelopes (unsequenced, best effort, not replayed): membership.py
    HB = 11  # [HB, seq, incarnation, load|None, updates, loads]
    HB_ACK = 12  # [HB_ACK, seq, incarnation, load|None, updates, loads]
    PROBE_REQ = 13  # [PROBE_REQ, probe_id, target, target_node_id, timeout_s]
    PROBE_RSP = 14  # [PROBE_RSP, probe_id, result]  1 alive, 0 no proof of life, -1 could not try
    GOSSIP = 15  # [GOSSIP, updates, loads]
    # the def services this node answers inline, when they changed after its HELLO listed them
    # (feature "rpc_inline", codecs/batch.py); only to a peer whose HELLO had that feature
    INLINE_SERVICES = 16  # [INLINE_SERVICES, [service names]]


@unique
class HandshakeKind(IntEnum):
    """The handshake's messages (codecs/handshake.py), before a link exists."""

    HELLO = 0  # version, name, node id, addresses, features, peers (reserved), nonce, mac, link (reserved)
    REJECT = 9  # reason[, retry]
    CONFIRM = 10  # mac
    WELCOME = 11  # peer table, link resume info
    RESUME = 12  # peer table, link resume info


@unique
class SchedKind(IntEnum):
    """Scheduler messages: the payload of a SEND on channel ``aionet.sched``."""

    SUBMIT = 1  # [SUBMIT, owner, [spec, ...]]
    CANCEL = 2  # [CANCEL, owner, [tid, ...]]
    FREE = 3  # [FREE, owner, [tid, ...]]
    RESULTS = 4  # [RESULTS, worker, [item, ...], load]
    LOAD = 5  # [LOAD, worker, load]
    RECONCILE = 6  # [RECONCILE, owner, [[tid, attempt], ...], ask_back]: after a refuted or rejoined death
    # local only, in a node's own mailbox: [DEPARTED, self, peer, nonce] queues a peer's graceful
    # leave behind the messages it sent before leaving (its last results), so none is re-run
    DEPARTED = 7


# plain-int copies for the hot path (see the module docstring)
SEND: Final[int] = Kind.SEND.value
REQ: Final[int] = Kind.REQ.value
REP: Final[int] = Kind.REP.value
ERR: Final[int] = Kind.ERR.value
PEERS: Final[int] = Kind.PEERS.value
BYE: Final[int] = Kind.BYE.value
ACK: Final[int] = Kind.ACK.value
XFER: Final[int] = Kind.XFER.value
CANCEL: Final[int] = Kind.CANCEL.value
HB: Final[int] = Kind.HB.value
HB_ACK: Final[int] = Kind.HB_ACK.value
PROBE_REQ: Final[int] = Kind.PROBE_REQ.value
PROBE_RSP: Final[int] = Kind.PROBE_RSP.value
GOSSIP: Final[int] = Kind.GOSSIP.value
INLINE_SERVICES: Final[int] = Kind.INLINE_SERVICES.value

HELLO: Final[int] = HandshakeKind.HELLO.value
REJECT: Final[int] = HandshakeKind.REJECT.value
CONFIRM: Final[int] = HandshakeKind.CONFIRM.value
WELCOME: Final[int] = HandshakeKind.WELCOME.value
RESUME: Final[int] = HandshakeKind.RESUME.value

M_SUBMIT: Final[int] = SchedKind.SUBMIT.value
M_CANCEL: Final[int] = SchedKind.CANCEL.value
M_FREE: Final[int] = SchedKind.FREE.value
M_RESULTS: Final[int] = SchedKind.RESULTS.value
M_LOAD: Final[int] = SchedKind.LOAD.value
M_RECONCILE: Final[int] = SchedKind.RECONCILE.value
M_DEPARTED: Final[int] = SchedKind.DEPARTED.value

SEQUENCED: Final[frozenset[int]] = frozenset({SEND, REQ, REP, ERR, PEERS, BYE, XFER, CANCEL})
CONTROL_MIN: Final[int] = HB  # kinds from here on are control kinds (Node.add_control_handler)


def is_sequenced(kind: int) -> bool:
    """Whether the link numbers, acknowledges and replays envelopes of this kind."""
    return kind in SEQUENCED


__all__ = [
    "ACK",
    "BYE",
    "CANCEL",
    "CONFIRM",
    "CONTROL_MIN",
    "ERR",
    "GOSSIP",
    "HB",
    "HB_ACK",
    "HELLO",
    "INLINE_SERVICES",
    "M_CANCEL",
    "M_DEPARTED",
    "M_FREE",
    "M_LOAD",
    "M_RECONCILE",
    "M_RESULTS",
    "M_SUBMIT",
    "PEERS",
    "PROBE_REQ",
    "PROBE_RSP",
    "REJECT",
    "REP",
    "REQ",
    "RESUME",
    "SEND",
    "SEQUENCED",
    "WELCOME",
    "XFER",
    "HandshakeKind",
    "Kind",
    "SchedKind",
    "is_sequenced",
]
