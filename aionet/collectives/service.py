"""The node's collectives service: builds groups, and tells them when a member is gone.

It gets the node's messaging and membership events through :mod:`aionet.core.ports` (never
the Node), keeps a member's state as membership's events last said, and breaks every group that
holds a member declared dead, restarted or gone, so no collective ever waits for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ..config import CollectivesSection
from ..core.ports import DeviceArrays, MemberEventInfo, MemberEvents, Messaging, ReceiveInto
from ..core.tasks import OwnedTasks
from ..errors import CollectiveError
from ..instrument import Instruments
from ..log import get_logger
from .bench import BENCH_SERVICE
from .group import Group
from .native import NativeSupport


class Collectives:
    def __init__(
        self,
        cfg: CollectivesSection,
        *,
        messaging: Messaging,
        members: MemberEvents,
        instruments: Instruments | None = None,
        device: DeviceArrays | None = None,
        inline_bytes: int = 0,
        receive_into: ReceiveInto | None = None,
        native_endpoint: Callable[[], tuple[str, str] | str] | None = None,
    ) -> None:
        self.cfg = cfg
        # large allreduces over streams of their own, moved by compiled code (native.py)
        self._native = NativeSupport(cfg.native_bytes, native_endpoint)
        self._receive_into = receive_into  # large ring segments land straight in the result
        self.inline_bytes = inline_bytes  # arrays smaller than this are packed inline (codec.oob_min_bytes)
        self._device = device  # device (GPU) inputs are reduced through host copies
        self.instruments = instruments if instruments is not None else Instruments()
        self._msg = messaging
        self._groups: set[Group] = set()
        self._states: dict[str, str] = {}  # member -> last state membership reported
        self._gone: dict[str, str] = {}  # member -> why, for members dead or left
        self._stopped = False  # the node stopped: no new groups (a stopped node does not start again)
        self._retiring = OwnedTasks(get_logger("aionet.collectives", node=messaging.name), "collectives")
        members.on_member_change(self._on_member)
        messaging.add_service(BENCH_SERVICE, self._bench)  # `aionet bench OP --connect URL`

    def group(self, members: Sequence[str], name: str | None = None) -> Group:
        """A group over ``members`` (in this order: rank i is ``members[i]``)."""
        members = list(members)
        return self.make(members, name or "g:" + ",".join(members), 0)

    def make(self, members: list[str], name: str, epoch: int) -> Group:
        if self._stopped:
            raise CollectiveError(f"node {self._msg.name!r} is stopped: collectives need a running node")
        for g in self._groups:
            # The same group again (``node.group()`` in every step of a loop): the same object.
            # A second one would take over the channel at sequence number 0 while peers still
            # send for the first one's numbers, and both would wait for ever.
            if g.name == name and g.epoch == epoch and g.members == tuple(members) and not g.closed:
                return g
        cfg = self.cfg
        g = Group(
            self._msg,
            members,
            name,
            small_bytes=cfg.small_bytes,
            max_ahead_bytes=cfg.max_ahead_bytes,
            segment_bytes=cfg.segment_bytes,
            pipeline=cfg.pipeline_segments,
            timeout=cfg.timeout or None,
            alive=self.alive,
            on_close=self._groups.discard,
            factory=self.make,
            epoch=epoch,
            instruments=self.instruments,
            compression=cfg.compression,
            device=self._device,
            inline_bytes=self.inline_bytes,
            receive_into=self._receive_into,
            native=self._native,
        )
        self._groups.add(g)
        if epoch > 0:
            # shrink(): the broken groups it replaces are closed (their channels and what they kept
            # released), else an elastic job would keep one per shrink for as long as it runs
            for old in [x for x in self._groups if x.name == name and x.epoch < epoch and x.broken]:
                self._retiring.spawn(old.close(f"shrunk to epoch {epoch}"), name="aionet-collectives-retire")
        for m in members:  # a member already gone: the group cannot work, say so at once
            if m in self._gone:
                g.member_lost(m, self._gone[m])
        return g

    async def _bench(self, arg: Any) -> list[dict[str, Any]]:
        """Run the bench loop as one member of the group ``arg`` names (aionet.collectives.bench);
        every member is asked at once and answers with the rows."""
        from .bench import measure  # only when benchmarked

        try:
            op, members, name = str(arg["op"]), [str(m) for m in arg["members"]], str(arg["name"])
            sizes, iters, warmup = [int(s) for s in arg["sizes"]], int(arg["iters"]), int(arg["warmup"])
            device = str(arg.get("device", "cpu"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{BENCH_SERVICE} takes op, members, name, sizes, iters, warmup: {exc!r}") from None
        if not 1 <= iters <= 10_000 or not 0 <= warmup <= 10_000 or not sizes or max(sizes) > 1 << 31:
            raise ValueError("bench: 1 <= iters <= 10000, 0 <= warmup <= 10000, sizes up to 2 GiB")
        grp = self.make(members, name, 0)
        try:
            return await measure(grp, op, sizes, iters, warmup, device=device)
        finally:
            await grp.close()

    def alive(self, name: str) -> bool:
        return name == self._msg.name or (name not in self._gone and self._states.get(name, "alive") != "dead")

    def _on_member(self, ev: MemberEventInfo) -> None:
        name, state, kind = ev.name, ev.state, ev.kind
        if name == self._msg.name:
            return
        self._states[name] = state
        if state in ("dead", "left") or kind == "restarted":
            why = "restarted" if kind == "restarted" else state
            if state in ("dead", "left"):
                self._gone[name] = why
            for g in list(self._groups):
                g.member_lost(name, why)
        elif state == "alive":
            self._gone.pop(name, None)

    async def close(self) -> None:
        self._stopped = True
        await self._retiring.cancel_all()
        await asyncio.gather(*(g.close("its node stopped") for g in list(self._groups)), return_exceptions=True)


__all__ = ["Collectives"]
