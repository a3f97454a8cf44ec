"""The ring's segments on the array short road (codecs/array_send.py) over real tcp://
connections: allreduce stays exact for every op, several dtypes, odd sizes and n = 2, 3, 4 with
the short road taken on both ends; a connection cut in the middle of an allreduce replays its
segments and the answer is still exact; a malformed segment header is a typed error, a log line
and a closed connection, and the link goes on afterwards."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
from structlog.testing import capture_logs

from aionet.codecs.envelope import SEND
from aionet.codecs.extensions import EXT_NDARRAY
from aionet.core import dispatch, link
from aionet.testing import cluster
from tests.conftest import wait_for
from tests.proxied_pair import proxied

pytestmark = pytest.mark.timeout(90)
CFG = {"collectives": {"small_bytes": 4096, "segment_bytes": 1 << 18}}  # 256 KiB segments: several per chunk


@contextlib.contextmanager
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Count the short road's messages on the sending link and the receiving dispatcher."""
    n = {"encoded": 0, "decoded": 0}
    enc, dec = link.encode_array_send, dispatch.decode_array_send

    def encoding(*a: Any) -> Any:
        out = enc(*a)
        n["encoded"] += out is not None
        return out

    def decoding(*a: Any) -> Any:
        out = dec(*a)
        n["decoded"] += out is not None
        return out

    monkeypatch.setattr(link, "encode_array_send", encoding)
    monkeypatch.setattr(dispatch, "decode_array_send", decoding)
    yield n


def inputs(n: int, size: int, dtype: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return [rng.integers(-40, 40, size).astype(dtype) for _ in range(n)]
    return [rng.standard_normal(size).astype(dtype) for _ in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4])
