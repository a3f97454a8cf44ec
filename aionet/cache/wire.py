"""Cache message layouts and service names. Data only: changing anything here changes the
wire format.

Requests (``Messaging.request``) to a key's primary::

    SVC_WRITE  [op, key, value, expect, ttl, pin, fence, hops]  -> version (0: cas lost / nothing deleted)
    SVC_PUT    [key, value]                                 -> version  (SVC_WRITE of a put with no ttl, pin or
                                                               fence, hops = MAX_HOPS: the common write, smaller)
    SVC_READ   key                                          -> [version, value] ([0, None]: absent; [-1, None]:
                                                               ask SVC_READ_SLOW, which may forward or pull)
    SVC_READ_SLOW [key, hops]                               -> [version, value] ([0, None]: absent)
    SVC_PEEK   [key]                                        -> entry record | None  (no forwarding)
    SVC_CLAIM  [key, requester, wait, hops]                 -> [version, value] | [0, LOAD] | [0, WAIT]
    SVC_UNCLAIM [key, requester]                            -> None
    SVC_LOCK   [op, name, owner, token, ttl, wait, hops]    -> acquire: [token, ttl] | [0, s until free]; else bool
    SVC_REPL   [[entry record, ...], [lock record, ...]]    -> None (sync handler: applied in arrival order)
    SVC_WATCH  [watcher, prefix, on]                        -> None

An entry record: ``[key, version, value, ttl left | -1, pinned, fences, deleted]``.
A lock record: ``[name, highest token, owner | "", ttl left | -1]``.
Watch changes go with ``Messaging.send`` on channel ``CHANNEL`` as ``[[key, version, op, value], ...]``.
"""

from __future__ import annotations

SVC_WRITE = "aionet.cache.write"
SVC_PUT = "aionet.cache.put"  # inline handler: the common put, answered inline at the primary
SVC_READ = "aionet.cache.read"  # sync handler: answered inline, no task per request
SVC_READ_SLOW = "aionet.cache.read_slow"
SVC_PEEK = "aionet.cache.peek"
SVC_CLAIM = "aionet.cache.claim"
SVC_UNCLAIM = "aionet.cache.unclaim"
SVC_LOCK = "aionet.cache.lock"
SVC_REPL = "aionet.cache.repl"
SVC_WATCH = "aionet.cache.watch"
CHANNEL = "aionet.cache.changes"

OP_PUT, OP_CAS, OP_DEL = 1, 2, 3
OP_NAMES = {OP_PUT: "put", OP_CAS: "put", OP_DEL: "delete"}
LOCK_ACQUIRE, LOCK_RENEW, LOCK_RELEASE, LOCK_VALID = 1, 2, 3, 4

LOAD = "load"  # claim reply: the requester runs the loader
WAIT = "wait"  # claim reply: someone else is loading; ask again

LOCK_PREFIX = "\x00lock\x00"  # a lock's placement key is LOCK_PREFIX + name (user keys cannot start with NUL)
MAX_HOPS = 1  # a request that reaches a node that is not the primary is forwarded this often at most
REPL_BATCH = 512  # entry records per replication request when moving keys

__all__ = [
    "CHANNEL",
    "LOAD",
    "LOCK_ACQUIRE",
    "LOCK_PREFIX",
    "LOCK_RELEASE",
    "LOCK_RENEW",
    "LOCK_VALID",
    "MAX_HOPS",
    "OP_CAS",
    "OP_DEL",
    "OP_NAMES",
    "OP_PUT",
    "REPL_BATCH",
    "SVC_CLAIM",
    "SVC_LOCK",
    "SVC_PEEK",
    "SVC_PUT",
    "SVC_READ",
    "SVC_READ_SLOW",
    "SVC_REPL",
    "SVC_UNCLAIM",
    "SVC_WATCH",
    "SVC_WRITE",
    "WAIT",
]
