"""The handshake state machine as a pair (h11's ConnectionPair style): two machines feed each
other's frames; no sockets, no sleeps, time is fed."""

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.codecs import handshake as hs
from aionet.codecs.handshake import (
    DialedSelf,
    Handshake,
    HandshakeTimeout,
    IllegalTransition,
    LocalHandshakeError,
    Me,
    PeerHello,
    Phase,
    Probed,
    Proven,
    Resumed,
    Role,
    Welcomed,
)
from aionet.errors import DecodeError, HandshakeError, ProtocolError, UnsupportedVersion

A = Me("a", "id-a", ["tcp://127.0.0.1:1"], {"auth": True})
B = Me("b", "id-b", ["tcp://127.0.0.1:2"], {"auth": True})


def pair(token_d=b"t", token_a=b"t", role=Role.DIALER, **kw):
    d = Handshake(
        role, A if token_d else Me(**{**A.__dict__, "features": {"auth": False}}), token_d, now=0, timeout=5, **kw
    )
    a = Handshake(
        Role.ACCEPTOR, B if token_a else Me(**{**B.__dict__, "features": {"auth": False}}), token_a, now=0, timeout=5
    )
    return d, a


def deliver(src: Handshake, dst: Handshake):
    (frame,) = src.data_to_send()
    return dst.receive([frame])


def test_dial_and_accept_complete_with_the_link_views_exchanged():
    d, a = pair()
    assert isinstance(deliver(d, a), PeerHello)  # dialer's HELLO
    ev = deliver(a, d)  # acceptor's HELLO, MAC checked
    assert isinstance(ev, PeerHello) and ev.hello.name == "b"
    assert isinstance(deliver(d, a), Proven)  # dialer's CONFIRM checked
    a.welcome({"c": ["tcp://h:3"]}, {"tx": "ta", "rx": "", "recv": 0})
    ev = deliver(a, d)
    assert isinstance(ev, Welcomed) and ev.state.peers == {"c": ["tcp://h:3"]} and ev.state.link["tx"] == "ta"
    d.resume({}, {"tx": "td", "rx": "ta", "recv": 0})
    ev = deliver(d, a)
    assert isinstance(ev, Resumed) and ev.state.link == {"tx": "td", "rx": "ta", "recv": 0}
    assert d.done and a.done and d.data_to_send() == [] and a.data_to_send() == []


def test_without_a_token_the_macs_are_empty_and_local_peers_are_accepted():
    d, a = pair(None, None)
    deliver(d, a)
    assert deliver(a, d).hello.mac == b""
    assert isinstance(deliver(d, a), Proven)


def test_a_remote_dialer_without_token_is_refused():
    d = Handshake(Role.DIALER, A, None, now=0, timeout=5)
    a = Handshake(Role.ACCEPTOR, B, None, now=0, timeout=5, local_peer=False)
    with pytest.raises(HandshakeError, match="accepts local peers only"):
        deliver(d, a)
    assert a.phase is Phase.FAILED


def test_probe_ends_after_the_acceptors_hello():
    d, a = pair(role=Role.PROBE)
    assert isinstance(deliver(d, a), Probed) and a.done  # answered; no link
    assert isinstance(deliver(a, d), Probed) and d.done
    assert d.data_to_send() == []


@pytest.mark.parametrize("wrong_side", ["dialer", "acceptor"])
def test_a_wrong_token_fails_on_the_side_that_checks_it(wrong_side):
    d, a = pair(b"wrong" if wrong_side == "dialer" else b"t", b"wrong" if wrong_side == "acceptor" else b"t")
    deliver(d, a)
    if wrong_side == "acceptor":  # the acceptor's MAC does not verify with the dialer's token
        with pytest.raises(HandshakeError, match="failed to prove the cluster token"):
            deliver(a, d)
        (rej,) = d.data_to_send()
        assert msgpack.unpackb(rej)[1] == "authentication failed"
    else:  # the dialer verified nothing wrong (its token is the odd one), the acceptor sees the CONFIRM fail
        with pytest.raises(HandshakeError, match="failed to prove the cluster token"):
            deliver(a, d)
        assert d.phase is Phase.FAILED


def test_the_dialers_confirm_must_prove_the_token():
    d, a = pair()
    deliver(d, a)
    deliver(a, d)
    d.data_to_send()  # drop the real CONFIRM
    with pytest.raises(HandshakeError, match="wrong token"):
        a.receive([hs.Confirm(b"\0" * 32).encode()])
    assert a.phase is Phase.FAILED


def test_a_token_required_by_the_peer_but_missing_here_is_our_fault():
    d, a = pair(None, b"t")
    deliver(d, a)  # the acceptor has a token, the dialer none: the acceptor's HELLO says auth
    with pytest.raises(LocalHandshakeError, match="set security.token"):
        deliver(a, d)


