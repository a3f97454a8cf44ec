"""Every schedule run for all ranks in memory, for any group size: each rank ends with the
right data, and every message has a receiver expecting it (none lost, none extra)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from aionet.collectives.algorithms import (
    binomial_tree,
    chunk_bounds,
    recursive_doubling,
    reduce_scatter_owner,
    ring_allgather,
    ring_reduce_scatter,
)

sizes = st.integers(1, 33)


@given(st.integers(0, 1000), st.integers(1, 40))
def test_chunk_bounds_cover_the_range_evenly(length: int, parts: int) -> None:
    b = chunk_bounds(length, parts)
    assert len(b) == parts and b[0][0] == 0 and b[-1][1] == length
    assert all(b[i][1] == b[i + 1][0] for i in range(parts - 1))
    lens = [stop - start for start, stop in b]
    assert max(lens) - min(lens) <= 1


@given(sizes)
def test_ring_allreduce_sums_every_chunk_everywhere(n: int) -> None:
    # rank r contributes value 10**r to every chunk: the full sum is the same for all chunks
    data = [[{r} for _ in range(n)] for r in range(n)]  # sets of contributing ranks per chunk
    plans = [ring_reduce_scatter(n, r) for r in range(n)]
    for s in range(n - 1):
        sent = [(r, plans[r][s].send, set(data[r][plans[r][s].send])) for r in range(n)]
        for r, _chunk, payload in sent:
            right = (r + 1) % n
            assert plans[right][s].recv == _chunk  # the neighbour expects exactly this chunk
            data[right][_chunk] |= payload
    for c in range(n):
        assert data[reduce_scatter_owner(n, c)][c] == set(range(n))
    plans_ag = [ring_allgather(n, r) for r in range(n)]
    for s in range(n - 1):
        sent = [(r, plans_ag[r][s].send, set(data[r][plans_ag[r][s].send])) for r in range(n)]
        for r, chunk, payload in sent:
            right = (r + 1) % n
            assert plans_ag[right][s].recv == chunk
            data[right][chunk] = payload
    assert all(data[r][c] == set(range(n)) for r in range(n) for c in range(n))


@given(sizes)
def test_recursive_doubling_gives_everyone_the_full_reduction(n: int) -> None:
    plans = [recursive_doubling(n, r) for r in range(n)]
    have = [{r} for r in range(n)]
    for r, p in enumerate(plans):  # fold
        if p.fold_to is not None:
            assert plans[p.fold_to].fold_from == r
            have[p.fold_to] |= have[r]
    rounds = {len(p.partners) for p in plans if p.fold_to is None}
    assert len(rounds) == 1
    for k in range(rounds.pop()):
        snapshot = [set(h) for h in have]
        for r, p in enumerate(plans):
            if p.fold_to is None:
                q = p.partners[k]
                assert plans[q].partners[k] == r  # pairwise
                have[r] |= snapshot[q]
    for r, p in enumerate(plans):  # unfold
        if p.unfold_to is not None:
            have[p.unfold_to] = set(have[r])
    assert all(h == set(range(n)) for h in have)


@given(sizes, st.data())
def test_binomial_tree_is_a_spanning_tree_with_matching_edges(n: int, data: st.DataObject) -> None:
    root = data.draw(st.integers(0, n - 1))
    nodes = [binomial_tree(n, root, r) for r in range(n)]
    assert nodes[root].parent is None
    assert sum(p.parent is None for p in nodes) == 1
    for r, p in enumerate(nodes):
        for c in p.children:
            assert nodes[c].parent == r
        if p.parent is not None:
            assert r in nodes[p.parent].children
    # broadcast reaches everyone, each once; depth is ceil(log2 n)
    reached, frontier, depth = Counter([root]), [root], 0
    while frontier:
        frontier = [c for r in frontier for c in nodes[r].children]
        reached.update(frontier)
        depth += bool(frontier)
    assert reached == Counter(range(n))
    assert depth <= (n - 1).bit_length()  # rounds: ceil(log2 n), the tree is no deeper
