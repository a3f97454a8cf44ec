import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aionet.codecs import handshake
from aionet.errors import DecodeError, HandshakeError, ProtocolError, UnsupportedVersion


def _hello(**kw):
    base = dict(
        version=handshake.PROTOCOL_VERSION,
        name="a",
        node_id="x",
        addresses=["tcp://h:1"],
        features={"compression": ["lz4"]},
        peers={},
    )
    base.update(kw)
    return handshake.Hello(**base)


def test_roundtrip():
    h = _hello()
    assert handshake.parse([h.encode()]) == h


def test_version_mismatch_is_clear():
    with pytest.raises(UnsupportedVersion, match=f"version 99.*speaks {handshake.PROTOCOL_VERSION}"):
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


def test_hello_never_carries_cluster_state():
    """Protocol 2: peers and stream ids travel only after both token proofs (WELCOME/RESUME);
    a HELLO that carries them is refused rather than trusted."""
    for kw in ({"peers": {"b": ["tcp://h:2"]}}, {"link": {"tx": "abcd"}}):
        with pytest.raises(HandshakeError, match="carries a peer table or link info"):
            handshake.parse([_hello(**kw).encode()])


def test_confirm_and_state_roundtrip():
    c = handshake.Confirm(b"m" * 32)
    assert handshake.parse_confirm([c.encode()]) == c
    for kind in (handshake.WELCOME, handshake.RESUME):
        st = handshake.State(kind, {"b": ["tcp://h:2"]}, {"tx": "t", "rx": "", "recv": 0})
        assert handshake.parse_state([st.encode()], kind) == st
    with pytest.raises(HandshakeError, match="expected RESUME"):
        handshake.parse_state([handshake.State(handshake.WELCOME).encode()], handshake.RESUME)


@pytest.mark.parametrize(
    "msg",
    [
        [handshake.WELCOME, {"b": "notalist"}, {}],
        [handshake.WELCOME, {"b": [1]}, {}],
        [handshake.WELCOME, {}, []],
        [handshake.WELCOME, {}],
        [handshake.CONFIRM, b"m", {}],
    ],
)
def test_malformed_state(msg):
    with pytest.raises(ProtocolError):
        if msg[0] == handshake.CONFIRM:
            handshake.parse_confirm([msgpack.packb(msg)])
        else:
            handshake.parse_state([msgpack.packb(msg)], handshake.WELCOME)


@given(st.binary(max_size=256))
def test_state_garbage_never_escapes_as_untyped(data):
    for parse in (handshake.parse_confirm, lambda f: handshake.parse_state(f, handshake.WELCOME)):
        try:
            parse([data])
        except (HandshakeError, DecodeError, UnsupportedVersion):
            pass


def test_busy_reject_asks_to_retry():
    with pytest.raises(handshake.Rejected, match="busy") as ei:
        handshake.parse([handshake.reject("busy", retry=True)])
    assert ei.value.retry
    with pytest.raises(handshake.Rejected) as ei:
        handshake.parse([handshake.reject("bad token")])
    assert not ei.value.retry
