"""The small allreduce's state machine (``DoublingRun``) for every rank of a group, in memory:
messages delivered in any order, ranks started at any point (their partners' messages then wait
as early ones), every group size with folds. Every rank ends with the same bits, equal to the
generic recursive doubling's operand order."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.collectives.algorithms import recursive_doubling
from aionet.collectives.small import MISSING, DoublingRun, round_tags
from aionet.errors import CollectiveError


class Net:
    """n ranks' inboxes, waiting steps and messages in flight."""

    def __init__(self, n: int) -> None:
        self.inbox: list[dict[Any, Any]] = [{} for _ in range(n)]
        self.steps: list[dict[Any, Any]] = [{} for _ in range(n)]
        self.flight: list[tuple[int, Any, Any]] = []

    def post(self, src: int) -> Any:
        def post(dst: int, seq: int, t: int, payload: Any) -> None:
            self.flight.append((dst, (seq, t, src), payload))

        return post

    def expect(self, rank: int) -> Any:
        def expect(key: Any, step: Any) -> Any:
            if key in self.inbox[rank]:
                return self.inbox[rank].pop(key)
            self.steps[rank][key] = step
            return MISSING

        return expect

    def deliver(self, i: int) -> None:
        dst, key, payload = self.flight.pop(i)
        step = self.steps[dst].pop(key, None)
        if step is not None:
            step(payload)
        else:
            self.inbox[dst][key] = payload


def reference(xs: list[np.ndarray], fn: Any) -> np.ndarray:
    """The generic doubling's result on rank 0 (the same on every rank)."""
    n = len(xs)
    p = 1 << (n.bit_length() - 1)
    acc = [x.copy() for x in xs[:p]]
    for r in range(p, n):
        fn(acc[r - p], xs[r], out=acc[r - p])
    k = 1
    while k < p:
        acc = [fn(acc[r], acc[r ^ k]) if r < r ^ k else fn(acc[r ^ k], acc[r]) for r in range(p)]
        k <<= 1
    return acc[0]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 9), st.sampled_from(["add", "multiply", "maximum"]), st.data())
def test_every_rank_gets_the_same_bits_in_any_delivery_order(n: int, op: str, data: st.DataObject) -> None:
    fn = getattr(np, op)
    rng = np.random.default_rng(n)
    xs = [rng.standard_normal(3).astype(np.float32) for _ in range(n)]
    before = [x.copy() for x in xs]
    loop = asyncio.new_event_loop()
    try:
        net = Net(n)
        runs: list[DoublingRun] = []
        order = data.draw(st.permutations(range(n)))
        for r in range(n):
            plan = recursive_doubling(n, r)
            done: asyncio.Future[np.ndarray] = loop.create_future()
            runs.append(DoublingRun(net.post(r), net.expect(r), r, 7, xs[r], fn, plan, round_tags(plan), done))
        started = 0
        while started < n or net.flight:
            if started < n and (not net.flight or data.draw(st.booleans())):
                runs[order[started]].start()
                started += 1
            else:
                net.deliver(data.draw(st.integers(0, len(net.flight) - 1)))
        expect = reference(xs, fn) if n > 1 else xs[0]
        for r, run in enumerate(runs):
            assert run.done.done(), f"rank {r} of {n} never finished"
            assert run.done.result().tobytes() == expect.tobytes(), (r, n)
            assert run.done.result().flags.writeable
        assert all(x.tobytes() == b.tobytes() for x, b in zip(xs, before, strict=True))  # inputs untouched
        assert not any(net.steps) and not any(net.inbox)  # nothing left waiting or unread
    finally:
        loop.close()


def test_bytes_of_another_shape_end_the_call_with_a_collective_error() -> None:
    loop = asyncio.new_event_loop()
    try:
        net = Net(2)
        done: asyncio.Future[np.ndarray] = loop.create_future()
        plan = recursive_doubling(2, 0)
        x = np.ones(2, np.float32)
        run = DoublingRun(net.post(0), net.expect(0), 0, 0, x, np.add, plan, round_tags(plan), done)
        run.start()
        ((_, key, _),) = net.flight
        net.flight.clear()
        net.steps[0][(0, key[1], 1)](b"\0" * 12)  # the partner sent 3 floats
        with pytest.raises(CollectiveError, match="same shape and dtype"):
            done.result()
    finally:
        loop.close()
