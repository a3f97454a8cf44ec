"""The narrow interfaces services get from the core, instead of the Node.

Services (membership, scheduler, later collectives and cache) depend on these Protocols only:
what they may do is written here, and a test can hand them a fake. ``node.py`` wires the
concrete objects (the Node for messaging and the control channel, the core's
:class:`~aionet.core.connect.Connector` for peer connectivity).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
INLINE_MARK = "__aionet_inline__"  # the attribute inline_handler sets and the router reads

ControlHandler = Callable[[str, list[Any]], None]
ConnListener = Callable[[str, str, dict[str, Any]], None]


class Messaging(Protocol):
    """Reliable, ordered messages and request/reply to named peers."""

    name: str
    node_id: str

    async def send(self, peer: str, channel: str, obj: Any) -> None: ...

    def send_nowait(self, peer: str, channel: str, obj: Any) -> None: ...  # or raises WouldBlock

    def flush(self, peer: str | None = None) -> None: ...  # this iteration's messages: written now

    async def request(self, peer: str, service: str, obj: Any = None, timeout: float | None = None) -> Any: ...

    async def recv_batch(self, channel: str, limit: int = 65536) -> list[Any]: ...

    def on_channel(self, channel: str, fn: Callable[[str, Any], None] | None) -> None: ...

    def add_service(self, name: str, fn: Callable[..., Any], *, cancellable: bool = True) -> None: ...

    def register_type(self, cls: type, name: str | None = None) -> type: ...


def inline_handler(fn: F) -> F:
    """Mark a plain (not ``async def``) service handler that answers inline when it can and
    returns a coroutine only when it must wait: the common case then costs what a sync
    handler costs (no task per request), the rare one runs as an async handler would
    (a task, counted against ``link.max_concurrent_requests``). Works on methods too."""
    setattr(fn, INLINE_MARK, True)
    return fn


class ControlChannel(Protocol):
    """Unsequenced, best-effort control envelopes (heartbeats, probes) and connection events."""

    def add_control_handler(self, kind: int, fn: ControlHandler) -> None: ...

    def send_control(self, peer: str, envelope: list[Any]) -> bool: ...

    def on_connection_event(self, fn: ConnListener) -> None: ...


class PeerConnectivity(Protocol):
    """Who this node can reach, and reaching them (membership's dials and probes)."""

    @property
    def token(self) -> bytes | None: ...

    def known_peers(self) -> dict[str, list[str]]: ...

    def connected(self, name: str) -> bool: ...

    def peer_node_id(self, name: str) -> str: ...

    async def ensure_link(self, name: str) -> None: ...

    def learn_peers(self, table: dict[str, list[str]], hearsay: bool = True) -> None: ...

    def declare_dead(self, peer: str, reason: str) -> None: ...

    def member_left(self, peer: str, reason: str) -> None:
        """Membership heard that ``peer`` left: end a link to it that is down (nobody to redial)."""
        ...

    def transport(self, url: str) -> Any: ...

    def advertised(self) -> list[str]:
        """Where peers should dial this node (``node.advertise``, else the bound listen URLs)."""
        ...

    async def connect(self, url: str) -> str:
        """Dial a seed by URL; the name of the node that answered."""
        ...


class MemberEventInfo(Protocol):
    """What a membership event tells a subscriber (``membership.MemberEvent`` has these)."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...  # joined, alive, suspect, dead, left, restarted

    @property
    def state(self) -> str: ...  # alive, suspect, dead, left

    @property
    def incarnation(self) -> int: ...


class MemberEvents(Protocol):
    """Membership verdicts for services: the only way a service learns who is alive."""

    def on_member_change(self, fn: Callable[[MemberEventInfo], Any]) -> Callable[[], None]: ...


class LoadFields(Protocol):
    """Extra small fields in this node's load reports (``members()``, ``aionet status``)."""

    def add_field(self, name: str, fn: Callable[[], Any]) -> None: ...


class DeviceArrays(Protocol):
    """Device (GPU) arrays to and from host memory, through the node's staging backend
    (collectives reduce on the host)."""

    def is_device_array(self, obj: Any) -> bool: ...

    def to_host(self, obj: Any) -> Any:
        """A numpy copy of device array ``obj`` (same dtype and shape)."""

    def to_device(self, arr: Any) -> Any:
        """``arr`` (numpy) as a device array of this node (numpy when it has no GPU)."""

    def borrow_host(self, obj: Any) -> Any:
        """Like ``to_host``, into a reusable host buffer (pinned with a GPU); the caller hands
        it back with ``give_back`` once nothing references it (or never, after a failure)."""

    def give_back(self, arr: Any) -> None:
        """Return a buffer ``borrow_host`` lent."""


class ReceiveInto(Protocol):
    """Receive-into for large array segments (``core/receive_targets.py``): a consumer that
    knows where an expected segment belongs registers that place, and a stream transport
    writes the segment there instead of into a fresh buffer. Consumers must still check what
    arrives (an array aliasing the place means it landed; anything else is copied as usual)."""

    def expect(self, peer: str, channel: str, key: tuple[Any, ...], buf: Any) -> None: ...

    def forget(self, peer: str, channel: str, keys: Any) -> None:
        """Drop registrations; after it returns nothing more is written into their buffers."""


class Spawner(Protocol):
    """Start a task someone owns and awaits."""

    def __call__(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]: ...


class Clock(Protocol):
    """Monotonic seconds (injected so pure state and tests can feed time:
    :class:`aionet.testing.FakeClock`)."""

    def __call__(self) -> float: ...


def loop_time() -> float:
    """The default :class:`Clock`: the running event loop's monotonic time, so timers and
    ``call_later`` agree (``time.monotonic`` outside a loop, which is what asyncio's is)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()
