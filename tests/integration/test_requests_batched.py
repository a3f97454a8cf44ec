"""Requests and replies batched into shared REQ / REP envelopes (issue 18, feature
``rpc_batch``): each request still runs once and gets its own reply across connection cuts,
the per-peer handler bound holds, a failing handler still raises RemoteError at its caller,
and a peer that does not batch (an older node) gets one envelope per request."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from aionet import Node, RemoteError
from aionet.config import Config
from aionet.core.request_slots import UNBOUNDED
from tests.conftest import proxied_pair, wait_for


@contextlib.asynccontextmanager
async def pair(cfg_a: Config | None = None) -> AsyncIterator[tuple[Node, Node]]:
    async with (
        Node(name="a", listen="tcp://127.0.0.1:0", config=cfg_a) as a,
        Node(name="b", listen="tcp://127.0.0.1:0", join=[a.address]) as b,
    ):
        await b.request("a", "aionet.echo", 0, timeout=5)  # the link is up
        yield a, b


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bound", [1024, 8])
async def test_many_requests_in_flight_run_once_and_are_answered_once_across_cuts(bound: int):
    """64 callers through proxies that cut every connection every 30 ms: every request's
    handler ran exactly once, every caller got its own answer, and the requests shared
    envelopes (fewer sequence numbers than requests). With a handler bound of 8, b keeps to
    it: no more than 8 requests are out at once, so a never has to stop reading from b."""
    cfg = Config.from_dict({"link": {"max_concurrent_requests": bound}}, env={})
    async with proxied_pair(cfg) as (a, b, pa, pb):
        seen: Counter[int] = Counter()
        parked = [0]
        slot = a.router._slot

        def counted_slot(peer: str) -> asyncio.Future[None]:
            parked[0] += 1
            return slot(peer)

        a.router._slot = counted_slot  # type: ignore[method-assign]

        @a.service("async_once")
        async def async_once(x: int) -> int:
            seen[x] += 1
            # the scenario, not synchronisation: every 7th handler takes 1 ms, the rest suspend once,
            # so replies finish out of order while connections are cut
            await asyncio.sleep(0.001 if x % 7 == 0 else 0)
            return x + 1

        @a.service("sync_once")
        def sync_once(x: int) -> int:
            seen[x] += 1
            return x + 1

        await b.request("a", "aionet.echo", 0, timeout=10)
        link = b._peers["a"].link
        assert link._rpc_max > 1, "the peer did not advertise rpc_batch"
        seq0 = link.state.next_seq
        per = 150

        async def caller(w: int) -> list[int]:
            out = []
            for i in range(per):
                x = w * 10_000 + i
                out.append(await b.request("a", "async_once" if w % 2 else "sync_once", x, timeout=60))
            return out

        pa.cut_every(0.03)
        pb.cut_every(0.03)
        results = await asyncio.gather(*(caller(w) for w in range(64)))
        pa.stop_cutting()
        pb.stop_cutting()
        assert pa.stats.cuts + pb.stats.cuts >= 3, "the proxies hardly cut: the test proved little"
        assert results == [[w * 10_000 + i + 1 for i in range(per)] for w in range(64)]
        assert len(seen) == 64 * per and set(seen.values()) == {1}, "a request ran twice (or not at all)"
        if bound > 64:
            assert link.state.next_seq - seq0 < 64 * per / 3, "requests did not share envelopes"
        assert parked[0] == 0, "a had to stop reading from b: b sent more than a's bound"


@pytest.mark.timeout(60)
async def test_the_handler_bound_holds_and_errors_reach_their_callers_when_batched():
    """256 batched requests to handlers held at a gate: exactly ``max_concurrent_requests`` (4)
    start and the reader waits for a slot; released, every caller gets its own answer or error
    and no more than 4 ever ran at once."""
    cfg = Config.from_dict({"link": {"max_concurrent_requests": 4}}, env={})
    async with pair(cfg) as (a, b):
        assert b._peers["a"].link._rpc_max == 4  # a batch never carries more than a admits
        # b would keep to a's bound (test_request_cancel): here b is a caller that does not know
        # it (an older node), so a itself must hold its bound against batched envelopes
        b._peers["a"].link.requests.bound = UNBOUNDED
        running = [0, 0]  # now, most
        gate = asyncio.Event()

        @a.service("work")
        async def work(x: int) -> int:
            running[0] += 1
            running[1] = max(running[1], running[0])
            try:
                await gate.wait()
                await asyncio.sleep(0)  # suspend even once the gate is open, so handlers overlap
                if x % 3 == 0:
                    raise ValueError(f"no {x}")
                return -x
            finally:
                running[0] -= 1

        async def call(x: int) -> int | str:
            try:
                return await b.request("a", "work", x, timeout=30)
            except RemoteError as exc:
                return exc.remote_type + ": " + str(exc.remote_message)

        calls = asyncio.gather(*(call(x) for x in range(1, 257)))
        try:
            # the 5th request has arrived once a's reader waits for a slot (or, were the bound
            # broken, once more than 4 handlers run)
            await wait_for(lambda: running[0] > 4 or "b" in a.router._slot_waiters, 10)
            assert running[0] == 4 and a.router.running == {"b": 4}
        finally:
            gate.set()
        got = await calls
        assert got == [f"ValueError: no {x}" if x % 3 == 0 else -x for x in range(1, 257)]
        assert running[1] == 4
        await wait_for(lambda: not a.router.running, 5)  # finished handlers hold no slot


@pytest.mark.timeout(60)
async def test_a_peer_that_does_not_batch_requests_gets_one_envelope_each():
    """A peer without the rpc_batch feature (an older node) is sent one REQ per request, and
    answers with one REP each, which this node reads as before."""
    async with pair() as (a, b):
        b._peers["a"].link.set_rpc_batch_limit(None)
        a._peers["b"].link.set_rpc_batch_limit(None)
        # what each reader hands its router: one envelope of one request (reply) to on_request
        # (on_reply), an envelope of many to on_requests (on_replies)
        single: list[Any] = []
        batches: list[Any] = []
        on_request, on_requests = a.router.on_request, a.router.on_requests
        on_reply, on_replies = b.router.on_reply, b.router.on_replies

        def one_req(rid: Any, service: Any, payload: Any, reply: Any, peer: str = "") -> Any:
            single.append(("req", service, payload))
            return on_request(rid, service, payload, reply, peer)

        def many_req(env: list[Any], reply: Any, peer: str = "", start: int = 3) -> Any:
            batches.append(env)
            return on_requests(env, reply, peer, start)

        def one_rep(kind: int, rid: Any, body: list[Any], peer: str) -> None:
            single.append(("rep", None, body[0]))
            on_reply(kind, rid, body, peer)

        def many_rep(env: list[Any], peer: str) -> None:
            batches.append(env)
            on_replies(env, peer)

        a.router.on_request, a.router.on_requests = one_req, many_req  # type: ignore[method-assign]
        b.router.on_reply, b.router.on_replies = one_rep, many_rep  # type: ignore[method-assign]

        @a.service("inc")
        async def inc(x: int) -> int:
            return x + 1

        got = await asyncio.gather(*(b.request("a", "inc", x, timeout=30) for x in range(64)))
        assert got == list(range(1, 65))
        assert batches == []  # one REQ each, one REP each
        # (beside ours, b's scheduler may ask a for its resources, and a answer)
        assert sorted(p for k, svc, p in single if k == "req" and svc == "inc") == list(range(64))
        assert sorted(p for k, _svc, p in single if k == "rep" and type(p) is int) == list(range(1, 65))
