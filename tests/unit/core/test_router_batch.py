"""A REQ envelope carrying many requests (issue 18's pipelined requests), fed to the router
directly: it is admitted whole or not at all, so ``link.max_concurrent_requests`` still bounds
a peer's running handlers, and each request gets its own reply or error, in order."""

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


async def test_a_batch_that_does_not_fit_the_bound_waits_whole_then_goes_in_whole() -> None:
    router, sent = _router(4)
    gate = asyncio.Event()

    async def slow(x: Any) -> Any:
        await gate.wait()
        return x

    router.add_service("slow", slow)
    reply = _reply(sent)
    assert router.on_requests(_batch((1, "slow", 1), (2, "slow", 2), (3, "slow", 3)), reply, "cli") is None
    assert router.running["cli"] == 3
    wait = router.on_requests(_batch((4, "slow", 4), (5, "slow", 5)), reply, "cli")
    assert wait is not None and router.running["cli"] == 3  # none of the two started
    gate.set()
    await asyncio.wait_for(wait, 5)
    assert router.on_requests(_batch((4, "slow", 4), (5, "slow", 5)), reply, "cli") is None
    await asyncio.wait_for(asyncio.gather(*router.tasks), 5)
    assert sorted(f[0] for k, f in sent if k == REP) == [1, 2, 3, 4, 5]
    assert "cli" not in router.running


async def test_with_nothing_running_a_batch_goes_in_whatever_its_size() -> None:
    """A peer batches at most the bound it was told; a bigger batch must still not wedge the link."""
    router, sent = _router(2)

    async def echo(x: Any) -> Any:
        return x

    router.add_service("echo", echo)
    assert router.on_requests(_batch(*((i, "echo", i) for i in range(5))), _reply(sent), "cli") is None
    await asyncio.wait_for(asyncio.gather(*router.tasks), 5)
    assert [f for _k, f in sent] == [[i, i] for i in range(5)]  # started in order, answered in order


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
