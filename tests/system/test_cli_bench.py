"""``aionet bench``: real node processes, nccl-tests columns, #wrong checked, JSON for machines."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from aionet.cli.bench import parse_size, sizes_between


def run(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aionet", "bench", *args], capture_output=True, text=True, timeout=timeout
    )


def test_sizes() -> None:
    assert [parse_size(s) for s in ("8", "64K", "1M", "1MiB", "2G")] == [8, 65536, 1 << 20, 1 << 20, 2 << 30]
    assert sizes_between(8, 1 << 20, 8) == [8, 64, 512, 4096, 32768, 262144]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("op,nodes", [("allreduce", 3), ("allgather", 2), ("reduce_scatter", 2), ("broadcast", 2)])
def test_bench_json_rows_are_correct(op: str, nodes: int) -> None:
    out = run(
        op,
        "--nodes",
        str(nodes),
        "--min",
        "64",
        "--max",
        "256K",
        "--factor",
        "64",
        "--iters",
        "3",
        "--warmup",
        "1",
        "--json",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["size"] for r in rows] == [64, 4096, 262144]
    for r in rows:
        variants = ("out", "in") if op == "allreduce" else ("out",)
        for v in variants:
            assert r[v]["wrong"] == 0 and r[v]["time_us"] > 0 and r[v]["busbw"] >= 0
        assert r["op"] == op and r["nodes"] == nodes
    assert "never retrieved" not in out.stderr and "Traceback" not in out.stderr


@pytest.mark.timeout(60)
def test_bench_table_and_bad_arguments() -> None:
    out = run("allreduce", "--min", "8", "--max", "64", "--factor", "8", "--iters", "2", "--warmup", "0")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "#wrong" in out.stdout and "busbw" in out.stdout and "allreduce: 2 nodes" in out.stdout
    bad = run("allreduce", "--nodes", "1")
    assert bad.returncode != 0 and "--nodes >= 2" in bad.stderr
    bad = run("allreduce", "--max", "lots")
    assert bad.returncode != 0 and "not a size" in bad.stderr
