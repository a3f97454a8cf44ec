"""Test-cluster key generation (aionet.security.keys)."""

import stat

import pytest

from aionet.security import KeygenError, generate, new_token, tls_backend
from aionet.security.keys import ALL_FILES


def test_new_token_is_random_text():
    a, b = new_token(), new_token()
    assert a != b and len(a) >= 32
    assert a.decode().isascii()


@pytest.mark.skipif(tls_backend() == "none", reason="needs cryptography or the openssl CLI")
def test_generate_writes_secrets_private_and_refuses_to_overwrite(tmp_path):
    ks = generate(tmp_path)
    for path in (ks.token_file, ks.ca_key, ks.node_key):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert f'token_file = "{ks.token_file}"' in ks.config_snippet()
    with pytest.raises(KeygenError, match="--force"):
        generate(tmp_path)
    before = ks.token_file.read_bytes()
    generate(tmp_path, force=True)
    assert ks.token_file.read_bytes() != before
    assert {p.name for p in tmp_path.iterdir()} <= set(ALL_FILES)


def test_generate_rejects_bad_arguments(tmp_path):
    with pytest.raises(KeygenError, match="days must be positive"):
        generate(tmp_path, days=0)
    with pytest.raises(KeygenError, match="unknown TLS backend"):
        generate(tmp_path, backend="gpg")
