"""GPU device assignment (ctx.devices): whole GPUs distinct, fractions packed, all given back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aionet.scheduler.queue import GpuSlots


def test_whole_gpus_are_distinct_and_fractions_pack_onto_one_device() -> None:
    g = GpuSlots(4)
    assert g.take(1) == (0,) and g.take(2) == (1, 2)
    assert g.take(0.5) == (3,) and g.take(0.5) == (3,)  # two halves share device 3
    g.give((1, 2), 2)
    assert g.take(0.25) == (1,)  # a fraction goes to a device with room, the lowest first among equals
    assert g.take(1) == (2,)  # device 2 is idle again


def test_no_gpus_gives_no_devices() -> None:
    assert GpuSlots(0).take(1) == ()


@given(st.lists(st.sampled_from([0.25, 0.5, 1.0, 2.0]), max_size=12), st.integers(1, 8))
def test_what_is_taken_is_given_back_exactly(wants: list[float], n: int) -> None:
    g = GpuSlots(n)
    held = []
    for w in wants:
        if sum(g.use) + w <= n:  # the resource pool only admits what fits in total
            devs = g.take(w)
            assert len(devs) == (round(w) if w >= 1 else 1) and len(set(devs)) == len(devs)
            held.append((devs, w))
    for devs, w in held:
        g.give(devs, w)
    assert all(abs(u) < 1e-9 for u in g.use)
