"""Collectives over process groups: ``grp = node.group()``, then ``await grp.allreduce(x)``."""

from .algorithms import binomial_tree, chunk_bounds, recursive_doubling, ring_allgather, ring_reduce_scatter
from .group import ALGORITHMS, Group
from .service import Collectives

__all__ = [
    "ALGORITHMS",
    "Collectives",
    "Group",
    "binomial_tree",
    "chunk_bounds",
    "recursive_doubling",
    "ring_allgather",
    "ring_reduce_scatter",
]
