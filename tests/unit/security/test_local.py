"""The loopback rule (aionet.security.local): which addresses count as this host."""

import socket

import pytest

from aionet.security import is_local_address, is_local_host, is_loopback_host
from aionet.transports import Address


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.8.9.1", "::1"])
def test_loopback_hosts(host):
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", ["", "10.1.2.3", "0.0.0.0", "::", "example.com", "localhost.example.com", "fe80::1"])
def test_not_loopback_hosts(host):
    assert not is_loopback_host(host)


@pytest.mark.parametrize(
    "url",
    [
        "tcp://127.0.0.1:5",
        "tcp://127.8.9.1:5",
        "tls://localhost:7700",
        "TCP://LOCALHOST:5",  # schemes and hosts compare case-insensitively, as Address.parse does
        "tcp://[::1]:5",
        "zmq+tcp://127.0.0.1:5",
        "inproc://x",
        "inproc://",
        "zmq+ipc:///tmp/a.sock",
    ],
)
def test_local_addresses(url):
    assert is_local_address(url)


@pytest.mark.parametrize(
    "url",
    [
        "tcp://10.1.2.3:5",
        "tcp://0.0.0.0:5",  # a wildcard is where a node listens, never where a peer comes from
        "tcp://[2001:db8::1]:5",
        "tcp://example.com:5",
        "garbage",
        "",
        "127.0.0.1:5",  # no scheme: not a transport URL
        "tcp://127.0.0.1:99999",  # bad port: not a valid URL, so not trusted as local
        "tcp://127.0.0.1:x",
    ],
)
def test_not_local_addresses(url):
    assert not is_local_address(url)


@pytest.mark.parametrize("url", ["tcp://127.0.0.1:5", "tcp://[::1]:5", "TLS://LocalHost:1", "inproc://a", "tcp://h:1"])
def test_parse_agrees_with_transport_address(url):
    """The rule reads scheme and host as the transports do, so both sides agree on a URL."""
    a = Address.parse(url)
    assert is_local_address(url) == (a.scheme in ("inproc", "zmq+ipc") or is_loopback_host(a.host))


def test_local_host_is_this_machine():
    assert is_local_host("127.0.0.1")
    assert is_local_host("localhost")
    assert is_local_host(socket.gethostname())
    assert not is_local_host("192.0.2.1")  # TEST-NET-1: never bound here
    assert not is_local_host("no-such-host.invalid")  # names other than our own are not resolved
