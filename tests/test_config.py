import pytest

from aionet.config import Config, parse_size
from aionet.errors import ConfigError


def test_defaults_exist_for_every_key():
    cfg = Config.from_dict({}, env={})
    assert cfg.heartbeat.interval == 0.2
    assert cfg.security.allow_pickle is False
    assert cfg.node.listen == ["tcp://127.0.0.1:0"]


def test_toml_file_and_env_override(tmp_path):
    p = tmp_path / "node.toml"
    p.write_text(
        '[node]\nname = "a"\nlisten = "tcp://127.0.0.1:0"\njoin = ["tcp://127.0.0.1:1"]\n'
        '[codec]\ncompression = "lz4"\n[transport]\ntcp = { nodelay = false }\n'
    )
    cfg = Config.from_file(p, env={"AIONET_NODE_NAME": "b", "AIONET_HEARTBEAT_INTERVAL": "0.5",
                                   "AIONET_TRANSPORT_ZMQ": '{"hwm": 10}', "UNRELATED": "x"})
    assert cfg.node.name == "b"
    assert cfg.node.listen == ["tcp://127.0.0.1:0"]
    assert cfg.node.join == ["tcp://127.0.0.1:1"]
    assert cfg.codec.compression == "lz4"
    assert cfg.transport.tcp == {"nodelay": False}
    assert cfg.transport.zmq == {"hwm": 10}
    assert cfg.heartbeat.interval == 0.5


def test_unknown_key_is_named_with_suggestion():
    with pytest.raises(ConfigError, match=r"node\.nmae.*did you mean 'name'"):
        Config.from_dict({"node": {"nmae": "x"}}, env={})


def test_unknown_section_is_named():
    with pytest.raises(ConfigError, match="'heartbaet'.*did you mean 'heartbeat'"):
        Config.from_dict({"heartbaet": {}}, env={})


def test_unknown_env_key_is_an_error():
    with pytest.raises(ConfigError, match="AIONET_NODE_LISTN"):
        Config.from_dict({}, env={"AIONET_NODE_LISTN": "tcp://x:1"})


@pytest.mark.parametrize(
    "data, match",
    [
        ({"heartbeat": {"interval": "fast"}}, "heartbeat.interval must be a number"),
        ({"codec": {"compression": "zstd"}}, "compression must be"),
        ({"security": {"allow_pickle": "maybe"}}, "boolean"),
        ({"limits": {"max_frames": 0}}, "positive"),
        ({"node": {"join": [1, 2]}}, "list of strings"),
    ],
)
def test_bad_values(data, match):
    with pytest.raises(ConfigError, match=match):
        Config.from_dict(data, env={})


def test_bad_toml_names_the_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[node\nname=")
    with pytest.raises(ConfigError, match="bad.toml"):
        Config.from_file(p, env={})


def test_parse_size():
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size("512 MiB") == 512 * 2**20
    assert parse_size(17) == 17
    with pytest.raises(ConfigError):
        parse_size("lots")
