"""The core below the services: per-peer reliable links and their sans-I/O state, the router
(mailboxes, request/reply), the peer directory, connecting (dial/accept/handshake/join), the
envelope dispatch loop and device-array transfers. Services reach it through ``ports.py``."""

from .connect import Connector
from .device_transfer import DeviceTransfers, StagingRequired
from .dispatch import Dispatcher
from .link import Link
from .link_state import LinkState
from .peers import Peer, PeerConn, PeerDirectory
from .router import Mailbox, Router

__all__ = [
    "Connector",
    "DeviceTransfers",
    "Dispatcher",
    "Link",
    "LinkState",
    "Mailbox",
    "Peer",
    "PeerConn",
    "PeerDirectory",
    "Router",
    "StagingRequired",
]
