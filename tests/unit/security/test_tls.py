"""TLS context policy (aionet.security.tls): TLS 1.3 only, verification only with a CA."""

import ssl

import pytest

from aionet.errors import ConfigError, TransportUnavailable
from aionet.security import generate, make_context, tls_backend

pytestmark = pytest.mark.skipif(tls_backend() == "none", reason="needs cryptography or the openssl CLI")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("keys"))


def test_without_ca_encrypts_but_does_not_verify(keys):
    server = make_context(str(keys.node_cert), str(keys.node_key), server=True)
    client = make_context(str(keys.node_cert), str(keys.node_key), server=False)
    for ctx in (server, client):
        assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3
        assert ctx.verify_mode == ssl.CERT_NONE
    assert not client.check_hostname


def test_with_ca_is_mutual(keys):
    cert, key, ca = str(keys.node_cert), str(keys.node_key), str(keys.ca_cert)
    assert make_context(cert, key, ca, server=True).verify_mode == ssl.CERT_REQUIRED
    client = make_context(cert, key, ca, server=False)
    assert client.verify_mode == ssl.CERT_REQUIRED
    assert not client.check_hostname  # off unless asked: nodes are often dialed by IP
    assert make_context(cert, key, ca, server=False, check_hostname=True).check_hostname


def test_check_hostname_needs_a_ca(keys):
    with pytest.raises(ConfigError, match="security.tls_ca"):
        make_context(str(keys.node_cert), str(keys.node_key), server=False, check_hostname=True)


def test_missing_files_are_named(keys, tmp_path):
    with pytest.raises(TransportUnavailable, match=f"key {tmp_path}/nope.key.*aionet keys DIR"):
        make_context(str(keys.node_cert), str(tmp_path / "nope.key"), server=True)
    with pytest.raises(TransportUnavailable, match=f"CA file not found: {tmp_path}/ca.pem"):
        make_context(str(keys.node_cert), str(keys.node_key), str(tmp_path / "ca.pem"), server=True)


def test_key_not_matching_certificate(keys, tmp_path):
    other = generate(tmp_path / "other")
    with pytest.raises(TransportUnavailable, match="cannot load certificate"):
        make_context(str(keys.node_cert), str(other.node_key), server=True)
