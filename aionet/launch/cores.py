"""What the ranks of a world get when they fill or outnumber a host's cores (pure).

On one host a ring collective's "transfer" is kernel copies that the ranks' own cores make, in
their send and receive calls: with every core running a rank there is nothing for one ring
piece's reduction to overlap with, and each extra piece costs Python, syscalls and wake-ups at
both ends. Whole chunks (``collectives.pipeline_segments = 1``) measured less CPU per byte and a
higher busbw with 4 ranks on 2 cores (16 MiB: 15-30 % less CPU) and with 2 ranks on 2 cores
(16 MiB: about 12 % less CPU, busbw 1.35-1.42 against 1.26-1.30 GB/s; BENCHMARKS.md). Across hosts the
NIC moves the bytes while the CPU reduces, which is what the default's two pieces are for.

The setting must be equal on every rank (it decides how the ring cuts its messages), so it is
decided from what every rank of the world sees alike: its size and the host's core count, by
the launcher that starts every rank (``aionet launch``, ``aionet bench``) or from the variables
of ``mpirun``, ``srun`` and ``torchrun`` when the whole world runs on one host.

With more ranks on a host than it has cores, busy polling is also turned off
(``node.busy_poll_us = 0``). A rank that spins while it waits holds a core that a peer it waits
for needs; ``sched_yield`` in the spin does not reliably hand the core over. With 4 ranks on 2
cores, off measured 10-20 % less CPU per call and a lower 8-byte allreduce latency in 11 of 15
alternated pairs (median 1.11 against 1.36 ms), and no loss of busbw (BENCHMARKS.md). Where
every rank has a core of its own (ranks = cores), polling keeps its point: no wake-up per
message. This one is per node, so it follows the ranks on the host, whether or not the world
spans hosts.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BUSY_POLL_VAR", "PIPELINE_VAR", "shared_cores_config", "shared_cores_settings"]

PIPELINE_VAR = "AIONET_COLLECTIVES_PIPELINE_SEGMENTS"
BUSY_POLL_VAR = "AIONET_NODE_BUSY_POLL_US"


def _crowded(ranks: int, cores: int) -> bool:
    """Every core runs a rank: whole ring chunks."""
    return cores > 0 and ranks >= cores


def _oversubscribed(ranks: int, cores: int) -> bool:
    """Ranks wait for cores: no busy polling."""
    return cores > 0 and ranks > cores


def shared_cores_settings(ranks: int, cores: int) -> dict[str, str]:
    """The ``AIONET_`` variables for a world of ``ranks`` ranks on one host with ``cores`` cores:
    whole ring chunks when the ranks fill or outnumber the cores, and no busy polling when they
    outnumber them; nothing otherwise."""
    out = {PIPELINE_VAR: "1"} if _crowded(ranks, cores) else {}
    if _oversubscribed(ranks, cores):
        out[BUSY_POLL_VAR] = "0"
    return out


def shared_cores_config(ranks: int, cores: int, local_ranks: int | None = None) -> dict[str, dict[str, Any]]:
    """The same decisions as a config mapping, for a launched world's implied settings:
    ``{"collectives": {"pipeline_segments": 1}}`` for a world of ``ranks`` on one host that fills
    its cores, ``{"node": {"busy_poll_us": 0}}`` where the ``local_ranks`` on this host (default:
    the whole world, on this host) outnumber its cores. ``local_ranks`` smaller than ``ranks``: the
    world spans hosts, and the ring's chunks keep the default."""
    local = ranks if local_ranks is None else local_ranks
    out: dict[str, dict[str, Any]] = {}
    if local == ranks and _crowded(ranks, cores):
        out["collectives"] = {"pipeline_segments": 1}
    if _oversubscribed(local, cores):
        out["node"] = {"busy_poll_us": 0}
    return out
