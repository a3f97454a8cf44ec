"""The sender's memory stays bounded when its peer reads nothing (fast version of
``benchmarks/backpressure_rss.py``: same processes, same assertion, smaller sizes)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "backpressure_rss.py"
MiB = 2**20
MAX_INFLIGHT_MIB = 16
SLACK = 64 * MiB


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bp") / "bp.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--plain", "--json", str(out), "--total-gib", "1", "--chunk-kib", "256",
         "--max-inflight-mib", str(MAX_INFLIGHT_MIB), "--duration", "2.5", "--mode", "nodrain,sigstop,partition",
         "--slow-detector"],  # a loaded CI box must not turn this into a failure-detector test
        capture_output=True, text=True, timeout=240, cwd=REPO, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    data["stdout"] = proc.stdout
    return data


@pytest.mark.parametrize("mode", ["nodrain", "sigstop", "partition"])
def test_sender_rss_bounded_by_inflight_window(results, mode):
    res = results["results"][f"{mode}/256KiB"]
    assert not res.get("failed"), res
    assert res["error"] is None, res["error"]  # blocked, not failed
    assert not res["finished"], "the sender got everything out: the receiver was not stuck"
    assert res["blocked_for_s"] > 1.0, "the last send() should have been blocked for most of the run"
    assert res["max_inflight_bytes"] == MAX_INFLIGHT_MIB * MiB
    assert res["peak_increase"] < res["max_inflight_bytes"] + SLACK, results["stdout"]


def test_partition_fills_the_window_then_blocks(results):
    """While disconnected, only the link's replay buffer holds messages: it must fill to
    max_inflight_bytes (so the test above measured something) and stop there."""
    res = results["results"]["partition/256KiB"]
    window = MAX_INFLIGHT_MIB * MiB
    assert res["sent_bytes"] >= window * 0.9
    assert res["sent_bytes"] <= window + 32 * MiB  # delivered before the cut + one message over
    assert results["pass"], results["stdout"]
