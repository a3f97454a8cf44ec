"""What the owner and the worker ask of the service that drives them.

``service.Scheduler`` implements :class:`SchedulerHost`; the owner and the worker see only
this, so they import nothing above them (the service imports them, never the reverse) and
tests can drive them with a fake host: no node, no sockets.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

    from ..instrument import Instruments
    from .instructions import Instruction, WorkerInstruction
    from .state import Rec

__all__ = ["SchedulerHost"]


class SchedulerHost(Protocol):
    """Effects and facts the owner and worker need (``service.Scheduler`` provides them)."""

    name: str
    cfg: Any  # config.SchedulerConfig
    loop: asyncio.AbstractEventLoop
    log: Any  # a structlog logger
    instruments: Instruments  # the node's hooks (task_changed)
    task_node: Any  # what task code gets as task_context().node (opaque here)
    rank: int  # this node's rank in a launched world (-1 outside one)
    locate: Callable[[str], Sequence[str]] | None  # the nodes holding a cache key (cache_ref arguments)

    # ---- running things
    def spawn(self, coro: Coroutine[Any, Any, Any], name: str, *, log_errors: bool = True) -> asyncio.Task[Any] | None:
        """Start an owned task (None once the scheduler stopped)."""

    # ---- messages
    async def send(self, peer: str, msg: list[Any]) -> None: ...

    async def send_quiet(self, peer: str, msg: list[Any]) -> None: ...

    def dumps(self, obj: Any) -> Any:
        """Serialize as a message would be (raises what the node's serializer raises)."""

    async def fetch(self, holder: str, owner: str, tid: int) -> Any: ...

    async def await_result(self, rec: Rec) -> Any:
        """A task's value once it is done (fetched from its holder if large and elsewhere)."""

    async def request_unless_dead(self, peer: str, service: str, obj: Any, timeout: float | None = None) -> Any: ...

    def broadcast_load(self, load: list[Any]) -> None: ...

    def perform(self, instructions: list[Instruction]) -> None:
        """Carry out what the owner decided (see :mod:`.instructions`)."""

    def perform_worker(self, instructions: list[WorkerInstruction]) -> None:
        """Carry out what the worker decided (see :mod:`.instructions`)."""

    def clock(self) -> float:
        """Monotonic seconds (submission times, placement waits)."""

    # ---- this node's other half (worker -> owner, without a message)
    def results_local(self, items: list[Any]) -> None:
        """Results of the local worker, for the local owner."""

    # ---- liveness
    def info_pending(self) -> bool: ...

    def is_alive(self, name: str) -> bool: ...
