"""The envelope dispatch loop: from a connection's read callback to mailboxes, handlers, replies.

Runs in push mode, straight on the transport's read callback (no task wake-up per batch). A
full mailbox, a busy handler limit or a device array still arriving returns an awaitable that
pauses reading that connection until there is room (:meth:`Dispatcher._resume`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import CoroutineType
from typing import Any

from ..codecs.array_send import decode_array_send
from ..codecs.envelope import ACK, BYE, CANCEL, ERR, PEERS, REP, REQ, SEND, XFER
from ..codecs.extensions import DecodeDeferred
from ..codecs.serialize import Serializer
from ..errors import AionetError, ConnectionClosed, PeerUnavailable, ProtocolError
from .busy_poll import BusyPoll
from .device_transfer import DeviceTransfers, StagingRequired
from .link import Link, nbytes_of
from .peers import PeerConn, PeerDirectory, Spawn
from .receive_targets import ReceiveTargets
from .router import Mailbox, Router, returned_coroutine

ControlHandler = Callable[[str, list[Any]], None]


class Dispatcher:
    """Delivers what one node's connections read. Unsequenced control envelopes (kind >= ACK)
    go to ``control_handlers`` (heartbeats, probes); sequenced ones pass the link's receive
    window first (duplicates from a replay are dropped)."""

    def __init__(
        self,
        *,
        serializer: Serializer,
        router: Router,
        device: DeviceTransfers,
        peers: PeerDirectory,
        control_handlers: dict[int, ControlHandler],
        log: Any,
        spawn: Spawn,
        closing: Callable[[], bool],
        receive_targets: ReceiveTargets | None = None,
    ) -> None:
        self.serializer = serializer
        self._targets = receive_targets
        self.router = router
        self._device = device
        self._peers = peers
        self._control_handlers = control_handlers
        self.log = log
        self._spawn = spawn
        self._closing = closing
        # node.busy_poll_us: each batch read keeps the loop polling a while (set at start)
        self.busy_poll: BusyPoll | None = None

    def start_reader(self, c: PeerConn, link: Link) -> None:
        """Dispatch straight from the transport's read callback (push mode): no task wake-up
        per batch; a full mailbox or a reply that must wait pauses reading that connection."""

        def reply(kind: int, fields: list[Any]) -> Awaitable[None] | None:
            # Never block the reader on a reply: waiting for the transport to drain (or for
            # an ack, which this very reader must read) could deadlock two busy peers. The
            # reply's place in the stream is fixed by post(); finishing it runs on its own.
            if link.dead is not None:
                return None  # the caller is gone; nothing to tell
            try:
                aw = link.post(kind, fields, wait_ack=False)
            except PeerUnavailable:
                return None
            except StagingRequired:  # device arrays in the reply: staged on a task of its own
                self._spawn(self._device.send_reply(link, kind, fields), "aionet-reply")
                return None
            except AionetError as exc:
                why = f"cannot send the reply: {exc}"
                if type(fields[-1]) is CoroutineType:  # a plain def returned a coroutine
                    fields[-1].close()  # (never to be awaited: no "never awaited" warning)
                    why = returned_coroutine()
                aw = link.post(ERR, [fields[0], "aionet.SerializationError", why, ""])
            if aw is not None:
                self._spawn(self._finish_reply(aw, link, kind, fields), "aionet-reply")
            return None

        busy = self.busy_poll
        if busy is None or not c.conn.busy_polls:

            def on_messages(batch: list[Any]) -> Awaitable[None] | None:
                return self._dispatch(c, link, reply, batch, 0)
        else:
            kick = busy.kick

            def on_messages(batch: list[Any]) -> Awaitable[None] | None:
                kick()
                return self._dispatch(c, link, reply, batch, 0)

        def on_closed(exc: BaseException) -> None:
            self._conn_closed(c, link, exc)

        if self._targets is not None:
            self._targets.attach(c.peer, c.conn)  # large frames a collective holds the place for
        c.conn.start_receiving(on_messages, on_closed)

    def _dispatch(self, c: PeerConn, link: Link, reply: Any, batch: list[Any], start: int) -> Awaitable[None] | None:
        """Deliver ``batch[start:]``; returns an awaitable when delivery must pause (see _resume).

        A sequenced message counts as received (link.state.recv_seq, what we acknowledge)
        only once it is delivered; one that must wait for room is given back (unreceive) and
        dispatched again after the wait. So when the link fails while a batch is parked, the
        rest of the batch is simply dropped: a successor link (after a false death) starts at
        the last delivered message, and the peer replays the rest on it, once and in order."""
        if link.dead is not None:
            return None  # failed, or replaced by a successor: nothing more is delivered from here
        ser = self.serializer
        loads = ser.loads
        loads_sized = ser.loads_sized
        dtypes = ser.dtypes
        short, max_frame = ser.short_header_bytes, ser.short_frame_bytes
        router = self.router
        deliver = router.deliver
        deliver_many = router.deliver_many
        peer = c.peer
        st = link.state
        nbytes = 0
        i = start
        n = len(batch)
        try:
            while i < n:
                frames = batch[i]
                i += 1
                try:
                    nf = len(frames)
                    if (
                        nf == 2
                        and len(frames[0]) <= short
                        and (env := decode_array_send(frames[0], frames[1], dtypes, max_frame)) is not None
                    ):
                        # a SEND of [*key, array] (a ring segment) or of an array: read without the
                        # decoder chain (codecs/array_send.py); anything else it does not take goes below
                        arr = env[4]
                        size = len(frames[0]) + (arr.nbytes if type(arr) is not list else arr[-1].nbytes)
                        nbytes += size
                    elif nf > 1:
                        size = nbytes_of(frames)
                        nbytes += size
                        # compressed frames only where negotiated; mailboxes and acks count the
                        # decompressed size (a compressed wire size says nothing about memory)
                        env, raw = loads_sized(frames, decompress=c.compress)
                        nbytes += raw - size
                        size = raw
                    else:
                        size = len(frames[0])
                        env = loads(frames)
                except DecodeDeferred as exc:  # a device array still arriving, or not deliverable here
                    wait = self._device.settle(exc, peer, link, reply, frames, router.on_reply)
                    if wait is None:
                        continue  # answered or logged by device_transfer.py
                    link.received(nbytes)
                    return self._resume(c, link, reply, batch, i - 1, wait)  # then decode it again
                if type(env) is not list or not env:
                    raise ProtocolError("envelope is not a non-empty list")
                kind = env[0]
                if kind >= ACK and kind != XFER and kind != CANCEL:
                    if kind == ACK:
                        link.on_ack(env[1])
                    else:
                        handler = self._control_handlers.get(kind)
                        if handler is None:
                            raise ProtocolError(f"unknown control kind {kind!r}")
                        handler(peer, env)
                    continue
                if not st.on_receive(env[1]):
                    continue  # duplicate from a replay
                link.recv_bytes += size  # for metrics (a parked message is counted again on retry: rare)
                ack = env[2]
                if ack > st.acked:
                    link.on_ack(ack)
                if kind == SEND:
                    # one payload, or a batch of them (codecs/batch.py), delivered whole
                    wait = deliver(peer, env[3], env[4], size) if len(env) == 5 else deliver_many(peer, env, size)
                    if wait is not None:  # full mailbox, or this peer's share: stop reading until room
                        st.unreceive(env[1])
                        link.received(nbytes)
                        if type(wait) is Mailbox:
                            return self._resume(c, link, reply, batch, i - 1, wait.wait_room(), wait)
                        return self._resume(c, link, reply, batch, i - 1, wait)
                elif kind == REQ:
                    if len(env) == 6:
                        aw = router.on_request(env[3], env[4], env[5], reply, peer)
                    else:  # a batch of requests (codecs/batch.py)
                        rest = router.on_requests(env, reply, peer)
                        aw = None
                        if rest is not None:
                            aw, at = rest
                            if at > 3:  # some started: the envelope is received, the rest waits
                                link.received(nbytes)
                                return self._resume_requests(c, link, reply, batch, i, env, at, aw)
                    if aw is not None:  # too many of this peer's handlers running: stop reading
                        st.unreceive(env[1])
                        link.received(nbytes)
                        return self._resume(c, link, reply, batch, i - 1, aw)
                elif kind == REP:
                    if len(env) == 5:
                        router.on_reply(REP, env[3], env[4:], peer)
                    else:
                        router.on_replies(env, peer)
                elif kind == ERR:
                    router.on_reply(ERR, env[3], env[4:], peer)
                elif kind == PEERS:
                    self._peers.learn(env[3])
                elif kind == CANCEL:  # the caller gave up on its request env[3]
                    router.on_cancel(env[3], peer)
                elif kind == BYE:
                    self.log.info("peer left", peer=peer)
                    link.peer_left()
                elif kind == XFER:  # a chunk of a staged device array (device_transfer.py)
                    aw = self._device.on_chunk(peer, link, env)
                    if aw is not None:
                        link.received(nbytes)
                        return self._resume(c, link, reply, batch, i, aw)
                else:
                    raise ProtocolError(f"unknown envelope kind {kind!r}")
        except (ProtocolError, ValueError, TypeError, IndexError, KeyError) as exc:
            self.log.warning("bad message from peer; closing connection", peer=peer, error=str(exc))
            c.conn.abort()
            return None
        link.received(nbytes)
        return None

    async def _resume_requests(
        self, c: PeerConn, link: Link, reply: Any, batch: list[Any], nxt: int, env: list[Any], at: int, aw: Any
    ) -> None:
        """The rest of a batch of requests, from field ``at``, as handler slots free up
        (reading stays paused), then the rest of ``batch`` from ``nxt``. The envelope counts as
        received: a connection cut meanwhile does not stop this (the peer's replay of it is a
        duplicate); a link failure does, and its callers are told PeerUnavailable."""
        while True:
            try:
                await aw
            except PeerUnavailable:
                pass
            if link.dead is not None:
                return
            rest = self.router.on_requests(env, reply, c.peer, at)
            if rest is None:
                break
            aw, at = rest
        more = self._dispatch(c, link, reply, batch, nxt)
        if more is not None:
            await more

    async def _finish_reply(self, aw: Awaitable[None], link: Link, kind: int, fields: list[Any]) -> None:
        try:
            await aw
            return
        except StagingRequired:  # the reply waited for link space, then met a device array
            pass
        except Exception:
            return
        await self._device.send_reply(link, kind, fields)

    async def _resume(
        self, c: PeerConn, link: Link, reply: Any, batch: list[Any], start: int, aw: Any, mb: Any = None
    ) -> None:
        """Wait for ``aw``, then deliver the rest of the batch (reading that connection stays
        paused until then). ``mb``: the mailbox whose room ``aw`` waits for."""
        try:
            await aw
        except PeerUnavailable:
            pass
        except asyncio.CancelledError:
            if mb is not None:
                mb.give_up_room(aw)  # forget the wait, or pass on a wake-up already had
            raise
        if link.dead is not None:
            if mb is not None:
                mb.wake_putter()  # we take no room after all: pass the wake-up on
            return
        more = self._dispatch(c, link, reply, batch, start)
        if more is not None:
            await more

    def _conn_closed(self, c: PeerConn, link: Link, exc: BaseException) -> None:
        why = "connection closed"
        reset = False
        cause = exc.__cause__ if isinstance(exc, ConnectionClosed) else exc
        if link.left:
            why = "peer left the cluster"
        elif isinstance(cause, ProtocolError):
            why = f"protocol error: {cause}"
        elif cause is not None:
            why = f"connection lost: {cause}"
            reset = isinstance(cause, (ConnectionResetError, ConnectionRefusedError, BrokenPipeError))
        if not isinstance(exc, (ConnectionClosed, ProtocolError)):
            self.log.error("connection reader failed", peer=c.peer, error=repr(exc))
        if not c.conn.closed:
            c.conn.abort()
        if not self._closing():
            link.connection_lost(c)
            self.log.info("peer connection closed", peer=c.peer, reason=why)
            self._peers.emit(c.peer, "lost", reason=why, reset=reset)
