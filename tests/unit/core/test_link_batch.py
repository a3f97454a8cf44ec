"""Batched SENDs in the link (issue 18), fed directly: no sockets. The open batch takes its
place in the stream before any other envelope, is kept across a death verdict like any
unacknowledged message, and never carries more payloads than the peer advertised."""

import logging
from types import SimpleNamespace

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.codecs.envelope import ERR, REP, REQ, SEND
from aionet.core.link import RPC_PIPELINE, Link
from aionet.errors import PeerUnavailable, WouldBlock


def _link(reports: list | None = None, window: int = 1 << 20, batch: int | None = 4096) -> Link:
    link = Link(
        "b",
        dumps=lambda obj, compress=False: [msgpack.packb(obj, use_bin_type=True)],
        max_inflight_bytes=window,
        give_up_after=30.0,
        log=logging.getLogger("test"),
        death_grace=30.0,
        on_undeliverable=lambda peer, n, why: (reports if reports is not None else []).append((peer, n, why)),
    )
    link.set_batch_limit(batch)
    return link


def _stream(link: Link) -> list[list]:
    """The envelopes in the replay buffer, decoded, in stream order."""
    return [msgpack.unpackb(frames[0]) for _seq, frames, _n in link.state.unacked]


async def test_pushed_messages_go_before_any_later_envelope():
    link = _link()
    assert link.push("c", 1) and link.push("c", 2)
    assert link.post(REQ, [7, "svc", "x"]) is None  # seals the batch first
    assert link.push("c", 3)
    assert link.push("d", 4)  # another channel: the batch for "c" is sealed
    link._seal()
    want = [[SEND, 1, 0, "c", 1, 2], [REQ, 2, 0, 7, "svc", "x"], [SEND, 3, 0, "c", 3], [SEND, 4, 0, "d", 4]]
    assert _stream(link) == want


payloads = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.binary(max_size=1500),
    st.text(max_size=5),
    # within msgpack's range: this link's stand-in dumps is plain msgpack (the serializer sends bigger ints as an ext)
    st.lists(st.integers(-(2**63), 2**64 - 1), max_size=3),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(payloads, max_size=40))
def test_any_mix_keeps_call_order_and_each_message_once(objs):
    """Whatever takes the batch and whatever does not (bytes of 1 KiB and more), the stream
    holds every message once, in call order, in batches of at most the peer's limit."""
    link = _link(batch=5)
    link._seal_scheduled = True  # sealing driven by hand: no event loop needed
    for x in objs:
        if not link.push("c", x):
            assert link.post(SEND, ["c", x]) is None
    if link._bitems:
        link._seal()
    got = []
    for env in _stream(link):
        assert env[0] == SEND and env[3] == "c" and 1 <= len(env) - 4 <= 5
        got.extend(env[4:])
    assert got == objs


async def test_a_death_verdict_keeps_the_open_batch_for_a_successor():
    reports: list = []
    old = _link(reports)
    assert old.push("c", 1) and old.push("c", 2)
    old.fail(PeerUnavailable("b: declared dead"), keep=True)
    assert old.keeping == 1 and reports == []  # one envelope holding both
    new = _link(reports)
    assert new.adopt_stream(old) == 1
    assert _stream(new) == [[SEND, 1, 0, "c", 1, 2]]


async def test_a_peer_that_left_gets_the_open_batch_reported():
    reports: list = []
    link = _link(reports)
    link.push("c", 1)
    link.push("c", 2)
    link.peer_left()
    assert reports == [("b", 1, "peer left the cluster")]  # one envelope (two messages) given up


async def test_without_the_peers_feature_nothing_is_batched():
    link = _link(batch=None)
    assert not link.push("c", 1)
    link.set_batch_limit(True)  # malformed: not an int
    assert not link.batching


async def test_full_window_refuses_push_and_post_nowait():
    link = _link(window=100)
    assert link.push("c", b"x" * 90)
    assert link.push("c", b"y" * 20)  # checked before, like post: the last one may pass the window
    assert not link.push("c", b"z")
    with pytest.raises(WouldBlock, match="wait_space"):
        link.post_nowait(SEND, ["c", b"z"])
    assert len(_stream(link)) == 0 and len(link._bitems) == 2  # nothing taken after the window filled


# ---------------------------------------------------------------- requests and replies (rpc_batch)
def _unbatch(env: list) -> list[tuple]:
    """An envelope as the (kind, item) messages it carries, in order."""
    kind = env[0]
    if kind == SEND:
        return [(SEND, env[3], x) for x in env[4:]]
    per = 3 if kind == REQ else 2
    return [(kind, *env[i : i + per]) for i in range(3, len(env), per)]


messages = st.one_of(
    st.tuples(st.just(SEND), st.sampled_from(["c", "d"]), payloads),
    st.tuples(st.just(REQ), st.integers(1, 2**32), st.sampled_from(["svc", "other"]), payloads),
    st.tuples(st.just(REP), st.integers(1, 2**32), payloads),
    st.tuples(st.just(REP), st.integers(1, 2**32), st.tuples(st.integers(0, 9))),  # not plain: its own envelope
)


@settings(max_examples=40, deadline=None)
@given(st.lists(messages, max_size=50))
def test_requests_replies_and_sends_keep_call_order_each_once(msgs):
    """Whatever joins a batch and whatever goes alone (big bytes, a tuple), the stream holds
    every request, reply and send once, in call order, no REQ envelope over the peer's limit."""
    link = _link(batch=5)
    link.set_rpc_batch_limit(3)
    link._seal_scheduled = True  # sealing driven by hand: no event loop needed
    for kind, *fields in msgs:
        if kind == SEND and link.push(fields[0], fields[1]):
            continue
        assert link.post(kind, list(fields)) is None
    if link._bitems:
        link._seal()
    got = []
    for env in _stream(link):
        items = _unbatch(env)
        assert len(items) <= (3 if env[0] == REQ else 4096)
        got.extend(items)
    want = [(m[0], *m[1:-1], list(m[-1]) if type(m[-1]) is tuple else m[-1]) for m in msgs]
    assert got == want


