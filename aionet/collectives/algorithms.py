"""Collective schedules as pure functions: who sends which piece to whom at each step.

No I/O and no arrays here: the group's driver (:mod:`.group`) performs a schedule, and the
unit tests run every rank of a schedule in memory for any group size, which is how we know
a ring or a tree delivers every piece exactly once.

- Ring reduce-scatter then ring allgather (bandwidth-optimal for large arrays: each rank
  sends and receives ``2 (n - 1) / n`` of the data).
- Recursive doubling with a fold for sizes that are not a power of two (latency-optimal
  for small arrays: ``ceil(log2 n)`` rounds plus two).
- Binomial trees for broadcast and reduce (``ceil(log2 n)`` rounds).
"""

from __future__ import annotations

from dataclasses import dataclass


def chunk_bounds(length: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``[start, stop)`` ranges covering ``range(length)``, sizes differing
    by at most one (as ``numpy.array_split``); empty ranges when ``length < parts``."""
    if parts < 1:
        raise ValueError("parts must be >= 1")
    q, r = divmod(length, parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + q + (1 if i < r else 0)
        out.append((start, stop))
        start = stop
    return out


@dataclass(frozen=True, slots=True)
class RingStep:
    """Send chunk ``send`` to the right neighbour, receive chunk ``recv`` from the left."""

    send: int
    recv: int


def ring_reduce_scatter(n: int, rank: int) -> list[RingStep]:
    """``n - 1`` steps; afterwards ``rank`` holds the fully reduced chunk ``(rank + 1) % n``.
    At step ``s`` the received chunk is reduced into the local one."""
    return [RingStep(send=(rank - s) % n, recv=(rank - s - 1) % n) for s in range(n - 1)]


def ring_allgather(n: int, rank: int, first: int | None = None) -> list[RingStep]:
    """``n - 1`` steps passing complete chunks around; ``rank`` starts owning chunk ``first``
    (default ``(rank + 1) % n``, where :func:`ring_reduce_scatter` leaves it). The received
    chunk is copied in and forwarded at the next step."""
    own = (rank + 1) % n if first is None else first
    return [RingStep(send=(own - s) % n, recv=(own - s - 1) % n) for s in range(n - 1)]


def reduce_scatter_owner(n: int, chunk: int) -> int:
    """The rank that holds reduced ``chunk`` after :func:`ring_reduce_scatter`."""
    return (chunk - 1) % n


# ---------------------------------------------------------------------------- recursive doubling
@dataclass(frozen=True, slots=True)
class DoublingPlan:
    """Recursive doubling over the largest power of two ``p <= n``: ranks ``>= p`` first fold
    their data into partner ``rank - p`` (``fold_to``), the ``p`` ranks exchange with
    ``rank ^ 2**k`` for each round, then the folded ranks get the result back (``unfold``)."""

    fold_to: int | None  # this rank gives its data to this rank and waits for the result
    fold_from: int | None  # this rank first receives the data of this folded rank
    partners: tuple[int, ...]  # exchange partners, one per round
    unfold_to: int | None  # after the rounds, send the result to this folded rank


def recursive_doubling(n: int, rank: int) -> DoublingPlan:
    p = 1 << (n.bit_length() - 1)
    if rank >= p:
        return DoublingPlan(fold_to=rank - p, fold_from=None, partners=(), unfold_to=None)
    extra = rank + p if rank + p < n else None
    rounds = tuple(rank ^ (1 << k) for k in range(p.bit_length() - 1))
    return DoublingPlan(fold_to=None, fold_from=extra, partners=rounds, unfold_to=extra)


# ---------------------------------------------------------------------------- binomial trees
@dataclass(frozen=True, slots=True)
class TreeNode:
    """This rank's place in a binomial tree rooted at ``root``: its parent (None at the
    root) and its children in the order a broadcast sends to them (largest subtree first)."""

    parent: int | None
    children: tuple[int, ...]


def binomial_tree(n: int, root: int, rank: int) -> TreeNode:
    rel = (rank - root) % n
    parent = None
    mask = 1
    while mask < n:
        if rel & mask:
            parent = ((rel - mask) + root) % n
            break
        mask <<= 1
    children = []
    mask >>= 1
    while mask > 0:
        if rel + mask < n:
            children.append((rel + mask + root) % n)
        mask >>= 1
    return TreeNode(parent=parent, children=tuple(children))


__all__ = [
    "DoublingPlan",
    "RingStep",
    "TreeNode",
    "binomial_tree",
    "chunk_bounds",
    "recursive_doubling",
    "reduce_scatter_owner",
    "ring_allgather",
    "ring_reduce_scatter",
]
