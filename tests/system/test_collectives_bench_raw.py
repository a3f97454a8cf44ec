"""The raw-socket ring allreduce of benchmarks/collectives.py (the yardstick issue 19's busbw bar is
judged against): every rank's result is the exact sum, out of place and in place, for sizes that
split unevenly into chunks and segments."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("n", [2, 3])
def test_raw_ring_allreduce_is_exact(n: int) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import collectives
    finally:
        sys.path.remove(str(BENCH))
    sizes = [8, (1 << 20) + 12]  # 1 MiB + 3 floats: chunks of unequal length, several 64 KiB segments each
    t0 = time.monotonic()
    res = collectives.run_raw(n, sizes, iters=3, timeout=60.0, segments="64K", sockbuf="0")
    assert time.monotonic() - t0 < 60
    assert [(r["bytes"], r["algorithm"]) for r in res] == [
        (nbytes, f"ring+{variant} 64K") for nbytes in sizes for variant in ("out", "inplace")
    ]
    for r in res:
        assert r["wrong"] == 0, r  # elements differing from n (every rank contributes ones) on any rank
        assert len(r["times"]) >= 3 and all(t > 0 for t in r["times"])
        assert r["cpu"] > 0
