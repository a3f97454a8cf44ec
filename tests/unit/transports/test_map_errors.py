"""map_errors: library exceptions become aionet errors once, at the transport boundary."""

from __future__ import annotations

import errno

import pytest

from aionet.errors import ConnectionClosed, ConnectTimeout, TransportError
from aionet.transports.base import map_errors


def test_mapped_type_becomes_the_aionet_error_with_the_cause_chained() -> None:
    cause = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    mapping = {OSError: lambda e: TransportError(f"cannot connect to x: {e.strerror}")}
    with pytest.raises(TransportError, match="cannot connect to x: Connection refused") as info, map_errors(mapping):
        raise cause
    assert info.value.__cause__ is cause
    assert info.value.__suppress_context__


def test_unmapped_types_pass_through_untouched() -> None:
    original = KeyError("k")
    with pytest.raises(KeyError) as info, map_errors({OSError: lambda e: TransportError(str(e))}):
        raise original
    assert info.value is original


def test_aionet_errors_are_not_remapped() -> None:
    """TransportError subclasses ConnectionError, an OSError: an OSError key must not re-wrap it."""
    ours = ConnectionClosed("closed")
    with pytest.raises(ConnectionClosed) as info, map_errors({OSError: lambda e: TransportError(f"wrapped: {e}")}):
        raise ours
    assert info.value is ours


def test_base_exceptions_such_as_cancellation_are_never_mapped() -> None:
    import asyncio

    with pytest.raises(asyncio.CancelledError), map_errors({Exception: lambda e: TransportError(str(e))}):
        raise asyncio.CancelledError


def test_first_matching_entry_wins_so_subclasses_go_first() -> None:
    mapping = {
        TimeoutError: lambda e: ConnectTimeout("timed out"),  # TimeoutError is an OSError
        OSError: lambda e: TransportError("os error"),
    }
    with pytest.raises(ConnectTimeout), map_errors(mapping):
        raise TimeoutError
    with pytest.raises(TransportError) as info, map_errors(mapping):
        raise OSError(errno.EADDRINUSE, "Address in use")
    assert type(info.value) is TransportError
    # the order is the caller's: a base listed first shadows its subclasses
    shadowed = {OSError: lambda e: TransportError("os"), TimeoutError: lambda e: ConnectTimeout("t")}
    with pytest.raises(TransportError) as info, map_errors(shadowed):
        raise TimeoutError
    assert type(info.value) is TransportError


def test_tuple_keys_and_the_error_family_a_factory_picks() -> None:
    def classify(e: OSError) -> TransportError:
        return ConnectionClosed("peer went away") if e.errno == errno.ECONNRESET else TransportError("other")

    with pytest.raises(ConnectionClosed), map_errors({(BrokenPipeError, ConnectionResetError): classify}):
        raise ConnectionResetError(errno.ECONNRESET, "reset")


def test_no_exception_no_effect() -> None:
    with map_errors({OSError: lambda e: TransportError(str(e))}):
        value = 1
    assert value == 1
