"""The size limits a link's messages must pass: this node's ``[limits]`` and the peer's.

A receiver drops a connection on a message over its limits, so a sender checks the binding
(smaller) value of each before a message takes its place in the stream: one that can never be
delivered fails its own send, with an error naming whose limit to raise. The peer advertises
its values in the handshake (feature ``limits``)."""

from __future__ import annotations

from typing import Any

from ..codecs.framing import frame_nbytes
from ..errors import FrameTooLarge, TooManyFrames

# [limits] keys that bound what a receiver accepts; a peer advertises its values in its
# handshake (features["limits"]) so a sender fails such a message at once (see Link.post)
SIZE_LIMITS = ("max_message_bytes", "max_frame_bytes", "max_header_bytes", "max_frames")


class SizeLimits:
    """This node's and one peer's size limits. ``size_ok`` and ``max_frames`` are the one-compare
    test of the hot path (a message within both passes every limit); :meth:`check` says which
    limit a message breaks."""

    __slots__ = ("_own", "_peer", "max_frames", "peer_name", "size_ok")

    def __init__(self, own: dict[str, int], peer_name: str) -> None:
        self._own = own
        self._peer: dict[str, int] = {}
        self.peer_name = peer_name
        self.size_ok = 0  # single-frame messages up to this size pass every limit
        self.max_frames = 0
        self._update()

    def set_peer(self, limits: Any) -> None:
        """The peer's advertised [limits]; malformed values are ignored."""
        if not isinstance(limits, dict):
            return
        for k in SIZE_LIMITS:
            v = limits.get(k)
            if type(v) is int and v > 0:
                self._peer[k] = v
        self._update()

    def _update(self) -> None:
        own, peer = self._own, self._peer
        lim = {k: min(own[k], peer.get(k, own[k])) for k in SIZE_LIMITS}
        self.size_ok = min(lim["max_message_bytes"], lim["max_header_bytes"], lim["max_frame_bytes"])
        self.max_frames = lim["max_frames"]

    def binding(self, key: str) -> tuple[int, str]:
        """The binding value of ``[limits] key`` and whose it is, for the error text."""
        own = self._own[key]
        theirs = self._peer.get(key, own)
        if theirs < own:
            return theirs, f"limits.{key} = {theirs} of peer {self.peer_name!r} (raise it in that node's [limits])"
        return own, f"limits.{key} = {own} of this node (raise it in [limits] here and on the peer)"

    def check(self, frames: list[Any], nbytes: int, raw_max: int = 0) -> None:
        """Raise for the first limit the message breaks. ``nbytes`` and ``raw_max`` (largest
        compressed frame, inflated) are the sizes the receiver will see."""
        peer = self.peer_name
        limit, what = self.binding("max_frames")
        if len(frames) > limit:
            raise TooManyFrames(f"message to {peer!r} has {len(frames)} buffers, over {what}")
        limit, what = self.binding("max_message_bytes")
        if nbytes > limit:
            raise FrameTooLarge(
                f"message to {peer!r} has {nbytes} bytes, over {what}; or send the data in smaller pieces"
            )
        for i, f in enumerate(frames):
            n = frame_nbytes(f)
            limit, what = self.binding("max_header_bytes" if i == 0 else "max_frame_bytes")
            if n > limit:
                which = "its header" if i == 0 else f"buffer {i}"
                raise FrameTooLarge(f"message to {peer!r}: {which} has {n} bytes, over {what}")
        limit, what = self.binding("max_frame_bytes")
        if raw_max > limit:
            raise FrameTooLarge(f"message to {peer!r}: a buffer has {raw_max} bytes uncompressed, over {what}")


__all__ = ["SIZE_LIMITS", "SizeLimits"]