async def test_requests_share_an_envelope_only_with_a_peer_that_takes_them():
    old = _link()
    new = _link()
    new.set_rpc_batch_limit(1024)
    for link in (old, new):
        for rid in range(3):
            assert link.post(REQ, [rid, "svc", b"x"]) is None
        if link._bitems:
            link._seal()
    assert _stream(old) == [[REQ, 1, 0, 0, "svc", b"x"], [REQ, 2, 0, 1, "svc", b"x"], [REQ, 3, 0, 2, "svc", b"x"]]
    assert _stream(new) == [[REQ, 1, 0, 0, "svc", b"x", 1, "svc", b"x", 2, "svc", b"x"]]


@pytest.mark.parametrize("limit", [None, 0, 1, "64", True])
def test_a_missing_or_malformed_rpc_batch_feature_turns_batching_off(limit):
    link = _link()
    link.set_rpc_batch_limit(limit)
    assert link._rpc_max == 0 and link._rep_max == 0


async def test_a_reply_batch_is_sealed_before_an_error_reply_and_kept_for_a_successor():
    """ERR goes alone, after what was answered before it; a death verdict keeps the open batch."""
    reports: list = []
    link = _link(reports)
    link.set_rpc_batch_limit(64)
    assert link.post(REP, [1, "a"], wait_ack=False) is None
    assert link.post(ERR, [2, "ValueError", "bad", ""], wait_ack=False) is None
    assert link.post(REP, [3, "c"], wait_ack=False) is None
    link.fail(PeerUnavailable("b: declared dead"), keep=True)
    assert _stream(link) == [[REP, 1, 0, 1, "a"], [ERR, 2, 0, 2, "ValueError", "bad", ""], [REP, 3, 0, 3, "c"]]
    assert link.keeping == 3 and reports == []


class _Wire:
    """A connection stand-in that takes writes at once (nothing else goes out in this loop
    iteration: flush_pending False), so lone requests and replies take the link's small path."""

    flush_pending = False

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write_nowait(self, frames: list) -> None:
        assert len(frames) == 1
        self.written.append(bytes(frames[0]))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([REQ, REP]), st.one_of(payloads, st.integers(2**64, 2**80)), st.booleans()),
        max_size=30,
    )
)
def test_lone_requests_and_replies_are_stamped_recorded_and_written_in_order(calls):
    """The one-envelope path of a lone request or reply: each is written as it is recorded
    for replay, carries the ack owed, and one that cannot be packed here (an int beyond 64
    bits, which this link's stand-in serializer refuses too) fails alone, leaving no gap."""
    link = _link()
    link.set_rpc_batch_limit(64)
    wire = _Wire()
    link.current = SimpleNamespace(conn=wire)
    want = []
    for rid, (kind, payload, owe) in enumerate(calls):
        if owe:
            link.state.on_receive(link.state.recv_seq + 1)  # a message of the peer's is owed an ack
        fields = [rid, "svc", payload] if kind == REQ else [rid, payload]
        packable = not isinstance(payload, int) or -(2**63) <= payload < 2**64
        if not packable:
            owed = link.state.ack_owed
            with pytest.raises(OverflowError):
                link.post(kind, fields, wait_ack=kind == REQ)
            assert link.state.ack_owed == owed  # nothing went out: the ack is still owed
            continue
        assert link.post(kind, fields, wait_ack=kind == REQ) is None
        assert link.state.ack_owed == 0  # the ack rode on it
        want.append([kind, len(want) + 1, link.state.recv_seq, *fields])
    assert _stream(link) == want
    assert [msgpack.unpackb(w) for w in wire.written] == want


class _Socket:
    """A connection stand-in with something else queued this loop iteration (flush_pending
    True), so requests and replies join a batch; it tells apart writes that go to the socket
    at once (write_now) from those left for the iteration's flush (write_nowait)."""

    flush_pending = True

    def __init__(self) -> None:
        self.now: list[list] = []
        self.later: list[list] = []

    def write_now(self, frames: list) -> None:
        self.now.append(msgpack.unpackb(bytes(frames[0])))

    def write_nowait(self, frames: list) -> None:
        self.later.append(msgpack.unpackb(bytes(frames[0])))


@pytest.mark.parametrize("kind", [REQ, REP])
async def test_a_batch_of_requests_or_replies_goes_to_the_socket_once_it_holds_rpc_pipeline(kind):
    """The peer, in another process, starts on the first RPC_PIPELINE while this side builds
    the rest: those batches are written at once, not at the end of the loop iteration; the
    remainder waits for the iteration's seal, and nothing is lost or reordered."""
    link = _link()
    link.set_rpc_batch_limit(1024)
    sock = _Socket()
    link.current = SimpleNamespace(conn=sock)
    n = 2 * RPC_PIPELINE + 5
    for rid in range(n):
        fields = [rid, "svc", b"x"] if kind == REQ else [rid, b"x"]
        assert link.post(kind, fields, wait_ack=kind == REQ) is None
    assert [len(_unbatch(env)) for env in sock.now] == [RPC_PIPELINE, RPC_PIPELINE]
    assert sock.later == [] and len(link._bitems) == 5  # the rest: sealed at the iteration's end
    link._seal_soon()
    envs = sock.now + sock.later
    assert [rid for env in envs for _k, rid, *_ in _unbatch(env)] == list(range(n))
    assert [env[1] for env in envs] == [1, 2, 3]  # one sequence number per envelope, in order