def test_crossing_dials_are_two_independent_handshakes():
    """Both nodes dial each other at once: two pairs, each completes; which connection the
    link keeps is decided above the machine (connect.py keeps both, sends on one)."""
    d1, a1 = pair()
    d2 = Handshake(Role.DIALER, B, b"t", now=0, timeout=5)
    a2 = Handshake(Role.ACCEPTOR, A, b"t", now=0, timeout=5)
    for d, a in ((d1, a1), (d2, a2)):
        deliver(d, a)
    for d, a in ((d1, a1), (d2, a2)):
        deliver(a, d)
        deliver(d, a)
        a.welcome({}, {})
        deliver(a, d)
        d.resume({}, {})
        deliver(d, a)
    assert all(m.done for m in (d1, a1, d2, a2))
    assert d1.nonce != d2.nonce and a1.nonce != a2.nonce  # no replay across the two


def test_dialing_ourselves_is_recognised_on_both_sides():
    d = Handshake(Role.DIALER, A, b"t", now=0, timeout=5)
    a = Handshake(Role.ACCEPTOR, A, b"t", now=0, timeout=5)
    assert isinstance(deliver(d, a), DialedSelf) and a.done
    assert isinstance(deliver(a, d), DialedSelf) and d.done


def test_names_and_expectations_are_checked():
    d = Handshake(Role.DIALER, A, b"t", now=0, timeout=5, expect="zz")
    a = Handshake(Role.ACCEPTOR, B, b"t", now=0, timeout=5)
    deliver(d, a)
    with pytest.raises(HandshakeError, match="expected 'zz'"):
        deliver(a, d)
    twin = Handshake(Role.DIALER, Me("b", "id-other", [], {}), None, now=0, timeout=5)
    a = Handshake(Role.ACCEPTOR, B, None, now=0, timeout=5)
    with pytest.raises(HandshakeError, match="own name"):
        deliver(twin, a)


BAD = {
    "truncated": lambda f: [f[: len(f) // 2]],
    "missing": lambda f: [],
    "two frames": lambda f: [f, f],
    "not msgpack": lambda f: [b"\xc1"],
    "wrong kind": lambda f: [msgpack.packb([99, 1])],
}


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("step", [0, 1, 2, 3, 4])
def test_truncated_or_missing_messages_are_typed_errors_at_every_step(step, bad):
    d, a = pair()
    for i, (src, dst) in enumerate([(d, a), (a, d), (d, a), (a, d), (d, a)]):
        if i == 3:
            a.welcome({}, {})
        if i == 4:
            d.resume({}, {})
        (frame,) = src.data_to_send()
        if i == step:
            with pytest.raises(ProtocolError):
                dst.receive(BAD[bad](frame))
            assert dst.phase is Phase.FAILED
            return
        dst.receive([frame])


def test_a_peer_speaking_another_version_is_refused():
    d, a = pair()
    (frame,) = d.data_to_send()
    msg = msgpack.unpackb(frame)
    msg[1] = 1
    with pytest.raises(UnsupportedVersion):
        a.receive([msgpack.packb(msg)])


def test_a_reject_ends_the_handshake_with_its_reason():
    d, _a = pair()
    d.data_to_send()
    with pytest.raises(hs.Rejected, match="busy") as info:
        d.receive([hs.reject("busy", retry=True)])
    assert info.value.retry and d.phase is Phase.FAILED


def test_timeout_on_fed_time():
    d, _a = pair()
    d.check_timeout(4.99)  # still within the deadline
    assert d.remaining(3.0) == 2.0
    with pytest.raises(HandshakeTimeout):
        d.check_timeout(5.0)
    assert d.phase is Phase.FAILED
    done_d, done_a = pair(role=Role.PROBE)
    deliver(done_d, done_a)
    deliver(done_a, done_d)
    done_d.check_timeout(100.0)  # a finished handshake never times out


def test_out_of_order_driving_is_an_illegal_transition():
    d, a = pair()
    with pytest.raises(IllegalTransition):
        d.resume({}, {})  # before WELCOME
    with pytest.raises(IllegalTransition):
        a.welcome({}, {})  # before the dialer proved the token
    with pytest.raises(IllegalTransition):
        d.welcome({}, {})  # a dialer never sends WELCOME
    done_d, done_a = pair(role=Role.PROBE)
    deliver(done_d, done_a)
    with pytest.raises(IllegalTransition):
        done_a.receive([b"x"])  # nothing is expected after a probe was answered


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["acceptor", "dialer", "confirm", "welcome", "resume"]))
def test_garbage_at_any_step_is_a_typed_error_never_a_crash(data, where):
    d, a = pair()
    target = a
    if where != "acceptor":
        deliver(d, a)
        target = d
    if where in ("confirm", "resume"):
        deliver(a, d)
        target = a
    if where == "welcome":
        deliver(a, d)
        deliver(d, a)
        target = d
    if where == "resume":
        deliver(d, a)
        a.welcome({}, {})
        deliver(a, d)
        d.data_to_send()
        target = a
    try:
        target.receive([data])
    except (ProtocolError, DecodeError):
        assert target.phase is Phase.FAILED
