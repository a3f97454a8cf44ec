"""YAML config files, read with the same schema and strictness as TOML.

PyYAML is imported only when a ``.yaml``/``.yml`` file is read (``aionet`` is imported by every
worker process), and only its safe loader is used: a config file can build plain data, never
Python objects. YAML itself is laxer than TOML in two ways that would hide mistakes, so the
loader refuses them: a key written twice in one mapping (PyYAML keeps the last silently; TOML
refuses it) and a non-string key.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

from .errors import ConfigError

YAML_SUFFIXES = (".yaml", ".yml")


def is_yaml(path: Path) -> bool:
    """Whether ``path`` names a YAML config (by its suffix; anything else is read as TOML)."""
    return path.suffix.lower() in YAML_SUFFIXES


def read_yaml(stream: IO[bytes], path: Path) -> dict[str, Any]:
    """The top-level mapping of a YAML config file; errors name ``path`` and the line."""
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"{path}: reading a YAML config needs PyYAML: pip install pyyaml (or write TOML)") from None
    try:
        data = yaml.load(stream, Loader=_strict_loader(yaml))  # a SafeLoader subclass: plain data only
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if data is None:
        return {}  # an empty file, like an empty TOML file: all defaults
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: a YAML config must be a mapping of sections (node:, transport:, ...), not a {type(data).__name__}"
        )
    return data


def _strict_loader(yaml: Any) -> type:
    """A SafeLoader that refuses duplicate and non-string keys, naming the line of each.

    Built per call from the lazily imported module (a class, not mutable state)."""

    class StrictSafeLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:  # this mapping's own keys: merged ones (<<) may be overridden
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                line = key_node.start_mark.line + 1
                if not isinstance(key, str):
                    raise ConfigError(f"line {line}: key {key!r} must be a string (quote it)")
                if key in seen:
                    raise ConfigError(f"line {line}: key {key!r} is repeated (first at line {seen[key]})")
                seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return StrictSafeLoader
