"""What collectives put on the wire: ``[seq, tag, src_rank, payload]`` on the group's channel.

The channel is ``aionet.coll/<group name>#<epoch>.<digest of the member list>``: a shrunk group
(new epoch) and groups whose member lists disagree never read each other's messages. The tag
is one int (msgpack-cheap, hashable) that names the message within one call and the call it
belongs to. Its bits, most significant first::

    kind 4 | op 4 | algorithm 3 | bucket 8 | phase 5 | step 20 | segment 20      (64 bits)

``kind``, ``op`` and ``algorithm`` are the call's *signature* (:func:`signature`): which
collective, which reduction and which resolved algorithm (the one that sets the message
pattern; ``auto`` resolved, so two ranks that resolve alike agree). A rooted call (broadcast,
reduce, gather, scatter) puts its root in ``step``, which those calls use for nothing else. The
rest names the message: the fused bucket (one per dtype of a listed allreduce), the
algorithm's phase, its step and the segment of a pipelined chunk. A message whose signature
(and root) differs from the receiving rank's call at that sequence number is a mismatch
(:func:`matches`): ranks that call different collectives, ops, algorithms or roots fail
instead of waiting for tags that never come or reducing garbage.

A call that fails on one rank for a reason of its own (arguments that disagree with the other
ranks', a mismatched signature, a cancelled call, a timeout) sends every other member ``[seq,
ABORT, src, [what, reason, breaks]]``, so their matching call raises instead of waiting for
messages that will never come (``breaks``: the sender's group broke, so the receiver's breaks
too and every member shrinks).
"""

from __future__ import annotations

CHANNEL_PREFIX = "aionet.coll/"

Tag = int

SEGMENT_BITS = STEP_BITS = 20
STEP_SHIFT = SEGMENT_BITS
PHASE_SHIFT = STEP_SHIFT + STEP_BITS  # 40
BUCKET_SHIFT = PHASE_SHIFT + 5  # 45
SIG_SHIFT = BUCKET_SHIFT + 8  # 53: algorithm 3 bits, op 4, kind 4 (up to bit 63)
STEP_MASK = ((1 << STEP_BITS) - 1) << STEP_SHIFT
BUCKET_MASK = 0xFF << BUCKET_SHIFT
SIG_MASK = ((1 << 11) - 1) << SIG_SHIFT

#: the collectives, by signature code (0: none, the ABORT's); the rooted ones carry their root
KINDS = ("", "allreduce", "reduce", "reduce_scatter", "broadcast", "allgather", "gather", "scatter",
         "alltoall", "barrier")  # fmt: skip
ROOTED = frozenset({"reduce", "broadcast", "gather", "scatter"})
REDUCING = frozenset({"allreduce", "reduce", "reduce_scatter"})  # the kinds whose op is compared
SIG_OPS = ("", "sum", "mean", "prod", "min", "max")  # ops.OPS's names, by code
SIG_ALGORITHMS = ("", "ring", "doubling", "direct", "tree", "native")  # resolved algorithms, by code


def tag(bucket: int, phase: int, step: int, segment: int = 0) -> Tag:
    """The message bits of a tag (8 bits of bucket, 5 of phase, 20 of step, 20 of segment);
    a call ORs its :func:`signature` in."""
    if not (0 <= bucket < 1 << 8 and 0 <= phase < 1 << 5 and 0 <= step < 1 << STEP_BITS and 0 <= segment < 1 << 20):
        raise ValueError("collective tag out of range (too many buckets, ranks, steps or segments)")
    return (bucket << BUCKET_SHIFT) | (phase << PHASE_SHIFT) | (step << STEP_SHIFT) | segment


def signature(kind: str, op: str = "", algorithm: str = "", root: int = 0) -> Tag:
    """The bits that name a call (OR'd into each of its tags): its kind, its op where the kind
    reduces, its resolved algorithm where it has a choice, its root where it has one."""
    code = (KINDS.index(kind) << 7) | (SIG_OPS.index(op if kind in REDUCING else "") << 3)
    code |= SIG_ALGORITHMS.index(algorithm)
    if kind in ROOTED:
        if not 0 <= root < 1 << STEP_BITS:
            raise ValueError("collective root out of range")
        return (code << SIG_SHIFT) | (root << STEP_SHIFT)
    return code << SIG_SHIFT


def call_mask(kind: str) -> Tag:
    """The bits of a tag that must equal the receiving call's (:func:`matches`)."""
    return SIG_MASK | BUCKET_MASK | (STEP_MASK if kind in ROOTED else 0)


def matches(t: Tag, mask: Tag, allowed: tuple[Tag, ...]) -> bool:
    """Whether a message tagged ``t`` belongs to a call that accepts ``allowed`` (its signature
    OR'd with each of its buckets) under ``mask`` (:func:`call_mask`). The group inlines it."""
    return t & mask in allowed


def describe(t: Tag) -> str:
    """The call a tag belongs to, as the user wrote it: ``allreduce(op='sum', algorithm='ring')``."""
    code = t >> SIG_SHIFT
    k, o, a = code >> 7, (code >> 3) & 0xF, code & 0x7
    kind = KINDS[k] if 0 < k < len(KINDS) else f"collective #{k}"
    args = []
    if o:
        args.append(f"op={SIG_OPS[o]!r}" if o < len(SIG_OPS) else f"op #{o}")
    if a:
        args.append(f"algorithm={SIG_ALGORITHMS[a]!r}" if a < len(SIG_ALGORITHMS) else f"algorithm #{a}")
    if kind in ROOTED:
        args.append(f"root={(t & STEP_MASK) >> STEP_SHIFT}")
    return f"{kind}({', '.join(args)})"


def bucket_of(t: Tag) -> int:
    return (t & BUCKET_MASK) >> BUCKET_SHIFT


ABORT: Tag = tag(0, 31, 0)  # phase 31 and no signature: a call failed on the sender (see above)
PROBE: Tag = tag(0, 30, 0)  # a call that waits long asks what the receiver calls at its number

__all__ = [
    "ABORT",
    "BUCKET_MASK",
    "BUCKET_SHIFT",
    "CHANNEL_PREFIX",
    "KINDS",
    "PHASE_SHIFT",
    "PROBE",
    "REDUCING",
    "ROOTED",
    "SIG_ALGORITHMS",
    "SIG_MASK",
    "SIG_OPS",
    "STEP_MASK",
    "STEP_SHIFT",
    "Tag",
    "bucket_of",
    "call_mask",
    "describe",
    "matches",
    "signature",
    "tag",
]
