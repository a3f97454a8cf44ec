"""One validator for every transport's options (``[transport] <name> = {...}``).

A transport declares its options once, as a schema (name -> :class:`Option`), and calls
:func:`parse_options`. Unknown keys are errors that name the valid keys (with a "did you
mean" hint), so a typo never silently means "the default".
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..config import parse_size
from ..errors import ConfigError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def boolean(value: Any) -> bool:
    """A bool, or one of the strings environment overrides produce (on/off, true/false, 1/0)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError("a boolean")


def integer(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("an integer")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError("an integer") from None


def number(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError("a number") from None


def size(value: Any) -> int:
    """Bytes: an integer or a string such as ``"64MiB"``."""
    if isinstance(value, bool):
        raise ValueError('a size in bytes (e.g. 65536 or "64KiB")')
    try:
        return parse_size(value)
    except (TypeError, ValueError, AttributeError):
        raise ValueError('a size in bytes (e.g. 65536 or "64KiB")') from None


def string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("a string")
    return value


def table(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError("a table (mapping)")
    return dict(value)


def anything(value: Any) -> Any:
    """No conversion: the transport checks the value itself (e.g. key file paths)."""
    return value


def optional(kind: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``kind``, or None left as None."""

    def convert(value: Any) -> Any:
        return None if value is None else kind(value)

    return convert


def non_negative(value: Any) -> bool:
    return value >= 0


def positive(value: Any) -> bool:
    return value > 0


@dataclass(frozen=True)
class Option:
    """One declared option: its default, a converter (raising ValueError naming the expected
    kind) and an optional check on the converted value with the rule it enforces."""

    default: Any
    kind: Callable[[Any], Any] = anything
    check: Callable[[Any], bool] | None = None
    rule: str = ""


def suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_keys(transport: str, schema: Mapping[str, Any], raw: Mapping[str, Any]) -> None:
    """ConfigError naming every unknown key and the valid ones."""
    unknown = [k for k in raw if k not in schema]
    if not unknown:
        return
    valid = list(schema)
    what = ", ".join(f"{k!r}{suggest(str(k), valid)}" for k in unknown)
    plural = "s" if len(unknown) > 1 else ""
    raise ConfigError(f"unknown transport.{transport} option{plural} {what}; valid: {', '.join(valid)}")


def parse_options(transport: str, schema: Mapping[str, Option], raw: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validated options: every schema key present (default where not given), each converted
    and checked. Raises ConfigError naming ``transport.<name>.<key>`` and what it must be."""
    raw = raw or {}
    check_keys(transport, schema, raw)
    out: dict[str, Any] = {}
    for key, opt in schema.items():
        if key not in raw:
            out[key] = opt.default
            continue
        value = raw[key]
        try:
            conv = opt.kind(value)
        except ValueError as exc:
            raise ConfigError(f"transport.{transport}.{key} must be {exc}, not {value!r}") from None
        if opt.check is not None and not opt.check(conv):
            raise ConfigError(f"transport.{transport}.{key} {opt.rule or 'is out of range'}, not {value!r}")
        out[key] = conv
    return out
