"""URL scheme -> transport class, loaded lazily; third parties register through the
``aionet.transports`` entry-point group (value: ``"package.module:TransportClass"``).

A registry is an object owned by a Node (no module-level mutable state); the built-in table
below is constant.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any

from ..errors import TransportUnavailable
from .base import Address, Transport

ENTRY_POINT_GROUP = "aionet.transports"

BUILTIN: MappingProxyType[str, str] = MappingProxyType(
    {
        "tcp": "aionet.transports.tcp:TCPTransport",
        "inproc": "aionet.transports.inproc:InprocTransport",
        "zmq+tcp": "aionet.transports.zmq:ZMQTransport",
        "zmq+ipc": "aionet.transports.zmq:ZMQTransport",
        "tls": "aionet.transports.tls:TLSTransport",
        "ucx": "aionet.transports.ucx:UCXTransport",
        "rdma": "aionet.transports.rdma:RDMATransport",
    }
)


def _load(target: str) -> type[Transport]:
    mod_name, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise TransportUnavailable(f"transport module {mod_name!r} cannot be imported: {exc}") from exc
    cls = getattr(mod, attr, None)
    if cls is None:
        raise TransportUnavailable(f"{target!r}: module has no attribute {attr!r}")
    return cls


class TransportRegistry:
    """Maps schemes to transport classes and caches one transport instance per scheme."""

    def __init__(self, extra: dict[str, str | type[Transport]] | None = None, *, use_entry_points: bool = True):
        self._targets: dict[str, str | type[Transport]] = dict(BUILTIN)
        if use_entry_points:
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                self._targets.setdefault(ep.name.lower(), ep.value)
        if extra:
            self._targets.update({k.lower(): v for k, v in extra.items()})
        self._instances: dict[type[Transport], Transport] = {}

    def schemes(self) -> list[str]:
        return sorted(self._targets)

    def register(self, scheme: str, target: str | type[Transport]) -> None:
        self._targets[scheme.lower()] = target

    def transport_class(self, scheme: str) -> type[Transport]:
        target = self._targets.get(scheme.lower())
        if target is None:
            raise TransportUnavailable(
                f"no transport for scheme {scheme!r}; known schemes: {', '.join(self.schemes())}"
            )
        return _load(target) if isinstance(target, str) else target

    def get(
        self, url: str, options_by_scheme: dict[str, dict[str, Any]] | None = None, limits: Any = None
    ) -> Transport:
        """The transport instance for ``url``'s scheme (created on first use)."""
        scheme = Address.parse(url).scheme
        cls = self.transport_class(scheme)
        inst = self._instances.get(cls)
        if inst is None:
            cls.check_available()
            family = scheme.split("+", 1)[0]
            options = dict((options_by_scheme or {}).get(family, {}))
            inst = cls(options, limits)
            self._instances[cls] = inst
        return inst

    async def aclose(self) -> None:
        for inst in list(self._instances.values()):
            await inst.aclose()
        self._instances.clear()
