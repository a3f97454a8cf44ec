"""What a push-mode connection does with its consumer's answer to a batch: one mixin,
:class:`PushDelivery`, shared by the connections that dispatch from their own read path
(:class:`~aionet.transports.tcp_connection.TCPConnection` and zmq's
:class:`~aionet.transports.zmq.connection.ZConnection`).

In push mode (``Connection.start_receiving``) the consumer's ``on_messages`` may return an
awaitable (it must block, e.g. a full mailbox). Holding delivery until that awaitable is
done, resuming after it, and, when it or the callback fails, telling ``on_closed`` exactly
once and aborting the connection are the same rules for every transport, so they are
written once here and cannot drift apart. How a transport queues messages, when it
delivers them and how it reports the end of the stream stay its own (its ``_push``).

None of this runs per message on the request path (only when a consumer asks to wait or
fails); it is a mixin rather than a helper object so that the hosts' hot read paths keep
touching ``_on_messages`` and ``_push_pending`` as plain attributes of ``self``. For the same
reason the loops that call ``on_messages`` stay inline in each host: zmq's runs for every
batch on the request path, where a shared helper would cost a call per batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from .base import Message


class PushDelivery:
    """Mixin for a :class:`~aionet.transports.base.Connection` with its own push mode.

    The host calls :meth:`_init_push` in its ``__init__``, stores the consumer's callbacks in
    ``_on_messages``/``_on_closed`` from ``start_receiving``, and hands every awaitable the
    consumer returns to :meth:`_pushed` (and stops delivering when that returns True). It
    must not deliver while ``_push_pending`` is set; :meth:`_push_done` calls its ``_push``
    again once the awaitable is done.
    """

    # ---- set by the host (attributes and methods this mixin uses but does not own)
    #: the loop the consumer's awaitables are wrapped on
    _loop: asyncio.AbstractEventLoop
    #: True once the connection delivers no more: a failed consumer then needs no abort
    _closed: bool
    #: named in the warning when the consumer fails
    peer_address: str
    #: the host transport's logger, so that the warning keeps its transport's logger name
    _log: ClassVar[Any]
    #: deliver what is queued while no awaitable is pending; report the end once all is delivered
    _push: Callable[[], None]
    #: close now, without flushing (``Connection.abort``)
    abort: Callable[[], None]

    # ---- push-mode state: created by _init_push, the callbacks stored by start_receiving
    #: the consumer's batch callback; None before push mode and after the end was reported
    _on_messages: Callable[[list[Message]], Awaitable[None] | None] | None
    #: told the end once (ConnectionClosed or the consumer's failure), then set to None
    _on_closed: Callable[[BaseException], None] | None
    #: the consumer's unfinished awaitable: no delivery until it is done
    _push_pending: asyncio.Future[Any] | None

    def _init_push(self) -> None:
        """Not in push mode, nothing pending (call from the host's ``__init__``)."""
        self._on_messages = None
        self._on_closed = None
        self._push_pending = None

    def _hold_input(self) -> None:
        """The consumer asked to wait: stop taking input until ``_push`` resumes delivery.
        Default: nothing (the host's bound on queued messages stops reading on its own)."""

    def _abort_for_consumer(self, exc: BaseException) -> None:
        """Close the connection because its consumer failed with ``exc`` (hosts that
        remember why a connection ended record ``exc`` first). Default: ``abort()``."""
        self.abort()

    def _pushed(self, pending: Awaitable[None]) -> bool:
        """The consumer returned ``pending``: hold delivery (and input) until it is done.
        True when delivery must stop here (it is not done yet, or the consumer failed)."""
        fut = asyncio.ensure_future(pending, loop=self._loop)
        if not fut.done():
            self._push_pending = fut
            self._hold_input()
            fut.add_done_callback(self._push_done)
            return True
        self._check_pushed(fut)
        return self._on_messages is None

    def _check_pushed(self, fut: asyncio.Future[Any]) -> None:
        """A finished awaitable of the consumer's: its failure (or cancellation) ends push mode."""
        if fut.cancelled():
            self._push_failed(asyncio.CancelledError())
        elif (exc := fut.exception()) is not None:
            self._push_failed(exc)

    def _push_done(self, fut: asyncio.Future[Any]) -> None:
        """Done callback of the pending awaitable: deliver what queued meanwhile, or report
        the end (``_push`` re-checks the queue: messages may have arrived while it waited)."""
        self._push_pending = None
        self._check_pushed(fut)
        if self._on_messages is not None or self._on_closed is not None:
            self._push()

    def _push_failed(self, exc: BaseException) -> None:
        """The consumer raised (or its awaitable failed): leave push mode, abort the
        connection if it is still open, and give ``on_closed`` the consumer's exception."""
        cb, self._on_closed = self._on_closed, None
        self._on_messages = None
        if not self._closed:
            self._log.warning("push-mode consumer failed; closing connection", peer=self.peer_address, error=repr(exc))
            self._abort_for_consumer(exc)
        if cb is not None:
            cb(exc)


__all__ = ["PushDelivery"]
