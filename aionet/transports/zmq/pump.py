"""Driving zmq sockets from the event loop: the receive side (limits via the wire reader),
socket monitors, and the edge-triggered ``ZMQ_FD`` pump shared by listeners and dialers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from collections.abc import Callable
from typing import Any

import zmq
from zmq.backend import Socket as _BackendSocket

from ...errors import ConnectionClosed, TransportError
from .wire import Decoded, MessageReader

NOBLOCK = zmq.NOBLOCK
MORE = zmq.NOBLOCK | zmq.SNDMORE
EVENTS = zmq.EVENTS
POLLIN = zmq.POLLIN
POLLOUT = zmq.POLLOUT
# pyzmq's sugar Socket.send is a Python wrapper; the hot path calls the Cython method.
bsend = _BackendSocket.send

MON_EVENTS = (
    zmq.EVENT_ACCEPTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CLOSED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
DIAL_FAIL_EVENTS = (
    zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CLOSED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
EVENT_NAMES = {int(e): e.name for e in zmq.Event if e.name}
PROTOCOL_ERRORS = {int(getattr(zmq, n)): n[15:] for n in dir(zmq) if n.startswith("PROTOCOL_ERROR_")}


def zmq_error(exc: zmq.ZMQError, what: str) -> TransportError:
    if exc.errno in (zmq.EHOSTUNREACH, zmq.ENOTSOCK, zmq.ETERM):
        err: TransportError = ConnectionClosed(f"{what}: {exc.strerror}")
    else:
        err = TransportError(f"{what}: {exc.strerror}")
    err.__cause__ = exc
    return err


class Receiver:
    """Reads the rest of a message from a socket through the wire protocol's reader.

    Frames are received with ``copy=False``: ``Frame.more`` is cheaper than asking the socket
    for RCVMORE, and each frame can become ``bytes`` (small) or a memoryview (large)."""

    def __init__(self, sock: zmq.Socket, opts: Any, limits: Any) -> None:
        self.recv = sock.recv
        self.zc_min = opts.zc_min
        self.reader = MessageReader(limits.max_frames, limits.max_message_bytes)

    def body(self, fr: zmq.Frame) -> Decoded:
        """Given frame 0 (received), read the rest: (control or None for data, frames, bytes)."""
        recv, zc, feed = self.recv, self.zc_min, self.reader.feed
        while True:
            n = len(fr)
            out = feed(fr.bytes if n < zc else fr.buffer, fr.more)
            if out is not None:
                return out
            fr = recv(0, copy=False)


class Monitor:
    """A socket monitor read from the loop; calls ``on_event(event, value)`` per event."""

    def __init__(
        self,
        ctx: zmq.Context,
        sock: zmq.Socket,
        loop: asyncio.AbstractEventLoop,
        on_event: Callable[[int, int], None],
        events: int,
    ) -> None:
        addr = f"inproc://aionet-monitor-{os.urandom(8).hex()}"
        sock.monitor(addr, events)
        self._target = sock
        self._sock = ctx.socket(zmq.PAIR)
        self._sock.linger = 0
        self._sock.connect(addr)
        self._loop = loop
        self._on_event = on_event
        self._fd = self._sock.getsockopt(zmq.FD)
        self._closed = False
        loop.add_reader(self._fd, self.poll)
        # The inproc pipe attached synchronously, so no command will ever signal the FD until
        # one read has found the pipe empty and put the reader to sleep: do that now.
        self.poll()

    def poll(self) -> None:
        """Deliver every pending event (also called directly to bring the view up to date)."""
        sock = self._sock
        while not self._closed:
            try:
                parts = sock.recv_multipart(NOBLOCK)
            except zmq.ZMQError:  # Again: nothing more; anything else: socket closed
                return
            if len(parts[0]) >= 6:
                event, value = struct.unpack_from("=HI", parts[0])
                self._on_event(event, value)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        with contextlib.suppress(zmq.ZMQError):
            self._target.disable_monitor()
        self._sock.close(0)


class Pump:
    """Drives one zmq socket from the event loop.

    ``ZMQ_FD`` is edge-triggered and any socket call may consume its signal, so after each
    operation (ours or a sender's) the socket's ``EVENTS`` is re-checked before going idle.
    """

    def __init__(self, sock: zmq.Socket, loop: asyncio.AbstractEventLoop, opts: Any, limits: Any) -> None:
        self._sock = sock
        self._loop = loop
        self._opts = opts
        self._rx = Receiver(sock, opts, limits)
        self._fd = sock.getsockopt(zmq.FD)
        self._kick_pending = False
        self._gen = 0  # counts services: a connection's send in this one marks its batch open
        self._checked_gen = -1  # the service count when a send last read EVENTS itself
        self._in_service = False
        self._wrote = False  # a send during this service pass: EVENTS must be read again
        self._again = False  # the last drain ended on a receive that found nothing
        self._marked: dict[Any, None] = {}  # push-mode connections with messages to deliver
        self._stopped = False
        self._queued_bytes = 0
        self._queued_msgs = 0
        self._paused = False
        loop.add_reader(self._fd, self._woken)
        self.kick()  # arm the edge-triggered FD: it only fires after EVENTS saw nothing to do

    # --- flow control of the receive side -------------------------------------------------
    def _over_bound(self) -> bool:
        return self._queued_bytes > self._opts.max_queued_bytes or self._queued_msgs > self._opts.max_queued_msgs

    def _count_out(self, nbytes: int, nmsgs: int) -> None:
        self._queued_bytes -= nbytes
        self._queued_msgs -= nmsgs
        if (
            self._paused
            and self._queued_bytes <= self._opts.max_queued_bytes // 2
            and self._queued_msgs <= self._opts.max_queued_msgs // 2
        ):
            self._paused = False
            self.kick()

    # --- scheduling -------------------------------------------------------------------------
    def kick(self) -> None:
        """Re-check the socket soon (coalesced: at most once per loop iteration)."""
        if not self._kick_pending and not self._stopped:
            self._kick_pending = True
            self._loop.call_soon(self._kicked)

    def _sent(self) -> None:
        """A message went to zmq. A send may process the socket's commands and so consume
        ``ZMQ_FD``'s signal: EVENTS must be read again before the loop sleeps. Inside a
        service pass (a reply produced while delivering) its loop does that; otherwise a
        kick does, once per loop iteration however many messages go out."""
        if self._in_service:
            self._wrote = True
        elif self._kick_pending:
            pass
        elif self._checked_gen != self._gen:
            # The first message since the socket was serviced (a lone request or reply): read
            # EVENTS now rather than a loop iteration later. With nothing to read or flush,
            # that read left ZMQ_FD armed, as a service pass would, and it counts as one (so a
            # later lone message goes straight out too: see ZConnection.flush_pending); the
            # next send before a service pass kicks.
            self._gen += 1
            self._checked_gen = self._gen
            try:
                ev = self._sock.getsockopt(EVENTS)
            except zmq.ZMQError:
                self.kick()  # the service pass reports it
                return
            if (ev & POLLIN and not self._paused) or (ev & POLLOUT and self._has_pending()):
                self.kick()
        else:
            self.kick()

    def _kicked(self) -> None:
        self._kick_pending = False
        self._service()

    def _woken(self) -> None:
        self._service(True)

    def _service(self, signalled: bool = False) -> None:
        """Read, deliver and flush until the socket has nothing more to do right now.

        ``signalled``: ZMQ_FD fired, so a message most likely waits. Then the first step is a
        receive rather than an EVENTS read: a receive that finds its pipe asleep processes the
        pending commands itself and tries again, so one call does what both would."""
        if self._stopped:
            return
        self._gen += 1
        self._in_service = True
        getopt = self._sock.getsockopt
        flush_tried = False
        try:
            while True:
                if self._marked:
                    self._push_marked()
                if signalled and not self._paused:
                    signalled = False
                    ev = POLLIN
                else:
                    ev = getopt(EVENTS)
                if ev & POLLIN and not self._paused:
                    self._wrote = self._again = False
                    more = self._drain(self._opts.drain_batch)
                    if self._marked:
                        # push mode: consumers run now, so replies they send leave in this
                        # pass rather than on a later loop iteration
                        self._push_marked()
                    if more:
                        self.kick()  # batch used up: let other tasks run first
                        return
                    if self._again and not self._wrote and not self._has_pending():
                        # The receive that found nothing processed every pending command and
                        # put the socket's pipes and mailbox to sleep, so the next arrival
                        # signals ZMQ_FD again; nothing used the socket since: no EVENTS read.
                        break
                    continue
                if ev & POLLOUT and not flush_tried and self._has_pending():
                    flush_tried = True
                    if self._flush():
                        flush_tried = False
                    continue
                break
            self._idle()
        except zmq.ZMQError as exc:
            if not self._stopped:
                self._fatal(exc)
        finally:
            self._in_service = False

    def _push_marked(self) -> None:
        """Hand what the last drain queued to the push-mode consumers it belongs to."""
        marked = self._marked
        while marked:
            conns = list(marked)
            marked.clear()
            for conn in conns:
                conn._push_batch()

    def _stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._loop.remove_reader(self._fd)

    # --- subclass hooks ---------------------------------------------------------------------
    def _drain(self, budget: int, force: bool = False) -> bool:
        """Receive up to ``budget`` messages; True when the budget ran out (more may wait).
        ``force`` ignores the receive bound (to take what a dead peer left in zmq's queue)."""
        raise NotImplementedError

    def _has_pending(self) -> bool:
        raise NotImplementedError

    def _flush(self) -> bool:
        """Send queued messages; True if any progress was made."""
        raise NotImplementedError

    def _idle(self) -> None:
        """Called when the socket has nothing more to do right now."""

    def _fatal(self, exc: zmq.ZMQError) -> None:
        raise NotImplementedError
