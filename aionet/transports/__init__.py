"""Transports move messages (lists of frames); chosen by URL scheme through the registry."""

from .base import Address, Connection, Listener, Transport
from .registry import ENTRY_POINT_GROUP, TransportRegistry

__all__ = ["ENTRY_POINT_GROUP", "Address", "Connection", "Listener", "Transport", "TransportRegistry"]
