"""The call signature every collective tag carries (:mod:`aionet.collectives.wire`), fed
directly: a message of the same call always matches its receiver's call (whatever its bucket,
phase, step and segment), a message of a call that differs in kind, op, resolved algorithm or
root never does, the error names both calls as the user wrote them, and the small allreduce's
tags stay the generic doubling's."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from aionet.collectives.algorithms import recursive_doubling
from aionet.collectives.ops import OPS
from aionet.collectives.small import FOLD, ROUND, UNFOLD, round_tags
from aionet.collectives.wire import (
    ABORT,
    KINDS,
    PROBE,
    REDUCING,
    ROOTED,
    SIG_ALGORITHMS,
    call_mask,
    describe,
    matches,
    signature,
    tag,
)

CALL_KINDS = [k for k in KINDS if k]
ALGOS = [a for a in SIG_ALGORITHMS if a]


@st.composite
def calls(draw: Any) -> tuple[str, str, str, int]:
    """A call as the group makes its signature: kind, op (reductions), algorithm (allreduce), root."""
    kind = draw(st.sampled_from(CALL_KINDS))
    op = draw(st.sampled_from(list(OPS))) if kind in REDUCING else ""
    algorithm = draw(st.sampled_from(ALGOS)) if kind == "allreduce" else ""
    root = draw(st.integers(0, (1 << 20) - 1)) if kind in ROOTED else 0
    return kind, op, algorithm, root


messages = st.tuples(
    st.integers(0, 255), st.integers(0, 29), st.integers(0, (1 << 20) - 1), st.integers(0, (1 << 20) - 1)
)


def message(call: tuple[str, str, str, int], bucket: int, phase: int, step: int, segment: int) -> int:
    """A tag the group sends for ``call``: a rooted call's step is its root (it uses no other)."""
    kind = call[0]
    return signature(*call) | tag(bucket, phase, 0 if kind in ROOTED else step, segment)


def accepts(call: tuple[str, str, str, int], buckets: int) -> tuple[int, tuple[int, ...]]:
    """What the receiving rank's call accepts (Group._want's rule)."""
    sig = signature(*call)
    return call_mask(call[0]), tuple(sig | tag(b, 0, 0) for b in range(buckets))


@given(calls(), messages, st.integers(1, 256))
def test_a_message_of_the_same_call_always_matches(call: Any, msg: Any, buckets: int) -> None:
    bucket, phase, step, segment = msg
    bucket %= buckets
    t = message(call, bucket, phase, step, segment)
    assert 0 <= t < 1 << 64  # msgpack's uint64: one int on the wire
    assert matches(t, *accepts(call, buckets))
    assert t not in (ABORT, PROBE)


@given(calls(), calls(), messages)
def test_a_message_of_another_call_never_matches_and_the_error_names_both(mine: Any, theirs: Any, msg: Any) -> None:
    bucket, phase, step, segment = msg
    t = message(theirs, bucket, phase, step, segment)
    want = accepts(mine, 256)  # every bucket: only the signature can tell the calls apart
    assert matches(t, *want) == (mine == theirs)
    if mine != theirs:
        assert describe(t) != describe(want[1][0])
    kind, op, algorithm, root = theirs
    text = describe(t)
    assert text.startswith(f"{kind}(")
    assert (f"op={op!r}" in text) == bool(op) and (f"algorithm={algorithm!r}" in text) == bool(algorithm)
    assert (f"root={root}" in text) == (kind in ROOTED)


def test_a_listed_allreduce_accepts_its_own_buckets_only() -> None:
    mask, allowed = accepts(("allreduce", "sum", "ring", 0), 2)
    ring = signature("allreduce", "sum", "ring")
    assert matches(ring | tag(1, 4, 3, 7), mask, allowed)
    assert not matches(ring | tag(2, 4, 3, 7), mask, allowed)  # a dtype bucket this rank lacks


def test_every_op_and_kind_has_a_code() -> None:
    """An op added to ops.OPS without a signature code would raise in every call that uses it."""
    for op in OPS:
        assert f"op={op!r}" in describe(signature("allreduce", op, "ring"))
    assert describe(signature("barrier")) == "barrier()"
    assert describe(signature("broadcast", root=5)) == "broadcast(root=5)"
    assert describe(signature("allreduce", "max", "doubling")) == "allreduce(op='max', algorithm='doubling')"


@given(st.integers(1, 64), st.sampled_from(list(OPS)))
def test_the_small_allreduce_sends_the_generic_doublings_tags(n: int, op: str) -> None:
    """small.DoublingRun and GroupAlgorithms._doubling must stay bit-compatible: ranks on either
    path (one forced 'doubling' on a large-ish array, one on the small path) talk to each other."""
    sig = signature("allreduce", op, "doubling")
    for r in range(n):
        plan = recursive_doubling(n, r)
        tags = round_tags(plan, sig)
        assert tags[:2] == (sig | tag(0, 0, 0), sig | tag(0, 2, 0)) == (sig | FOLD, sig | UNFOLD)
        assert tags[2:] == tuple(sig | tag(0, ROUND, k) for k in range(len(plan.partners)))
