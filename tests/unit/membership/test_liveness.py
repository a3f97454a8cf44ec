"""The liveness responder's wire and the verdict rules, fed directly (no sockets)."""

import asyncio
import hashlib
import hmac
import math
import struct

from aionet.membership import liveness, responder_main
from aionet.membership.liveness import Answer, Liveness, Pinger, host_of, parse_address
from aionet.membership.probe import GONE


def _reply(nonce: bytes, stall_ms: int, key: bytes) -> bytes:
    body = responder_main.REPLY + nonce + struct.pack(">I", stall_ms)
    return body + hmac.new(key, body, hashlib.sha256).digest()[:16]


class _Log:
    def warning(self, *a, **k):
        pass


async def test_a_reply_signed_with_the_cluster_token_resolves_its_ping():
    p = Pinger(b"s3cret")
    fut = __import__("asyncio").get_running_loop().create_future()
    p._waiting[b"n" * 8] = fut
    p._on_reply(_reply(b"n" * 8, 1500, b"s3cret"))
    assert fut.result() == Answer(1.5)
    fut2 = __import__("asyncio").get_running_loop().create_future()
    p._waiting[b"m" * 8] = fut2
    p._on_reply(_reply(b"m" * 8, responder_main.NOT_RUNNING, b"s3cret"))
    assert math.isinf(fut2.result().stall)


async def test_forged_or_garbled_replies_are_ignored():
    p = Pinger(b"s3cret")
    fut = __import__("asyncio").get_running_loop().create_future()
    p._waiting[b"n" * 8] = fut
    for bad in (
        _reply(b"n" * 8, 10, b"wrong"),  # another cluster's responder, or a forger
        _reply(b"n" * 8, 10, b"s3cret")[:-1],  # truncated
        b"AIOX" + _reply(b"n" * 8, 10, b"s3cret")[4:],  # wrong magic
        b"",
    ):
        p._on_reply(bad)
    assert not fut.done() and p.rejected == 4
    p._on_reply(_reply(b"x" * 8, 10, b"s3cret"))  # a nonce nobody waits for
    assert not fut.done()


def test_verdict_keeps_a_busy_member_alive_until_max_loop_stall():
    lv = Liveness(enabled=True, token=None, max_loop_stall=60.0, log=_Log())
    assert lv.verdict("a", Answer(2.0)) == (True, True)  # alive, newly stalled
    assert lv.verdict("a", Answer(30.0)) == (True, False)  # still stalled: no second event
    assert lv.stalled == {"a": 30.0}
    assert lv.resumed("a") and not lv.resumed("a")
    assert lv.verdict("a", Answer(61.0)) == (False, False)  # blocked too long: dead
    assert lv.verdict("b", Answer(math.inf)) == (False, False)  # stopped or gone: dead
    assert lv.stalled == {}


def test_addresses_parse_strictly():
    assert parse_address("127.0.0.1:4000") == ("127.0.0.1", 4000)
    assert parse_address("[::1]:4000") == ("::1", 4000)
    for bad in (None, 5, "nohost", "h:0", "h:70000", "h:x", ":5", "h:" + "9" * 400):
        assert parse_address(bad) is None
    assert host_of("tcp://10.0.0.1:7700") == "10.0.0.1"
    assert host_of("zmq+tcp://seed.example:7700") == "seed.example"
    assert host_of("inproc://") is None and host_of("zmq+ipc:///tmp/x") is None


def test_the_responder_reads_its_nodes_state_from_proc():
    import os

    assert responder_main.parent_state(os.getpid()) in ("R", "S")
    assert responder_main.parent_state(2**22 + 12345) == ""  # no such process
    assert liveness.available()


def test_a_ping_is_as_large_as_its_reply_so_the_responder_never_amplifies():
    assert len(_reply(b"n" * 8, 0, b"k")) == responder_main.PING_SIZE


def test_a_node_that_has_begun_to_exit_reads_as_gone_not_running():
    """A SIGKILLed node closes its sockets (its peers ping the responder) before it is a
    zombie; meanwhile its state letter still says running. PF_EXITING in the flags field
    (the 7th after the command name) is what tells the responder (issue: kill seen in 719 ms)."""
    rest = b" 1 100 100 0 -1 {flags} 0 0 0 0 5 3 0 0 20 0 4 0 123 456\n"
    line = b"100 (python3) {state}" + rest
    assert responder_main.stat_state(line.replace(b"{state}", b"S").replace(b"{flags}", b"4194560")) == "S"
    assert responder_main.stat_state(line.replace(b"{state}", b"R").replace(b"{flags}", b"4194564")) == "X"
    assert responder_main.stat_state(line.replace(b"{state}", b"Z").replace(b"{flags}", b"4227084")) == "X"
    assert responder_main.stat_state(line.replace(b"{state}", b"T").replace(b"{flags}", b"1077936128")) == "T"
    odd = b"100 (a) R (b) S" + rest.replace(b"{flags}", b"4194560")  # ')' and spaces in the name
    assert responder_main.stat_state(odd) == "S"
    assert responder_main.stat_state(b"") == "" and responder_main.stat_state(b"100 (x)") == ""


def _lv() -> Liveness:
    return Liveness(enabled=True, token=None, max_loop_stall=60.0, log=_Log())


def _spawner():
    return lambda coro, name: asyncio.ensure_future(coro)


async def test_a_probe_that_finds_nothing_listening_decides_without_waiting_for_the_responder(monkeypatch):
    """A killed node's responder may already have exited (silent): a refused probe (GONE) is
    conclusive, so the round ends now rather than after a grace for the responder (with the
    grace made an hour, waiting for it would fail the 5 s bound)."""
    monkeypatch.setattr(liveness, "PING_GRACE", 3600.0)
    lv = _lv()
    never = asyncio.Event()

    async def silent(extra, timeout):
        await never.wait()

    async def gone():
        return GONE

    lv.check = silent  # type: ignore[method-assign]
    out = await asyncio.wait_for(lv.verify_round("b", None, gone(), 0.5, _spawner()), 5)
    assert out == ("dead", liveness.NOTHING_LISTENS, None)


async def test_a_probe_that_finds_nothing_listening_outranks_a_responder_saying_it_runs():
    """Both answers in at once: the responder (an older one, reading the state letter only)
    says the process runs with a short stall, the probe says nothing listens. The process is
    tearing itself down: dead, and not flagged stalled."""
    lv = _lv()

    async def runs(extra, timeout):
        return Answer(0.06)

    async def gone():
        return GONE

    lv.check = runs  # type: ignore[method-assign]
    out = await asyncio.wait_for(lv.verify_round("b", None, gone(), 0.5, _spawner()), 5)
    assert out == ("dead", liveness.NOTHING_LISTENS, None) and lv.stalled == {}


async def test_a_responder_that_answers_first_still_keeps_a_blocked_member_alive():
    """The other side of the rule: while the probes have not found the member gone, the
    responder's word (process runs, loop blocked 2 s) keeps it alive and flags it stalled."""
    lv = _lv()
    never = asyncio.Event()

    async def blocked(extra, timeout):
        return Answer(2.0)

    async def hung():
        await never.wait()
        return ""

    lv.check = blocked  # type: ignore[method-assign]
    out = await asyncio.wait_for(lv.verify_round("b", None, hung(), 0.5, _spawner()), 5)
    assert out == ("alive", "", 2.0) and lv.stalled == {"b": 2.0}