async def test_allreduce_is_exact_on_the_short_road(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    with counted(monkeypatch) as used:
        async with cluster(n, "tcp", config=CFG) as nodes:
            grps = [node.group() for node in nodes]
            cases = [("sum", "float32", (1 << 20) + 3), ("mean", "float64", 300_001), ("max", "int32", 700_003)]
            cases += [("sum", "int64", 262_147), ("min", "int8", (3 << 20) + 1)]
            for k, (op, dtype, size) in enumerate(cases):
                xs = inputs(n, size, dtype, k)
                res = await asyncio.wait_for(
                    asyncio.gather(*(g.allreduce(xs[g.rank], op=op, algorithm="ring") for g in grps)), 30
                )
                stack = np.stack(xs)
                if op == "mean":
                    want = np.sum(stack, axis=0) / n
                else:
                    want = {"sum": np.sum, "max": np.max, "min": np.min}[op](stack, axis=0).astype(dtype)
                assert all(np.array_equal(r, res[0]) for r in res), (op, dtype)  # the same bits everywhere
                if stack.dtype.kind == "f":
                    assert np.allclose(res[0], want, rtol=1e-5, atol=1e-4), (op, dtype)
                else:
                    assert np.array_equal(res[0], want), (op, dtype)
                assert res[0].dtype == np.dtype(dtype) and res[0].shape == (size,)
    # every segment took the short road at both ends (a 3-byte tail or an odd chunk too)
    assert used["encoded"] > 0 and used["decoded"] == used["encoded"], used


@pytest.mark.parametrize(("pipeline", "sends"), [(1, 2), (2, 4)])
async def test_pipeline_segments_sets_the_pieces_per_chunk_and_stays_exact(
    pipeline: int, sends: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n = 2, 4 MiB of float32: 2 MiB chunks go as 1 piece (pipeline_segments = 1) or 2 pieces of
    1 MiB, in each of the 2 ring steps."""
    cfg = {"collectives": {"small_bytes": 4096, "pipeline_segments": pipeline, "native_bytes": 0}}  # the links' ring
    async with cluster(2, "tcp", config=cfg) as nodes:
        grps = [node.group() for node in nodes]
        xs = inputs(2, 1 << 20, "float32", 3)
        with counted(monkeypatch) as used:
            res = await asyncio.wait_for(asyncio.gather(*(g.allreduce(xs[g.rank]) for g in grps)), 30)
        assert np.array_equal(res[0], xs[0] + xs[1]) and np.array_equal(res[1], res[0])
        assert used["encoded"] == used["decoded"] == 2 * sends  # both ranks' segments


@pytest.mark.parametrize("seg", [1 << 18, 1 << 20])  # copied for the replay, and sent zero-copy (ack-held)
async def test_a_connection_cut_mid_allreduce_replays_segments_and_the_answer_is_exact(
    seg: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    with counted(monkeypatch) as used:
        async with proxied() as (a, b, pa):
            ga, gb = (nd.collectives.group(["a", "b"], "cut") for nd in (a, b))
            for g in (ga, gb):
                g.segment_bytes = seg
                g.small_bytes = 4096
            lb, la = b._peers["a"].link, a._peers["b"].link
            replayed = la.replayed + lb.replayed
            size = (6 << 20) // 4 + 5
            xs = inputs(2, size, "float32", 7)
            outs = [np.empty(size, np.float32) for _ in xs]
            pa.stall()  # segments leave both ranks and wait in the proxy, unacknowledged
            calls = [
                asyncio.ensure_future(g.allreduce(xs[g.rank], algorithm="ring", out=outs[g.rank])) for g in (ga, gb)
            ]
            await wait_for(lambda: len(lb.state.unacked) >= 2 and len(la.state.unacked) >= 2, 20)
            assert not any(c.done() for c in calls)
            pa.cut(reset=True)  # in the middle of the call: what was in flight is lost with the connection
            pa.stall(False)
            res = await asyncio.wait_for(asyncio.gather(*calls), 40)
            want = xs[0] + xs[1]
            assert all(r is o for r, o in zip(res, outs, strict=True))
            assert np.array_equal(outs[0], want) and np.array_equal(outs[1], want)
            assert la.replayed + lb.replayed > replayed  # segments really were sent again
    assert used["encoded"] > 0 and used["decoded"] > 0


async def test_a_malformed_segment_header_is_a_typed_error_a_log_line_and_a_closed_connection() -> None:
    async with cluster(2, "tcp") as (a, b):
        conn = b._peers[a.name].link.current.conn
        lost = asyncio.Event()
        a.on_connection_event(lambda peer, ev, _d: lost.set() if ev == "lost" else None)
        # the short road's exact shape, but the record claims 2**40 float32 items for 64 bytes
        meta = msgpack.packb(["<f4", [2**40], False, 1])
        header = msgpack.packb([SEND, 1 << 30, 0, "x", [1, 2, 3, msgpack.ExtType(EXT_NDARRAY, meta)]])
        with capture_logs() as logs:
            conn.write_nowait([header, bytearray(64)])
            await asyncio.wait_for(lost.wait(), 10)
        bad = [e for e in logs if e["event"] == "bad message from peer; closing connection"]
        assert bad and bad[0]["log_level"] == "warning" and "needs" in bad[0]["error"], logs
        # nothing was delivered, and the link goes on on a new connection
        await b.send(a.name, "after", np.arange(1 << 12, dtype=np.float32))
        got = await a.recv("after", timeout=20)
        assert np.array_equal(got, np.arange(1 << 12, dtype=np.float32))


async def test_a_bare_array_sent_to_a_mailbox_takes_the_short_road(monkeypatch: pytest.MonkeyPatch) -> None:
    """``node.send(peer, channel, array)``: the same road (the envelope's payload is the array)."""
    with counted(monkeypatch) as used:
        async with cluster(2, "tcp") as (a, b):
            for x in (np.arange(1 << 18, dtype=np.float64).reshape(512, 512), np.ones(3 << 20, np.uint8)):
                x.flags.writeable = x.dtype != np.uint8  # a read-only one too (sent without waiting for its ack)
                await b.send(a.name, "arr", x)
                got = await a.recv("arr", timeout=20)
                assert type(got) is np.ndarray and got.dtype == x.dtype and got.shape == x.shape
                assert np.array_equal(got, x) and got.flags.writeable
    assert used["encoded"] == used["decoded"] == 2, used
