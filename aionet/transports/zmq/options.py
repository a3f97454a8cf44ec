"""Validated ``[transport] zmq = {...}`` options."""

from __future__ import annotations

from typing import Any

from ...config import parse_size
from ...errors import ConfigError
from .curve import CurveKeys

OPTIONS: dict[str, Any] = {
    "hwm": 1000,  # ZMQ_SNDHWM and ZMQ_RCVHWM, in messages
    "sndhwm": None,
    "rcvhwm": None,
    "linger": 1.0,  # seconds zmq keeps flushing a closed connection's queue
    "heartbeat_interval": 1.0,  # seconds; 0 disables ZMTP heartbeats
    "heartbeat_timeout": 5.0,
    "connect_timeout": 5.0,
    "zero_copy_min_bytes": 65536,
    "max_queued_bytes": 64 * 2**20,  # received but not yet taken by recv, per socket
    "max_queued_messages": 65536,
    "drain_batch": 2048,  # messages read per wake-up before yielding to the loop
    "io_threads": 1,
    "max_sockets": 8192,
    # CurveZMQ (see CurveKeys): this node's key pair turns encryption on for every socket
    "curve_public_key_file": None,
    "curve_secret_key_file": None,
    "curve_server_key_file": None,  # public key of the listeners dialed; default: our own
    "curve_allowed_clients": None,  # file(s)/directory of client public keys; default: our own
}


class Options:
    """Validated ``[transport] zmq = {...}`` options."""

    def __init__(self, raw: dict[str, Any]) -> None:
        unknown = sorted(set(raw) - set(OPTIONS))
        if unknown:
            raise ConfigError(f"unknown transport.zmq option(s) {', '.join(unknown)}; valid: {', '.join(OPTIONS)}")
        v = {**OPTIONS, **raw}
        try:
            hwm = int(v["hwm"])
            self.sndhwm = int(v["sndhwm"]) if v["sndhwm"] is not None else hwm
            self.rcvhwm = int(v["rcvhwm"]) if v["rcvhwm"] is not None else hwm
            self.linger_ms = int(float(v["linger"]) * 1000)
            self.hb_ivl_ms = int(float(v["heartbeat_interval"]) * 1000)
            self.hb_timeout_ms = int(float(v["heartbeat_timeout"]) * 1000)
            self.connect_timeout = float(v["connect_timeout"])
            self.zc_min = parse_size(v["zero_copy_min_bytes"])
            self.max_queued_bytes = parse_size(v["max_queued_bytes"])
            self.max_queued_msgs = int(v["max_queued_messages"])
            self.drain_batch = int(v["drain_batch"])
            self.io_threads = int(v["io_threads"])
            self.max_sockets = int(v["max_sockets"])
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"transport.zmq: {exc}") from None
        if min(self.sndhwm, self.rcvhwm) < 0 or self.zc_min < 1 or self.drain_batch < 1:
            raise ConfigError("transport.zmq: hwm must be >= 0, zero_copy_min_bytes and drain_batch >= 1")
        if self.max_queued_bytes <= 0 or self.max_queued_msgs <= 0 or self.io_threads < 1:
            raise ConfigError("transport.zmq: max_queued_*, io_threads must be positive")
        self.curve = CurveKeys.load(v)
