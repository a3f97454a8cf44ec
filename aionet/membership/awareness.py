"""Local health, pure (Lifeguard's "awareness"): how much to distrust our own judgement.

Why: when this node's own loop is starved (a busy host, long handlers) its probes and the
answers to them run late, and a healthy peer would look dead. Recurring stalls of ours, or
the ones a member reports about itself, buy that member more time before a verdict. A single
stall (a node frozen once, then resumed) does not: it would only slow down real detections.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from .detector import LagClock

STALL_WARNING = 0.5  # s: log when this node's own loop was blocked this long
STALL_SAMPLES = 10  # per-load-interval stall maxima remembered


def verify_timeout(probe_timeout: float, recent_stall: float) -> float:
    """How long a verification round waits when stalls of ``recent_stall`` s keep happening:
    1.5x that on top of ``probe_timeout``, at most twice ``probe_timeout`` in all."""
    return probe_timeout + min(probe_timeout, 1.5 * max(recent_stall, 0.0))


def recurring_stall(samples: Iterable[float]) -> float:
    """The second-worst of recent per-second stall maxima: stalls that recur (a starved host)
    count, a single one (a node that was frozen once, then resumed) does not."""
    worst = sorted(samples, reverse=True)
    return worst[1] if len(worst) > 1 else 0.0


class Awareness:
    """Our own loop's recent stalls, sampled from a :class:`LagClock` once per load report."""

    def __init__(self, clock: LagClock, samples: int = STALL_SAMPLES) -> None:
        self.clock = clock
        self._stalls: deque[float] = deque(maxlen=samples)

    def sample_stall_ms(self) -> float:
        """Close a sampling period; the recurring stall of the last few periods, in ms (this is
        what our load reports tell peers)."""
        self._stalls.append(self.clock.reset_max())
        return recurring_stall(self._stalls) * 1000.0

    def probe_timeout(self, base: float, their_stall_ms: float) -> float:
        """More patience when a silence is likely starvation rather than death: the member
        recently reported its own loop stalling, or ours did. An idle node that freezes is
        judged at the plain ``base`` timeout."""
        ours = recurring_stall([self.clock.max_lag, *self._stalls])
        return verify_timeout(base, max(their_stall_ms / 1000.0, ours))


__all__ = ["STALL_WARNING", "Awareness", "recurring_stall", "verify_timeout"]
