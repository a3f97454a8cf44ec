"""fp16/bf16 wire compression of float32 allreduce: within the documented bound, the same bits on
every rank, half the bytes on the wire."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aionet.collectives.compression import CODECS, wire_codec
from aionet.testing import cluster

# bf16's largest finite value is about 3.39e38: float32 beyond it rounds to inf, as it should
_F32 = st.floats(width=32, allow_nan=False, allow_infinity=False).filter(lambda v: abs(v) < 3.38e38)


@given(st.lists(_F32, min_size=1, max_size=64))
@settings(max_examples=200)
def test_bf16_rounds_to_nearest_within_its_unit_roundoff(values: list[float]) -> None:
    x = np.array(values, np.float32)
    back = CODECS["bf16"].round(x)
    # relative 2**-8, or half the smallest bf16 subnormal (2**-134) for tiny values
    assert np.all(np.abs(back.astype(np.float64) - x) <= np.abs(x.astype(np.float64)) * 2.0**-8 + 2.0**-134)
    assert np.array_equal(CODECS["bf16"].round(back), back)  # idempotent


def test_nan_stays_nan_and_only_float32_compresses() -> None:
    assert np.isnan(CODECS["bf16"].round(np.array([np.nan], np.float32))).all()
    with pytest.raises(ValueError, match="float32"):
        wire_codec("fp16", np.dtype(np.float64))
    with pytest.raises(ValueError, match="'none', 'fp16' or 'bf16'"):
        wire_codec("int8", np.dtype(np.float32))
    assert wire_codec("none", np.dtype(np.float64)) is None


@pytest.mark.parametrize("codec", ["fp16", "bf16"])
@pytest.mark.parametrize(
    "n,size,algorithm",
    [(3, 10_000, "ring"), (4, 1000, "doubling"), (3, 500, "doubling"), (3, 500, "direct"), (2, 300_000, "direct")],
)
async def test_compressed_allreduce_is_within_the_bound_and_identical_on_every_rank(codec, n, size, algorithm):
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(size).astype(np.float32) for _ in range(n)]
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    bound = n * CODECS[codec].unit_roundoff * np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0) * 1.01
    async with cluster(n) as nodes:
        groups = [node.group() for node in nodes]
        outs = await asyncio.gather(
            *(g.allreduce(x, compression=codec, algorithm=algorithm) for g, x in zip(groups, xs, strict=True))
        )
    for out in outs:
        assert out.dtype == np.float32 and np.array_equal(out, outs[0])  # the same bits everywhere
    err = np.abs(outs[0].astype(np.float64) - exact)
    assert np.all(err <= bound + 1e-30)
    assert err.max() > 0  # it really was rounded


async def test_compression_halves_the_bytes_on_the_wire() -> None:
    x = np.ones(1 << 20, np.float32)  # 4 MiB

    async def sent(comp: str) -> int:
        total = 0
        async with cluster(2) as nodes:
            groups = [node.group() for node in nodes]
            for g in groups:
                post = g._post

                def counting(dst, seq, t, payload, post=post):
                    nonlocal total
                    total += getattr(payload, "nbytes", 0)
                    return post(dst, seq, t, payload)

                g._post = counting
            await asyncio.gather(*(g.allreduce(x, compression=comp, algorithm="ring") for g in groups))
        return total

    plain, half = await sent("none"), await sent("fp16")
    assert plain >= 4 << 20 and half == plain // 2


@pytest.mark.parametrize("codec", ["fp16", "bf16"])
async def test_the_group_default_compresses_float32_only_and_other_dtypes_reduce_exactly(codec: str) -> None:
    """``collectives.compression`` applies to float32: an int64 count or a float64 sum in the same
    job reduces exactly, small or large, instead of raising; only an explicit per-call
    ``compression=`` on another dtype is refused."""
    async with cluster(3, config={"collectives": {"compression": codec}}) as nodes:
        groups = [node.group() for node in nodes]
        for size in (1, 100, 200_000):  # the small path, doubling and the ring
            for dtype in (np.int64, np.float64):
                xs = [np.arange(size, dtype=dtype) * (r + 1) + 2**40 for r in range(3)]
                outs = await asyncio.gather(*(g.allreduce(x, timeout=20) for g, x in zip(groups, xs, strict=True)))
                for out in outs:
                    assert out.dtype == dtype and np.array_equal(out, np.sum(xs, axis=0)), (size, dtype)
        x = np.full(1000, 1.0001, np.float32)  # float32 still travels compressed (16 bits: 1.0)
        outs = await asyncio.gather(*(g.allreduce(x, timeout=20) for g in groups))
        assert not np.array_equal(outs[0], x * 3) and np.allclose(outs[0], x * 3, rtol=1e-2)
        with pytest.raises(ValueError, match="applies to float32"):
            await groups[0].allreduce(np.ones(4, np.float64), compression=codec)
