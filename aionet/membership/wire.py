"""Membership message layouts: control envelope kinds and their validation (pure).

Heartbeats, acks, probe requests/responses and gossip travel as unsequenced, best-effort
control envelopes (see ``Node.add_control_handler``); each is a msgpack list whose first
element is its kind. Everything a peer sends is checked here, and a malformed message raises
:class:`~aionet.errors.ProtocolError` (the node logs it and closes that connection).
"""

from __future__ import annotations

from typing import Any

# control envelope kinds (unsequenced, best effort; see Node.add_control_handler)
# kinds (defined once, in codecs/envelope.py):
#   [HB, seq, incarnation, load|None, updates, loads]; [HB_ACK, ...same]
#   [PROBE_REQ, probe_id, target, target_node_id, timeout_s]
#   [PROBE_RSP, probe_id, result]  1 alive, 0 no proof of life, -1 could not try
#   [GOSSIP, updates, loads]
from ..codecs.envelope import GOSSIP, HB, HB_ACK, PROBE_REQ, PROBE_RSP
from ..errors import ProtocolError
from .load import LoadReport

# updates: [Update.to_wire(), ...]; loads: [[name, node_id, age_ms, LoadReport.to_wire()], ...]

SYNC_SERVICE = "aionet.membership.sync"  # joiner -> seed: my record; reply: the member table
MEMBERS_SERVICE = "aionet.members"  # the members() view, for `aionet status`


def parse_beat(env: list[Any]) -> tuple[int, int, LoadReport | None, list[Any], list[Any]]:
    """HB or HB_ACK -> (seq, incarnation, load report or None, updates, loads)."""
    if len(env) != 6:
        raise ProtocolError("malformed heartbeat")
    _, seq, inc, load, updates, loads = env
    if type(seq) is not int or type(inc) is not int or not isinstance(updates, list) or not isinstance(loads, list):
        raise ProtocolError("malformed heartbeat")
    return seq, inc, parse_load(load) if load is not None else None, updates, loads


def parse_load(w: Any) -> LoadReport:
    try:
        return LoadReport.from_wire(w)
    except (TypeError, ValueError, KeyError) as exc:
        raise ProtocolError(f"malformed load report: {exc}") from None


def parse_gossip(env: list[Any]) -> tuple[list[Any], list[Any]]:
    """GOSSIP -> (updates, loads)."""
    if len(env) != 3 or not isinstance(env[1], list) or not isinstance(env[2], list):
        raise ProtocolError("malformed GOSSIP")
    return env[1], env[2]


def parse_load_entry(w: Any) -> tuple[str, Any, int, Any]:
    """One relayed load report -> (name, node_id, age_ms, report in wire form)."""
    if type(w) is not list or len(w) != 4 or not isinstance(w[0], str) or type(w[2]) is not int:
        raise ProtocolError("malformed load gossip")
    return w[0], w[1], w[2], w[3]


def parse_probe_req(env: list[Any]) -> tuple[int, str, str, float | None]:
    """PROBE_REQ -> (probe id, target, target node id, timeout or None). The timeout is
    optional on the wire (older peers sent four elements)."""
    if (
        len(env) not in (4, 5)
        or type(env[1]) is not int
        or not isinstance(env[2], str)
        or not isinstance(env[3], str)
        or (len(env) == 5 and type(env[4]) not in (int, float))
    ):
        raise ProtocolError("malformed probe request")
    return env[1], env[2], env[3], float(env[4]) if len(env) == 5 else None


def parse_probe_rsp(env: list[Any]) -> tuple[int, int]:
    """PROBE_RSP -> (probe id, result)."""
    if len(env) != 3 or type(env[1]) is not int or type(env[2]) is not int:
        raise ProtocolError("malformed probe response")
    return env[1], env[2]


__all__ = [
    "GOSSIP",
    "HB",
    "HB_ACK",
    "MEMBERS_SERVICE",
    "PROBE_REQ",
    "PROBE_RSP",
    "SYNC_SERVICE",
    "parse_beat",
    "parse_gossip",
    "parse_load",
    "parse_load_entry",
    "parse_probe_req",
    "parse_probe_rsp",
]
