"""What the ranks of a world get when they fill the cores of the one host they share (pure).

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
"""

from __future__ import annotations

from typing import Any

__all__ = ["PIPELINE_VAR", "shared_cores_config", "shared_cores_settings"]

PIPELINE_VAR = "AIONET_COLLECTIVES_PIPELINE_SEGMENTS"


def _crowded(ranks: int, cores: int) -> bool:
    return cores > 0 and ranks >= cores


def shared_cores_settings(ranks: int, cores: int) -> dict[str, str]:
    """The ``AIONET_`` variables for ``ranks`` ranks on one host with ``cores`` cores: whole ring
    chunks when the ranks fill or outnumber the cores, nothing otherwise."""
    return {PIPELINE_VAR: "1"} if _crowded(ranks, cores) else {}


def shared_cores_config(ranks: int, cores: int) -> dict[str, dict[str, Any]]:
    """The same decision as a config mapping (``{"collectives": {"pipeline_segments": 1}}`` or
    empty), for a launched world's implied settings."""
    return {"collectives": {"pipeline_segments": 1}} if _crowded(ranks, cores) else {}
