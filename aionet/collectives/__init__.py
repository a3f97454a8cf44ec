"""Collectives over process groups: ``grp = node.group()``, then ``await grp.allreduce(x)``."""

from .algorithms import binomial_tree, chunk_bounds, recursive_doubling, ring_allgather, ring_reduce_scatter
from .aligned import empty_aligned, empty_like_aligned, is_aligned
from .group import ALGORITHMS, Group
from .service import Collectives

__all__ = [
    "ALGORITHMS",
    "Collectives",
    "Group",
    "binomial_tree",
    "chunk_bounds",
    "empty_aligned",
    "empty_like_aligned",
    "is_aligned",
    "recursive_doubling",
    "ring_allgather",
    "ring_reduce_scatter",
]
