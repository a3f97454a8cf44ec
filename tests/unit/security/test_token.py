"""Loading the cluster token (aionet.security.token)."""

import re

import pytest

from aionet.config import Config
from aionet.errors import ConfigError
from aionet.security import load_token


def section(**security):
    return Config.from_dict({"security": security}, env={}).security


def test_no_token_is_none():
    assert load_token(section()) is None


def test_inline_token():
    assert load_token(section(token="s3cret")) == b"s3cret"


def test_inline_token_wins_over_file(tmp_path):
    (tmp_path / "token").write_text("from-file")
    assert load_token(section(token="inline", token_file=str(tmp_path / "token"))) == b"inline"


def test_token_file_is_stripped(tmp_path):
    (tmp_path / "token").write_bytes(b"  abc\n")
    assert load_token(section(token_file=str(tmp_path / "token"))) == b"abc"


def test_environment_override_reaches_the_token():
    cfg = Config.from_dict({"security": {"token": "file"}}, env={"AIONET_SECURITY_TOKEN": "env"})
    assert load_token(cfg.security) == b"env"


def test_missing_token_file_says_how_to_make_one(tmp_path):
    want = f"{tmp_path}/token does not exist; `aionet keys {tmp_path}` writes a cluster token"
    with pytest.raises(ConfigError, match=re.escape(want)):
        load_token(section(token_file=str(tmp_path / "token")))
    with pytest.raises(ConfigError, match=re.escape("`aionet keys DIR`")):
        load_token(section(token_file=str(tmp_path / "secret.txt")))


def test_unreadable_token_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="security.token_file: cannot read"):
        load_token(section(token_file=str(tmp_path)))  # a directory
