"""Tools for testing applications and transports built on aionet.

* :func:`cluster` (``aionet.testing.cluster``): N in-process nodes over ``inproc://`` or
  ``tcp://127.0.0.1:0``, joined, every one seen alive by every other, stopped on exit.
* :class:`FakeClock` (``aionet.testing.clock``): fed time for membership's timers and any
  code that takes a :class:`aionet.core.ports.Clock`.
* :mod:`aionet.testing.transports`: the transport conformance suite (``check_transport``).
* :class:`FaultProxy`: a loopback TCP proxy that cuts, resets, stalls and delays.

None of these imports pytest.
"""

from .clock import FakeClock
from .cluster import cluster
from .proxy import FaultProxy

__all__ = ["FakeClock", "FaultProxy", "cluster"]
