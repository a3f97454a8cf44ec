"""Receive-into: large frames a local consumer already holds the final place for.

A ring collective knows, before a segment arrives, exactly where it belongs in its result
array. Receiving it into a fresh buffer and copying it over costs a pass over memory per byte
(about a tenth of a rank's CPU in the allreduce profile). Here a consumer registers
``(peer, channel, key) -> buffer``; each connection's frame decoder asks, as a large frame
starts, whether the message it belongs to (read from its header by
:func:`aionet.codecs.peek.peek_send_array`) is one of them, and if the sizes agree exactly the
kernel writes the frame straight into that buffer. Everything else (no registration, another
size, another key, a malformed header) takes the usual path, so the consumer must check what it
got (the delivered array then aliases its buffer) and copy when it does not.

A registration is consumed by the first frame that matches it. :meth:`forget` removes one not
used yet, and redirects a frame still being received into it to a private buffer, so after
``forget`` returns nothing more lands in the consumer's memory (a collective that failed or
timed out hands the caller's array back untouched from then on).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..codecs.peek import peek_send_array

Key = tuple[Any, ...]


class ReceiveTargets:
    """Per node: where expected large frames should land (the ``ReceiveInto`` port)."""

    __slots__ = ("_inflight", "_want", "hits")

    def __init__(self) -> None:
        # peer -> {(channel, key): buffer}; empty dicts are removed so a peer with none costs one lookup
        self._want: dict[str, dict[tuple[str, Key], Any]] = {}
        # (peer, channel, key) -> (connection, buffer) for frames handed to a decoder
        self._inflight: dict[tuple[str, str, Key], tuple[Any, Any]] = {}
        self.hits = 0  # frames received into a registered buffer (tests, benchmarks)

    def expect(self, peer: str, channel: str, key: Key, buf: Any) -> None:
        """The next large frame from ``peer`` on ``channel`` whose payload is ``[*key, array]``
        and whose size is exactly ``buf``'s goes into ``buf`` (writable, contiguous)."""
        self._want.setdefault(peer, {})[(channel, key)] = buf

    def forget(self, peer: str, channel: str, keys: Iterable[Key]) -> None:
        """Drop these registrations; a frame still arriving into one continues elsewhere."""
        want = self._want.get(peer)
        for key in keys:
            if want is not None:
                want.pop((channel, key), None)
            got = self._inflight.pop((peer, channel, key), None)
            if got is not None:
                conn, buf = got
                conn.release_frame_target(buf)
        if want is not None and not want:
            del self._want[peer]

    def pending(self) -> int:
        """Registrations not consumed yet plus frames handed out and not forgotten (tests)."""
        return sum(map(len, self._want.values())) + len(self._inflight)

    def attach(self, peer: str, conn: Any) -> None:
        """Let ``conn`` (from ``peer``) receive into registered buffers, if its transport can."""
        setter = getattr(conn, "set_frame_target", None)
        if setter is None:
            return  # inproc, zmq, ucx...: frames arrive as the transport gives them; consumers copy
        wanted = self._want
        inflight = self._inflight

        def target(header: Any, index: int, n: int) -> Any:
            want = wanted.get(peer)
            if not want:
                return None
            found = peek_send_array(header, index)
            if found is None:
                return None
            buf = want.get(found)
            if buf is None or memoryview(buf).nbytes != n:
                return None  # not expected, or not this size: the usual buffer, the consumer copies
            del want[found]
            if not want:
                del wanted[peer]
            inflight[(peer, *found)] = (conn, buf)
            self.hits += 1
            return buf

        setter(target)


__all__ = ["ReceiveTargets"]
