import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aionet.codecs import handshake
from aionet.errors import DecodeError, HandshakeError, ProtocolError, UnsupportedVersion


def _hello(**kw):
    base = dict(version=handshake.PROTOCOL_VERSION, name="a", node_id="x", addresses=["tcp://h:1"],
                features={"compression": ["lz4"]}, peers={"b": ["tcp://h:2"]})
    base.update(kw)
    return handshake.Hello(**base)


def test_roundtrip():
    h = _hello()
    assert handshake.parse([h.encode()]) == h


def test_version_mismatch_is_clear():
    with pytest.raises(UnsupportedVersion, match="version 99.*speaks 1"):
        handshake.parse([_hello(version=99).encode()])


def test_reject_carries_reason():
    with pytest.raises(HandshakeError, match="rejected.*bad token"):
        handshake.parse([handshake.reject("bad token")])


@pytest.mark.parametrize(
    "msg",
    [
        [handshake.HELLO, 1, "", "id", [], {}, {}],
        [handshake.HELLO, 1, "a", "id", [1], {}, {}],
        [handshake.HELLO, 1, "a", "id", [], [], {}],
        [handshake.HELLO, 1, "a", "id", [], {}, {"b": "notalist"}],
        [handshake.HELLO, "1", "a"],
        [7, 1, "a"],
        {"not": "a list"},
    ],
)
def test_malformed(msg):
    with pytest.raises(ProtocolError):
        handshake.parse([msgpack.packb(msg)])


def test_wrong_frame_count():
    with pytest.raises(HandshakeError):
        handshake.parse([])


@given(st.binary(max_size=256))
def test_garbage_never_escapes_as_untyped(data):
    try:
        handshake.parse([data])
    except (HandshakeError, DecodeError, UnsupportedVersion):
        pass
