"""Heartbeat round-trip times, pure: no I/O, times come in as arguments.

Why from heartbeats: every heartbeat (``HB``) is already answered by an ``HB_ACK`` echoing its
sequence number, so the time from sending one to its echo is a round trip measured with no
extra message and no new wire field (old peers echo the same way). A peer's loop that is busy
delays its echo too: the RTT is what a request to that peer costs now, which is what an
operator watching ``/metrics`` wants to see next to phi.

The smoothed value follows TCP's SRTT (RFC 6298: ``srtt += (sample - srtt) / 8``), so one slow
echo moves it, but a burst of them is needed to shift it far.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_OUTSTANDING = 8  # heartbeats per peer awaiting their echo (older ones are given up on)
GAIN = 0.125  # RFC 6298 alpha


@dataclass(slots=True)
class PeerRtt:
    """One peer's round trips: the last sample, the smoothed value and how many were seen."""

    last: float = 0.0
    smoothed: float = 0.0
    samples: int = 0


class RttEstimator:
    """Matches heartbeat echoes to the heartbeats they answer, per peer.

    :meth:`sent` records a heartbeat's sequence number and send time; :meth:`echoed` with the
    echoed number returns the round trip (or None for an echo of a heartbeat never recorded,
    given up on, or already answered). At most :data:`MAX_OUTSTANDING` heartbeats per peer are
    remembered, so a peer that never answers costs a bounded amount of memory.
    """

    __slots__ = ("_outstanding", "peers")

    def __init__(self) -> None:
        self._outstanding: dict[str, dict[int, float]] = {}
        self.peers: dict[str, PeerRtt] = {}

    def sent(self, peer: str, seq: int, now: float) -> None:
        out = self._outstanding.get(peer)
        if out is None:
            out = self._outstanding[peer] = {}
        out[seq] = now
        if len(out) > MAX_OUTSTANDING:
            del out[next(iter(out))]  # dicts keep insertion order: the oldest heartbeat

    def echoed(self, peer: str, seq: int, now: float) -> float | None:
        out = self._outstanding.get(peer)
        t = out.pop(seq, None) if out else None
        if t is None or now < t:
            return None
        sample = now - t
        r = self.peers.get(peer)
        if r is None:
            r = self.peers[peer] = PeerRtt(sample, sample, 1)
        else:
            r.last = sample
            r.smoothed += GAIN * (sample - r.smoothed)
            r.samples += 1
        return sample

    def forget(self, peer: str) -> None:
        """Stop tracking ``peer`` (no longer watched): its series leaves ``/metrics``."""
        self._outstanding.pop(peer, None)
        self.peers.pop(peer, None)

    def smoothed(self) -> dict[str, float]:
        """peer -> smoothed RTT in seconds, for peers with at least one sample."""
        return {p: r.smoothed for p, r in self.peers.items()}


__all__ = ["GAIN", "MAX_OUTSTANDING", "PeerRtt", "RttEstimator"]
