"""What collectives put on the wire: ``[seq, tag, src_rank, payload]`` on the group's channel.

The channel is ``aionet.coll/<group name>#<epoch>.<digest of the member list>``: a shrunk group
(new epoch) and groups whose member lists disagree never read each other's messages. The tag
names the message within one call: the fused bucket, the algorithm's phase, its step and the
segment of a pipelined chunk.

A call that fails on one rank for a reason of its own (arguments that disagree with the other
ranks', a cancelled call, a timeout) sends every other member ``[seq, ABORT, src, [what, reason,
breaks]]``, so their matching call raises instead of waiting for messages that will never come
(``breaks``: the sender's group broke, so the receiver's breaks too and every member shrinks).
"""

from __future__ import annotations

CHANNEL_PREFIX = "aionet.coll/"

Tag = int


def tag(bucket: int, phase: int, step: int, segment: int = 0) -> Tag:
    """One int (msgpack-cheap, hashable): 16 bits of bucket, 8 of phase, 20 of step, 20 of segment."""
    if not (0 <= bucket < 1 << 16 and 0 <= phase < 1 << 8 and 0 <= step < 1 << 20 and 0 <= segment < 1 << 20):
        raise ValueError("collective tag out of range (too many buckets, steps or segments)")
    return (bucket << 48) | (phase << 40) | (step << 20) | segment


ABORT: Tag = tag(0, 255, 0)  # phase 255: a call failed on the sender (see the module docstring)

__all__ = ["ABORT", "CHANNEL_PREFIX", "Tag", "tag"]
