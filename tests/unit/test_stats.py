"""Typed statistics: frozen snapshots, and ``as_dict()`` as plain JSON-able data."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aionet.stats import ConnectionStats, LinkStats, PeerStats, Stats


def test_snapshots_are_frozen() -> None:
    link = LinkStats(True, None, 0, 0, 1, 0, 0, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        link.acked = 5  # type: ignore[misc]


@given(
    st.integers(0, 2**62),
    st.lists(st.tuples(st.integers(0, 2**40), st.text(max_size=8)), max_size=4),
    st.booleans(),
)
def test_as_dict_is_plain_nested_data(inflight: int, conns: list[tuple[int, str]], with_link: bool) -> None:
    link = LinkStats(True, None, inflight, 1, 2, 1, 1, 0) if with_link else None
    cs = tuple(ConnectionStats(local="l", remote=r, queued_send_bytes=n, extra={"k": [n]}) for n, r in conns)
    peer = PeerStats("alive", ("tcp://h:1",), inflight, sum(n for n, _ in conns), 0, 0, link, cs)
    d = peer.as_dict()
    assert json.loads(json.dumps(d)) == d  # only dicts, lists and scalars
    assert d["connections"] == [{**dataclasses.asdict(c), "extra": {"k": [c.queued_send_bytes]}} for c in cs]
    assert (d["link"] is None) is (not with_link)
    assert d["link"] is None or d["link"]["inflight_bytes"] == inflight


def test_every_statistics_type_is_a_frozen_dataclass() -> None:
    import aionet.stats as mod

    for name in mod.__all__:
        cls = getattr(mod, name)
        if cls is Stats:
            continue
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, name  # type: ignore[attr-defined]
        assert issubclass(cls, Stats), name
