"""Many SEND payloads, or many requests or replies, in one envelope (sans-I/O).

A SEND envelope is ``[SEND, seq, ack, channel, payload, *more payloads]``: to a peer that
advertises the handshake feature ``"batch"``, a link coalesces the small messages queued for
one channel within one event-loop iteration into one envelope, so they share one sequence
number, one frame, one write and one decode. Each payload is packed once, when it is sent
(so errors surface at the call), and the envelope is assembled from the packed bytes: a
msgpack array header for ``4 + n`` items, then the four packed envelope fields, then the
payloads. The result is ordinary msgpack that the receiver decodes with one ``unpackb``.

Requests and replies batch the same way, to a peer that advertises ``"rpc_batch"``: a REQ
envelope ``[REQ, seq, ack, rid, service, payload]`` may carry more ``rid, service, payload``
triples after the first, a REP envelope ``[REP, seq, ack, rid, payload]`` more ``rid,
payload`` pairs. One request (or reply) is exactly the envelope an older node sends, so the
format only extends the single one; ERR envelopes always carry one error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .envelope import REP, REQ, SEND

#: handshake feature: the most payloads this node accepts in one SEND envelope (absent: one)
FEATURE = "batch"
#: handshake feature: the most requests this node accepts in one REQ envelope (its
#: ``link.max_concurrent_requests``: more could not start at once); a node advertising it also
#: accepts REP envelopes with many replies. Absent: one request or reply per envelope.
RPC_FEATURE = "rpc_batch"
# how many more requests than "rpc_batch" a node lets wait for a handler slot without stopping
# to read from their caller (a caller keeps its unanswered requests to the sum)
RPC_WAIT_FEATURE = "rpc_wait"
# the services this node answers inline on its reader (plain `def` handlers): they never take a
# handler slot here, so a caller need not count requests to them against the window above
RPC_INLINE_FEATURE = "rpc_inline"
RPC_INLINE_MAX = 256  # names advertised at most (any subset is safe: the rest are counted)
RPC_INLINE_NAME_MAX = 200  # longer names are left out (counted)
#: values each request / reply adds to its envelope: rid, service, payload / rid, payload
RPC_ITEM_FIELDS = {REQ: 3, REP: 2}


def array_header(n: int) -> bytes:
    """msgpack's header for an array of ``n`` items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    if n < 0x100000000:
        return b"\xdd" + n.to_bytes(4, "big")
    raise ValueError(f"a msgpack array holds at most 2**32 - 1 items, not {n}")


def encode_send_batch(pack: Callable[[Any], bytes], seq: int, ack: int, channel: str, packed: Sequence[bytes]) -> bytes:
    """``[kind, seq, ack, channel, *payloads]`` as one msgpack array, from payloads already
    packed (``packed``: one msgpack value each). ``pack`` packs the envelope fields."""
    return b"".join((array_header(4 + len(packed)), pack(SEND), pack(seq), pack(ack), pack(channel), *packed))


def encode_rpc_batch(pack: Callable[[Any], bytes], kind: int, seq: int, ack: int, packed: Sequence[bytes]) -> bytes:
    """``[kind, seq, ack, *items]`` (kind REQ or REP) as one msgpack array, from requests or
    replies already packed: each of ``packed`` is the msgpack values of one item's fields
    (``rid, service, payload`` or ``rid, payload``) back to back, without an array header."""
    n = RPC_ITEM_FIELDS[kind] * len(packed)
    return b"".join((array_header(3 + n), pack(kind), pack(seq), pack(ack), *packed))


def rpc_items(env: list[Any]) -> int:
    """How many requests (REQ) or replies (REP) a decoded envelope carries; ValueError when
    its length fits no whole number of them."""
    per = RPC_ITEM_FIELDS[env[0]]
    n, rest = divmod(len(env) - 3, per)
    if rest or n < 1:
        raise ValueError(f"envelope kind {env[0]} with {len(env)} fields is not a whole batch")
    return n


__all__ = [
    "FEATURE",
    "RPC_FEATURE",
    "RPC_INLINE_FEATURE",
    "RPC_INLINE_MAX",
    "RPC_INLINE_NAME_MAX",
    "RPC_ITEM_FIELDS",
    "RPC_WAIT_FEATURE",
    "array_header",
    "encode_rpc_batch",
    "encode_send_batch",
    "rpc_items",
]
