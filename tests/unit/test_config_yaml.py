"""YAML config files: the same schema and strictness as TOML (issue 17 item 7)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import event, given, settings
from hypothesis import strategies as st

from aionet.config import Config
from aionet.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".YAML"])
def test_yaml_file_is_read_by_its_suffix(tmp_path, suffix):
    p = _write(
        tmp_path, f"node{suffix}", "node:\n  name: a\n  join: [tcp://seed.example:7700]\nheartbeat:\n  interval: 0.5\n"
    )
    cfg = Config.from_file(p, env={})
    assert cfg.node.name == "a"
    assert cfg.node.join == ["tcp://seed.example:7700"]
    assert cfg.heartbeat.interval == 0.5


def test_shipped_yaml_example_equals_its_toml_twin():
    assert Config.from_file(EXAMPLES / "tcp.yaml", env={}) == Config.from_file(EXAMPLES / "tcp.toml", env={})


def test_environment_overrides_apply_to_yaml_too(tmp_path):
    p = _write(tmp_path, "node.yaml", "node:\n  name: a\n")
    assert Config.from_file(p, env={"AIONET_NODE_NAME": "b"}).node.name == "b"


def test_relative_paths_are_relative_to_the_yaml_file(tmp_path):
    p = _write(tmp_path, "node.yaml", "security:\n  token_file: keys/token\n")
    assert Config.from_file(p, env={}).security.token_file == str(tmp_path / "keys" / "token")


def test_empty_yaml_file_gives_the_defaults(tmp_path):
    assert Config.from_file(_write(tmp_path, "node.yaml", "# nothing\n"), env={}) == Config.from_dict({}, env={})


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("node:\n  nmae: a\n", r"node\.yaml: unknown key node\.nmae \(did you mean 'name'\?\)"),
        ("heartbaet:\n  interval: 1\n", r"node\.yaml: unknown config section 'heartbaet'.*did you mean 'heartbeat'"),
        ("heartbeat:\n  interval: fast\n", r"node\.yaml: heartbeat\.interval must be a number, not 'fast'"),
        ("node:\n  name: 7\n", r"node\.yaml: node\.name must be a string, not 7"),
        ("node:\n  name:\n", r"node\.yaml: node\.name must be a string, not None"),
        ("node:\n  join: [1, 2]\n", r"node\.yaml: node\.join must be a list of strings"),
        ("scheduler:\n  default_retries: true\n", r"node\.yaml: scheduler\.default_retries must be an integer"),
        ("node: a\n", r"node\.yaml: \[node\] must be a table"),
        ("- node\n", r"node\.yaml: a YAML config must be a mapping of sections"),
        ("node:\n  name: a\n  name: b\n", r"node\.yaml: line 3: key 'name' is repeated \(first at line 2\)"),
        ("node:\n  1: a\n", r"node\.yaml: line 2: key 1 must be a string"),
        ("node: [a\n", r"(?s)node\.yaml: invalid YAML: .*line 1, column 7"),
        ("link:\n  death_grace: -1\n", r"node\.yaml: link\.death_grace must be >= 0"),
    ],
)
def test_yaml_errors_name_the_file_and_the_key(tmp_path, text, pattern):
    with pytest.raises(ConfigError, match=pattern):
        Config.from_file(_write(tmp_path, "node.yaml", text), env={})


def test_yaml_builds_plain_data_only(tmp_path):
    """safe loading: a tag that would build a Python object is an error, not a call."""
    text = "node:\n  name: !!python/object/apply:os.getcwd []\n"
    with pytest.raises(ConfigError, match=r"(?s)node\.yaml: invalid YAML: .*python/object"):
        Config.from_file(_write(tmp_path, "node.yaml", text), env={})


def test_merge_keys_may_be_overridden_without_a_repeat_error(tmp_path):
    text = "transport:\n  tcp: &t {nodelay: true, keepalive: 1}\n  tls:\n    <<: *t\n    nodelay: false\n"
    cfg = Config.from_file(_write(tmp_path, "node.yaml", text), env={})
    assert cfg.transport.tls == {"nodelay": False, "keepalive": 1}


# ------------------------------------------------------------------ TOML <-> YAML round trip


def _toml_value(v: Any) -> str:
    """A tiny TOML writer for the value types the schema holds (tomllib only reads)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # JSON string escapes are TOML basic-string escapes
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def _to_toml(data: dict[str, dict[str, Any]]) -> str:
    return "".join(
        f"[{s}]\n" + "".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in keys.items())
        for s, keys in data.items()
    )


_text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12)
_scalar = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
_BY_TYPE: dict[Any, st.SearchStrategy[Any]] = {
    bool: st.booleans(),
    int: st.integers(1, 2**40),  # mostly in range (validate() refuses many non-positive values)
    float: st.floats(0.001, 1e6),
    str: _text,
    list[str]: st.lists(_text, max_size=3),
    dict[str, Any]: st.dictionaries(_text, st.one_of(_scalar, st.lists(_text, max_size=2)), max_size=3),
    int | str: st.integers(1, 2**40),
    str | bool: st.sampled_from(["auto", "true", "false"]),
}


def _section_strategy(name: str) -> st.SearchStrategy[dict[str, Any]]:
    import typing

    types = typing.get_type_hints(type(getattr(Config(), name)))
    keyed = {k: _BY_TYPE[t] | _scalar for k, t in types.items()}  # sometimes the wrong type, on purpose
    return st.fixed_dictionaries({}, optional=keyed)


_config_dicts = st.fixed_dictionaries(
    {}, optional={f: _section_strategy(f) for f in ("node", "transport", "heartbeat", "scheduler", "buffers", "link")}
)


def _load(path: Path) -> Config | str:
    try:
        return Config.from_file(path, env={})
    except ConfigError as exc:
        return str(exc).removeprefix(f"{path}: ")


@settings(max_examples=150, deadline=None)
@given(_config_dicts)
def test_the_same_dict_through_toml_and_yaml_gives_equal_configs_or_equal_errors(data):
    with tempfile.TemporaryDirectory() as d:
        toml_path, yaml_path = Path(d, "node.toml"), Path(d, "node.yaml")
        toml_path.write_text(_to_toml(data), encoding="utf-8")
        yaml_path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
        from_toml, from_yaml = _load(toml_path), _load(yaml_path)
    event("valid" if isinstance(from_toml, Config) else "refused")
    if isinstance(from_toml, Config) and isinstance(from_yaml, Config):
        a, b = from_toml.to_dict(), from_yaml.to_dict()
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # -0.0 == 0.0 aside, exactly
    else:
        assert from_toml == from_yaml


def test_round_trip_checker_sees_a_difference():
    """The property above can fail: a value that differs between the files is caught."""
    with tempfile.TemporaryDirectory() as d:
        Path(d, "a.toml").write_text(_to_toml({"heartbeat": {"interval": 0.2}}))
        Path(d, "a.yaml").write_text(yaml.safe_dump({"heartbeat": {"interval": 0.3}}))
        assert _load(Path(d, "a.toml")) != _load(Path(d, "a.yaml"))
