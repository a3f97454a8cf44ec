"""A REQ envelope carrying many requests (issue 18's pipelined requests), fed to the router
directly: its requests start in order as ``link.max_concurrent_requests`` allows, exactly as
one at a time would, and each gets its own reply or error."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aionet.codecs.envelope import ERR, REP, REQ
from aionet.config import LinkSection
from aionet.core.router import Router


def _router(bound: int) -> tuple[Router, list[tuple[int, list[Any]]]]:
    router = Router("srv", LinkSection(max_concurrent_requests=bound), logging.getLogger("test"))
    sent: list[tuple[int, list[Any]]] = []
    return router, sent


def _reply(sent: list[tuple[int, list[Any]]]) -> Any:
    def reply(kind: int, fields: list[Any]) -> None:
        sent.append((kind, fields))

    return reply


def _batch(*reqs: tuple[int, str, Any]) -> list[Any]:
    return [REQ, 1, 0, *(x for r in reqs for x in r)]


async def test_a_batch_starts_what_the_bound_allows_and_the_rest_as_slots_free() -> None:
    """As for requests one at a time: a handler waiting for a later request of the same batch
    (a barrier) must get it started while the bound allows; those over it wait (up to as many
    again) and start, in order, as handlers end, without the reader stopping."""
    router, sent = _router(4)
    gate = asyncio.Event()
    order: list[int] = []

    async def slow(x: Any) -> Any:
        order.append(x)
        await gate.wait()
        return x

    router.add_service("slow", slow)
    router.add_service("sync", lambda x: x)
    reply = _reply(sent)
    assert router.on_requests(_batch((1, "slow", 1), (2, "slow", 2), (3, "slow", 3)), reply, "cli") is None
    env = _batch((4, "slow", 4), (5, "sync", 5), (6, "slow", 6), (7, "slow", 7))
    assert router.on_requests(env, reply, "cli") is None  # 4 started, 5 (sync) answered, 6 and 7 wait
    assert router.running["cli"] == 4 and list(router.waiting["cli"]) == [6, 7]
    assert [f[0] for _k, f in sent] == [5]
    gate.set()
    for _ in range(3):
        await asyncio.wait_for(asyncio.gather(*router.tasks), 5)
    assert sorted(f[0] for k, f in sent if k == REP) == [1, 2, 3, 4, 5, 6, 7]
    assert order == [1, 2, 3, 4, 6, 7]
    assert "cli" not in router.running and router.waiting == {}


async def test_a_batch_over_the_bound_never_runs_more_than_the_bound() -> None:
    router, sent = _router(2)
    running = [0, 0]
    release = asyncio.Event()

    async def held(x: Any) -> Any:
        running[0] += 1
        running[1] = max(running[1], running[0])
        await release.wait()
        running[0] -= 1
        return x

    router.add_service("held", held)
    env = _batch(*((i, "held", i) for i in range(5)))
    rest = router.on_requests(env, _reply(sent), "cli")
    release.set()
    while rest is not None:
        await asyncio.wait_for(rest[0], 5)
        rest = router.on_requests(env, _reply(sent), "cli", rest[1])
    await asyncio.wait_for(asyncio.gather(*router.tasks), 5)
    assert sorted(f[0] for _k, f in sent) == list(range(5)) and running[1] <= 2


async def test_each_request_of_a_batch_gets_its_own_answer_or_error() -> None:
    router, sent = _router(8)
    router.add_service("double", lambda x: 2 * x)

    def fails(x: Any) -> Any:
        raise ValueError(f"no {x}")

    router.add_service("fails", fails)
    env = _batch((1, "double", 2), (2, "missing", 0), (3, "fails", 7), (4, "double", 5))
    assert router.on_requests(env, _reply(sent), "cli") is None
    assert [(k, f[0]) for k, f in sent] == [(REP, 1), (ERR, 2), (ERR, 3), (REP, 4)]
    assert sent[0][1][1] == 4 and sent[3][1][1] == 10
    assert sent[1][1][1] == "aionet.ServiceNotFound" and "'missing'" in sent[1][1][2]
    assert sent[2][1][1] == "ValueError" and sent[2][1][2] == "no 7"


async def test_a_reply_batch_resolves_each_pending_request_and_skips_late_ones() -> None:
    router, _sent = _router(8)
    r1, f1 = router.new_request("srv")
    r2, f2 = router.new_request("srv")
    router.on_replies([REP, 1, 0, r1, "a", 999, "late", r2, "b"], "srv")
    assert f1.result() == "a" and f2.result() == "b" and not router.pending
