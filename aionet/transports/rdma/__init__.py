"""``rdma://``: verbs RC queue pairs with credit flow control.

``protocol`` is the sans-I/O part (credits, segmentation, reassembly, back-pressure), tested
by feeding it events; ``transport`` drives it with pyverbs and a TCP side channel.
"""

from .protocol import RdmaProtocol
from .transport import Completion, RDMAConnection, RDMAListener, RDMATransport, VerbsQP, load_pyverbs

__all__ = ["Completion", "RDMAConnection", "RDMAListener", "RDMATransport", "RdmaProtocol", "VerbsQP", "load_pyverbs"]
