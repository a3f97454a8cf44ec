"""Tools for testing applications built on aionet (fault injection)."""

from .proxy import FaultProxy

__all__ = ["FaultProxy"]
