"""ZeroMQ transport: ``zmq+tcp://host:port`` and ``zmq+ipc:///path`` over pyzmq.

aionet's contract is connection-oriented (listen -> one Connection per peer, connect -> a
Connection); ZeroMQ is not. The mapping:

* A listener is one ROUTER socket. Each ``connect`` is its own DEALER socket (so one TCP/IPC
  connection per aionet Connection). The ROUTER demultiplexes by routing id into per-peer
  Connection objects. Routing ids are assigned by libzmq, so ROUTER_HANDOVER is not needed.
* One aionet message is one ZeroMQ multipart message; frames stay frames. Control messages
  and the rare data message that zmq could not otherwise carry use an empty first frame,
  which aionet data never needs (frame 0 is a header): ``["", "H", version]`` hello,
  ``["", "W", version]`` welcome, ``["", "B", reason?]`` bye, and ``["", "D", *frames]`` for
  data with zero frames or an empty frame 0. Every other message travels exactly as sent.
* ``connect`` returns only after the listener answered the hello with a welcome, so a dead or
  closed address fails with TransportError instead of a socket that queues forever.
* Peer death: the DEALER and the ROUTER each have a socket monitor. ``EVENT_DISCONNECTED``
  (and CLOSED / HANDSHAKE_FAILED while connecting) ends the Connection with ConnectionClosed
  after delivering what had already arrived. On the ROUTER, a disconnect event names a file
  descriptor, not a routing id; the hello's ``SRCFD`` ties the two together. ZMTP heartbeats
  (``heartbeat_interval``/``heartbeat_timeout``) turn silent half-open links into disconnects.
* Reconnect is off (``RECONNECT_IVL=-1``): a dropped link surfaces as ConnectionClosed and the
  link layer above reconnects and replays. A silent zmq reconnect would hide message loss.
* No silent drops: ROUTER_MANDATORY makes a full per-peer queue EAGAIN (the sender waits) and
  an unknown peer EHOSTUNREACH (ConnectionClosed); the DEALER uses IMMEDIATE so nothing is
  queued towards a connection that does not exist. ``hwm`` (messages, not bytes) bounds zmq's
  own queues; ``max_queued_bytes``/``max_queued_messages`` bound what is read but not yet
  taken by ``recv``. When that bound is hit the socket stops being read, zmq's queue fills,
  TCP fills, and the remote sender blocks. On a listener this pauses all its peers at once.
* Zero copy: frames of ``zero_copy_min_bytes`` (64 KiB) and more are sent with ``copy=False``;
  ``send`` returns once libzmq released mutable buffers (immutable ``bytes`` need no wait:
  pyzmq holds a reference). Smaller frames are copied, which is faster. Frames are received
  with ``copy=False``: large ones are handed over as writable memoryviews of libzmq's buffer,
  small ones as ``bytes``.
* I/O: no zmq.asyncio. Each socket's ``ZMQ_FD`` is watched with ``loop.add_reader``; on wake-up
  the socket is drained with non-blocking receives (one await per *batch*, not per message),
  and sends try NOBLOCK first, waiting for writability only when zmq would block.
* Push mode (``start_receiving``, what a node uses) delivers each drained batch from that same
  service pass, with no task in between, so a reply produced while handling it is sent in the
  pass too. ``ZMQ_FD`` is edge-triggered and any send or receive may consume its signal: the
  pass reads EVENTS again after sending, and a send made outside a pass schedules one check
  per loop iteration. Only a receive that found nothing (it processed every pending command
  and put the pipes to sleep, so the next arrival signals again) ends a pass without one.
  ``flush_pending`` tells the link whether a message already left in this iteration: a lone
  request or reply goes straight to zmq, what follows it is batched.
* ipc: ``zmq+ipc:///abs/path`` or a relative path (resolved against the working directory
  at bind/connect time); ``zmq+ipc://`` listens on a fresh file in the temp directory; a host
  or host:port is a ConfigError (libzmq would make a file named ``127.0.0.1:0`` in the cwd).
  libzmq leaves the socket file behind on close, so the listener removes the file its bind
  created (checked by device and inode) once it stops accepting.
* Tasks: connection handlers are owned by the transport; ``aclose`` waits for them
  (cancelling a handler still busy after a second). ``write_nowait`` enqueues
  without a task, and the futures it returns never leave an unretrieved exception.
* ``ZMQ_MAXMSGSIZE`` is set from ``limits.max_frame_bytes``: libzmq applies it per frame and
  disconnects a peer that announces a larger one. Frame count and total size per message
  are checked on arrival; a violation closes that Connection with a log line.

* CurveZMQ: with ``curve_public_key_file``/``curve_secret_key_file`` set, every listening
  socket is a CURVE server and every dialing socket a CURVE client, on ``zmq+tcp://`` and
  ``zmq+ipc://`` alike (one transport instance serves both; a plaintext ipc socket next to an
  encrypted tcp one would be a hole). Plaintext peers fail the ZMTP handshake. CURVE alone
  admits any client key, so the transport binds a ZAP handler (:class:`~.curve.ZapHandler`) on its
  own Context that admits only ``curve_allowed_clients`` (default: the node's own public key,
  the shared key of an ``aionet keys`` cluster). A dial to a listener with another key fails
  at the handshake, which the socket monitor reports at once, well within ``connect_timeout``.

One zmq Context per transport instance, created lazily and terminated in ``aclose`` (with the
ZAP handler, which is closed first).

Modules: ``wire`` (message layouts, sans-I/O), ``curve`` (CurveZMQ keys, ZAP handler),
``options``, ``endpoint`` (URLs, ipc files), ``pump`` (socket I/O from the loop),
``connection`` (shared queues, the DEALER side), ``listener`` (the ROUTER side), ``transport``.
"""

from .transport import ZMQTransport
from .wire import PROTOCOL

__all__ = ["PROTOCOL", "ZMQTransport"]
