"""The periodic suspicion check, pure: whom to verify, whom to tell, whom to forget.

Why apart from the driver (decide, then do the I/O): the check used to start verifications
while it walked the table. Here it only reads the detectors and records and returns what to
do; the service performs it afterwards, and tests feed it records and times.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass

from .detector import PhiAccrualDetector
from .table import DEAD, LEFT, SUSPECT, Member, StartVerify


@dataclass(frozen=True)
class Notify:
    """It answers us but is gossiped as suspect (or dead): tell it, so it can refute."""

    name: str


@dataclass(frozen=True)
class Forget:
    """Dead or left long enough ago: drop the record."""

    name: str


@dataclass(frozen=True)
class CheckConfig:
    phi_threshold: float
    interval: float
    suspect_timeout: float
    forget_after: float

    @property
    def cooldown(self) -> float:
        """After a probe found a member alive, how long before silence may start another."""
        return max(1.0, 5 * self.interval)


def check(
    members: Mapping[str, Member],
    detectors: Mapping[str, PhiAccrualDetector],
    verifying: Container[str],
    cfg: CheckConfig,
    *,
    now: float,
    real_now: float,
) -> tuple[list[StartVerify | Notify | Forget], float]:
    """-> (actions in order, the highest phi seen). ``now`` is the lag-adjusted clock (what
    detectors and suspicion timers run on), ``real_now`` the real one (records' ``since`` and
    ``last_seen``)."""
    out: list[StartVerify | Notify | Forget] = []
    starting: set[str] = set()
    max_phi = 0.0
    for name, det in detectors.items():
        m = members.get(name)
        if m is None or m.state in (DEAD, LEFT) or name in verifying:
            continue
        phi = det.phi(now)
        max_phi = max(max_phi, phi)
        # after a probe found it alive, give it a cooldown unless it answers heartbeats again
        if phi >= cfg.phi_threshold and (now - m.verified_at >= cfg.cooldown or det.last > m.verified_at):
            starting.add(name)
            out.append(StartVerify(name, f"no heartbeat reply for {det.elapsed(now):.2f} s (phi {phi:.1f})"))
    for m in members.values():
        if m.state == SUSPECT and m.name not in verifying and m.name not in starting:
            if m.last_seen is not None and real_now - m.last_seen < 2 * cfg.interval:
                out.append(Notify(m.name))  # it answers us: make sure it knows so it can refute
            elif now - m.suspect_at >= cfg.suspect_timeout and now - m.verified_at >= cfg.cooldown:
                out.append(StartVerify(m.name, f"suspected for {cfg.suspect_timeout} s without refuting"))
        elif m.state in (DEAD, LEFT) and real_now - m.since > cfg.forget_after:
            out.append(Forget(m.name))
    return out, max_phi


__all__ = ["CheckConfig", "Forget", "Notify", "check"]
