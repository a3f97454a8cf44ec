"""Every transport validates its options in one place: unknown keys and bad values are
ConfigErrors naming the key (with a "did you mean" hint) before any socket exists."""

from __future__ import annotations

from typing import Any

import pytest

from aionet.errors import ConfigError
from aionet.transports.options import Option, integer, parse_options, positive, size
from aionet.transports.registry import TransportRegistry

# scheme -> a valid option and a typo of it
TYPOS = {
    "tcp": "nodelayy",
    "tls": "handshake_timout",
    "inproc": "max_queud_bytes",
    "zmq+tcp": "hmw",
    "ucx": "max_queued_byts",
    "rdma": "segment_byts",
}
SUGGESTED = {
    "tcp": "nodelay",
    "tls": "handshake_timeout",
    "inproc": "max_queued_bytes",
    "zmq+tcp": "hwm",
    "ucx": "max_queued_bytes",
    "rdma": "segment_bytes",
}


def make(scheme: str, options: dict[str, Any]) -> Any:
    try:
        cls = TransportRegistry(use_entry_points=False).transport_class(scheme)
    except Exception as exc:  # the module itself cannot be imported here (missing package)
        pytest.skip(f"{scheme}: {exc}")
    return cls(options)


@pytest.mark.parametrize("scheme", sorted(TYPOS))
def test_each_transport_rejects_an_unknown_key(scheme: str) -> None:
    with pytest.raises(ConfigError) as err:
        make(scheme, {TYPOS[scheme]: 1})
    msg = str(err.value)
    family = scheme.split("+")[0]
    assert f"unknown transport.{family} option {TYPOS[scheme]!r}" in msg
    assert f"did you mean {SUGGESTED[scheme]!r}" in msg
    assert "valid: " in msg and SUGGESTED[scheme] in msg.split("valid: ", 1)[1]


@pytest.mark.parametrize(
    ("scheme", "options", "words"),
    [
        ("tcp", {"backlog": "many"}, "transport.tcp.backlog must be an integer"),
        ("tcp", {"close_timeout": -1}, "transport.tcp.close_timeout must not be negative"),
        ("tls", {"check_hostname": "perhaps"}, "transport.tls.check_hostname must be a boolean"),
        ("inproc", {"max_queued_bytes": 0}, "transport.inproc.max_queued_bytes must be positive"),
        ("zmq+tcp", {"drain_batch": 0}, "transport.zmq.drain_batch must be >= 1"),
        ("zmq+tcp", {"max_queued_bytes": "lots"}, "transport.zmq.max_queued_bytes must be a size"),
        ("ucx", {"probe": "sometimes"}, "transport.ucx.probe must be a boolean"),
        ("ucx", {"ucx_options": "TLS=tcp"}, "transport.ucx.ucx_options must be a table"),
        ("rdma", {"segment_bytes": 0}, "transport.rdma.segment_bytes must be positive"),
        ("rdma", {"recv_buffers": "x"}, "transport.rdma.recv_buffers must be an integer"),
    ],
)
def test_bad_values_name_the_key(scheme: str, options: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        make(scheme, options)


def test_valid_options_are_converted_and_defaults_filled() -> None:
    schema = {"a": Option(1, integer, positive, "must be positive"), "b": Option(2 << 20, size)}
    assert parse_options("x", schema, {"a": "3", "b": "1KiB"}) == {"a": 3, "b": 1024}
    assert parse_options("x", schema, None) == {"a": 1, "b": 2 << 20}


def test_several_unknown_keys_are_all_named() -> None:
    with pytest.raises(ConfigError, match=r"options 'x', 'y'; valid: a$"):
        parse_options("t", {"a": Option(1, integer)}, {"x": 1, "y": 2})


def test_rdma_and_ucx_keep_valid_options() -> None:
    rdma = make("rdma", {"segment_bytes": "4KiB", "device": "mlx5_0"})
    assert rdma._segment == 4096 and rdma._device_name == "mlx5_0"
    ucx = make("ucx", {"tls": "tcp", "probe": "off"})
    assert ucx._probe is False and ucx.options["tls"] == "tcp"
