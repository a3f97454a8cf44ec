"""The distributed cache: versioned values spread over the nodes, compare-and-set, watches,
and leases with fencing tokens (``node.cache``, ``node.lock``). See docs/cache.md."""

from .api import Cache, CacheRef, Change, Lease, LockContext, WatchStream, cache_ref
from .errors import CacheError, CacheFull, LockLost, StaleFenceError
from .locks import LeaseTable
from .placement import Placement
from .store import Store

__all__ = [
    "Cache",
    "CacheError",
    "CacheFull",
    "CacheRef",
    "Change",
    "Lease",
    "LeaseTable",
    "LockContext",
    "LockLost",
    "Placement",
    "StaleFenceError",
    "Store",
    "WatchStream",
    "cache_ref",
]
