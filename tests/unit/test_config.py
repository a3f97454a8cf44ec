import pytest

from aionet.config import Config, parse_size
from aionet.errors import ConfigError
from aionet.security import load_token


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
    cfg = Config.from_file(
        p,
        env={
            "AIONET_NODE_NAME": "b",
            "AIONET_HEARTBEAT_INTERVAL": "0.5",
            "AIONET_TRANSPORT_ZMQ": '{"hwm": 10}',
            "UNRELATED": "x",
        },
    )
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
        ({"collectives": {"pipeline_segments": 0}}, "pipeline_segments must be between 1 and 64, not 0"),
        ({"collectives": {"pipeline_segments": 65}}, "pipeline_segments must be between 1 and 64"),
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


EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "configs"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_example_configs_load_and_their_transport_options_are_accepted(path, tmp_path):
    """The shipped snippets must stay valid as options change: unknown keys are errors."""
    import zmq

    from aionet.security.keys import generate
    from aionet.transports.registry import TransportRegistry

    keys = generate(tmp_path / "keys")
    text = path.read_text()
    for name in ("token", "curve.public", "curve.secret"):
        text = text.replace(f'"keys/{name}"', f'"{keys.directory / name}"')
    text = text.replace('"node.pem"', f'"{keys.node_cert}"').replace('"node.key"', f'"{keys.node_key}"')
    text = text.replace('"ca.pem"', f'"{keys.ca_cert}"')
    p = tmp_path / path.name
    p.write_text(text)
    cfg = Config.from_file(p, env={})
    scheme = cfg.node.listen[0].split("://")[0]
    options = dict(cfg.transport.__dict__)
    sec = cfg.security
    options["tls"] = {"cert": sec.tls_cert, "key": sec.tls_key, "ca": sec.tls_ca, **cfg.transport.tls}
    if scheme in ("ucx", "rdma"):
        return  # optional extras / hardware: their option names are checked in their own tests
    if scheme.startswith("zmq") and "curve_public_key_file" in cfg.transport.zmq and not zmq.has("curve"):
        pytest.skip("libzmq without CURVE")
    TransportRegistry().get(cfg.node.listen[0], options, cfg.limits)


def test_byte_sizes_accept_units_and_name_the_key_when_wrong():
    cfg = Config.from_dict({"link": {"mailbox_bytes": "4MiB"}, "limits": {"max_frame_bytes": "1GiB"}}, env={})
    assert cfg.link.mailbox_bytes == 4 << 20 and cfg.limits.max_frame_bytes == 1 << 30
    with pytest.raises(ConfigError, match="link.mailbox_bytes"):
        Config.from_dict({"link": {"mailbox_bytes": "lots"}}, env={})
    with pytest.raises(ConfigError, match="mailbox_bytes must be positive"):
        Config.from_dict({"link": {"mailbox_bytes": 0}}, env={})


def test_byte_sizes_from_the_environment_accept_units_as_the_file_does():
    # the README writes sizes as "8MiB"; an AIONET_ override of the same key must take them too
    env = {"AIONET_LINK_BIG_COPY_MAX_BYTES": "8MiB", "AIONET_COLLECTIVES_SEGMENT_BYTES": "4MiB"}
    cfg = Config.from_dict({}, env=env)
    assert cfg.link.big_copy_max_bytes == 8 << 20 and cfg.collectives.segment_bytes == 4 << 20
    with pytest.raises(ConfigError, match=r"link\.mailbox_bytes \(from AIONET_LINK_MAILBOX_BYTES\) must be a size"):
        Config.from_dict({}, env={"AIONET_LINK_MAILBOX_BYTES": "lots"})
    with pytest.raises(ConfigError, match="must be an integer"):  # not a size: no units
        Config.from_dict({}, env={"AIONET_COLLECTIVES_PIPELINE_SEGMENTS": "2MiB"})


def test_relative_paths_in_a_config_file_are_relative_to_the_file(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    (conf / "keys").mkdir(parents=True)
    (conf / "keys" / "token").write_text("s3cret\n")
    (conf / "node.toml").write_text(
        '[security]\ntoken_file = "keys/token"\ntls_cert = "keys/node.pem"\ntls_key = "/abs/node.key"\n'
        'tls_ca = "../ca.pem"\n[transport]\ntls = { cert = "c.pem", nodelay = true }\n'
        'zmq = { curve_public_key_file = "keys/curve.public", curve_allowed_clients = ["clients", "/x/a.key"] }\n'
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = Config.from_file("../conf/node.toml", env={})
    assert cfg.security.token_file == str(conf / "keys" / "token")
    assert load_token(cfg.security) == b"s3cret"
    assert cfg.security.tls_cert == str(conf / "keys" / "node.pem")
    assert cfg.security.tls_key == "/abs/node.key"
    assert cfg.security.tls_ca == str(conf / ".." / "ca.pem")
    assert cfg.transport.tls == {"cert": str(conf / "c.pem"), "nodelay": True}
    assert cfg.transport.zmq["curve_public_key_file"] == str(conf / "keys" / "curve.public")
    assert cfg.transport.zmq["curve_allowed_clients"] == [str(conf / "clients"), "/x/a.key"]
    # environment overrides and dicts built in code stay relative to the working directory
    assert Config.from_file(conf / "node.toml", env={"AIONET_SECURITY_TOKEN_FILE": "t"}).security.token_file == "t"
    assert Config.from_dict({"security": {"token_file": "t"}}, env={}).security.token_file == "t"


def test_missing_token_file_names_the_file_and_how_to_make_it(tmp_path):
    p = tmp_path / "node.toml"
    p.write_text('[security]\ntoken_file = "keys/token"\n')
    cfg = Config.from_file(p, env={})
    want = f"{tmp_path}/keys/token does not exist; `aionet keys {tmp_path}/keys`"
    with pytest.raises(ConfigError, match=__import__("re").escape(want)):
        load_token(cfg.security)
