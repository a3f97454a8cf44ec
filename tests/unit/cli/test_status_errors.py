"""`aionet status|info|trace` name the address a failure happened at once, not once per layer."""

from aionet.cli.status import failure
from aionet.errors import PeerUnavailable


def test_an_error_that_names_the_url_is_not_prefixed_again():
    exc = PeerUnavailable("tcp://127.0.0.1:7700: peer 'a' requires a cluster token")
    assert failure(["tcp://127.0.0.1:7700"], exc) == "tcp://127.0.0.1:7700: peer 'a' requires a cluster token"


def test_an_error_without_the_url_gets_it():
    assert failure(["tcp://a.example:7700"], TimeoutError()) == "tcp://a.example:7700: TimeoutError"


def test_several_seeds_are_all_named_when_none_is_in_the_message():
    assert failure(["tcp://a.example:1", "tcp://b.example:1"], OSError("refused")) == (
        "tcp://a.example:1 tcp://b.example:1: refused"
    )
