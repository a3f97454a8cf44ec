"""Validated ``[transport] zmq = {...}`` options."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from ..options import Option, anything, integer, non_negative, number, optional, parse_options, positive, size
from .curve import CurveKeys

_POSITIVE = "must be positive"

SCHEMA: MappingProxyType[str, Option] = MappingProxyType(
    {
        "hwm": Option(1000, integer, non_negative, "must be >= 0"),  # ZMQ_SNDHWM and ZMQ_RCVHWM, in messages
        "sndhwm": Option(None, optional(integer), lambda v: v is None or v >= 0, "must be >= 0"),
        "rcvhwm": Option(None, optional(integer), lambda v: v is None or v >= 0, "must be >= 0"),
        "linger": Option(1.0, number),  # seconds zmq keeps flushing a closed connection's queue
        "heartbeat_interval": Option(1.0, number),  # seconds; 0 disables ZMTP heartbeats
        "heartbeat_timeout": Option(5.0, number),
        "connect_timeout": Option(5.0, number),
        "zero_copy_min_bytes": Option(65536, size, positive, "must be >= 1"),
        # received but not yet taken by recv, per socket
        "max_queued_bytes": Option(64 * 2**20, size, positive, _POSITIVE),
        "max_queued_messages": Option(65536, integer, positive, _POSITIVE),
        # messages read per wake-up before yielding to the loop
        "drain_batch": Option(2048, integer, positive, "must be >= 1"),
        "io_threads": Option(1, integer, positive, _POSITIVE),
        "max_sockets": Option(8192, integer),
        # CurveZMQ (see CurveKeys): this node's key pair turns encryption on for every socket;
        # the values are checked by CurveKeys.load
        "curve_public_key_file": Option(None, anything),
        "curve_secret_key_file": Option(None, anything),
        "curve_server_key_file": Option(None, anything),  # public key of the listeners dialed; default: our own
        "curve_allowed_clients": Option(None, anything),  # file(s)/directory of client public keys; default: our own
    }
)


class Options:
    """Validated ``[transport] zmq = {...}`` options."""

    def __init__(self, raw: dict[str, Any]) -> None:
        v = parse_options("zmq", SCHEMA, raw)
        hwm = v["hwm"]
        self.sndhwm: int = v["sndhwm"] if v["sndhwm"] is not None else hwm
        self.rcvhwm: int = v["rcvhwm"] if v["rcvhwm"] is not None else hwm
        self.linger_ms = int(v["linger"] * 1000)
        self.hb_ivl_ms = int(v["heartbeat_interval"] * 1000)
        self.hb_timeout_ms = int(v["heartbeat_timeout"] * 1000)
        self.connect_timeout: float = v["connect_timeout"]
        self.zc_min: int = v["zero_copy_min_bytes"]
        self.max_queued_bytes: int = v["max_queued_bytes"]
        self.max_queued_msgs: int = v["max_queued_messages"]
        self.drain_batch: int = v["drain_batch"]
        self.io_threads: int = v["io_threads"]
        self.max_sockets: int = v["max_sockets"]
        self.curve = CurveKeys.load(v)
