"""Observability, the top layer: Prometheus metrics, the HTTP server (``/``, ``/status``,
``/metrics``, ``/health``, ``/events``) and the live dashboard, which need aiohttp and
prometheus-client (aionet's dependencies) and are imported only when ``[http] port`` is set;
and traces (``trace.py``, stdlib only)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .http import Observer


async def attach(node: Any) -> Observer:
    """Start metrics and the HTTP server for ``node``; ``await observer.close()`` stops them."""
    try:
        from .http import Observer
    except ImportError as exc:
        from ..errors import ConfigError

        raise ConfigError(
            f"[http] port is set but {exc.name or 'aiohttp/prometheus-client'} is not installed: "
            "pip install aiohttp prometheus-client, or set [http] port = 0"
        ) from None
    obs = Observer(node)
    try:
        await obs.start()
    except BaseException:
        await obs.close()  # e.g. the port is taken: unhook what start() added
        raise
    return obs


def __getattr__(name: str) -> Any:
    if name == "Observer":
        from .http import Observer

        return Observer
    raise AttributeError(name)


__all__ = ["Observer", "attach"]
