"""Every built-in transport against the shipped conformance suite (``aionet.testing.transports``).

Each check runs once per scheme known to ``TransportRegistry().schemes()``. A scheme joins by
having an entry in ``SCHEMES`` below -- that table is the only thing to edit when a transport
is added. Schemes without an entry, whose module is missing, or whose ``check_available()``
raises TransportUnavailable are skipped with a reason naming what is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aionet.config import LimitsSection
from aionet.errors import TransportUnavailable
from aionet.testing.transports import CHECKS, Check, CheckSkipped, TransportSpec, run_check
from aionet.transports.registry import TransportRegistry


@dataclass(frozen=True)
class SchemeSpec:
    """How the suite exercises one built-in scheme (turned into a TransportSpec per test)."""

    #: listen URL for a fresh listener (port 0 / unique name / fresh path under tmp_path)
    listen: Callable[[Path], str]
    #: transport options used by the suite (and passed to the peer process), made from a
    #: session-wide scratch directory (for key material and the like)
    options: Callable[[Path], dict[str, Any]] = lambda scratch: {}
    wire: str | None = "stream"
    processes: bool = True
    shares_buffers: bool = False
    #: the registry scheme, when the table key names a variant of one (same transport, other options)
    transport: str = ""


def _tls_options(scratch: Path) -> dict[str, Any]:
    """A test CA, certificate and key (made once per session); mutual TLS with verification."""
    from aionet.security.keys import generate

    d = scratch / "tls-keys"
    if not (d / "node.pem").exists():
        try:
            generate(d, force=True)
        except Exception as exc:  # neither the cryptography package nor an openssl binary
            pytest.skip(f"tls: cannot generate test certificates: {exc}")
    return {"cert": str(d / "node.pem"), "key": str(d / "node.key"), "ca": str(d / "ca.pem")}


def _curve_options(scratch: Path) -> dict[str, Any]:
    """One CurveZMQ key pair for the session, shared by both ends (as `aionet keys` does)."""
    from aionet.security.keys import curve_keypair

    d = scratch / "curve-keys"
    if not (d / "curve.secret").exists():
        pair = curve_keypair()
        if pair is None:
            pytest.skip("zmq+tcp+curve: libzmq was built without CURVE")
        d.mkdir(parents=True, exist_ok=True)
        (d / "curve.public").write_bytes(pair[0] + b"\n")
        (d / "curve.secret").write_bytes(pair[1] + b"\n")
        (d / "curve.secret").chmod(0o600)
    return {"curve_public_key_file": str(d / "curve.public"), "curve_secret_key_file": str(d / "curve.secret")}


# The scheme table: the one place to add a built-in transport to the suite.
SCHEMES: dict[str, SchemeSpec] = {
    "tcp": SchemeSpec(lambda tmp: "tcp://127.0.0.1:0"),
    "tls": SchemeSpec(lambda tmp: "tls://127.0.0.1:0", options=_tls_options),
    "inproc": SchemeSpec(lambda tmp: "inproc://", wire=None, processes=False, shares_buffers=True),
    "zmq+tcp": SchemeSpec(lambda tmp: "zmq+tcp://127.0.0.1:0", wire="zmq"),
    "zmq+ipc": SchemeSpec(lambda tmp: f"zmq+ipc://{tmp}/s", wire="zmq"),
    # raw plaintext zmq peers cannot even finish the ZMTP handshake here (tests/integration/test_zmq_curve.py)
    "zmq+tcp+curve": SchemeSpec(lambda tmp: "zmq+tcp://127.0.0.1:0", options=_curve_options, transport="zmq+tcp"),
    "ucx": SchemeSpec(lambda tmp: "ucx://127.0.0.1:0"),
    "rdma": SchemeSpec(lambda tmp: "rdma://127.0.0.1:0", wire=None),
}

# checks the one-call smoke test leaves out (they move hundreds of MiB or fill queues)
SLOW = {"256mib_frame", "ordering_10000_both_directions"}


def _schemes() -> list[str]:
    return sorted(set(TransportRegistry().schemes()) | set(SCHEMES))


@pytest.fixture(params=_schemes())
def scheme(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name not in SCHEMES:
        pytest.skip(f"{name}: no entry in SCHEMES (tests/conformance/test_transports.py); add one to test it")
    try:
        cls = TransportRegistry().transport_class(SCHEMES[name].transport or name)
        cls.check_available()
    except TransportUnavailable as exc:
        pytest.skip(f"{name}: transport unavailable: {exc}")
    return name


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("conformance")


@pytest.mark.parametrize("check", CHECKS, ids=str)
async def test_transport_conformance(scheme: str, check: Check, tmp_path: Path, scratch: Path) -> None:
    s = SCHEMES[scheme]
    real = s.transport or scheme
    options = s.options(scratch)
    cls = TransportRegistry().transport_class(real)
    spec = TransportSpec(
        make=lambda: cls(dict(options), LimitsSection()),
        listen=s.listen,
        wire=s.wire,
        processes=s.processes,
        peer_options=options,
        shares_buffers=s.shares_buffers,
        scheme=real,
    )
    try:
        await run_check(check, spec, tmp_path)
    except CheckSkipped as exc:
        pytest.skip(f"{scheme}: {exc}")


async def test_check_transport_runs_the_whole_suite_in_one_call(tmp_path: Path) -> None:
    """What a third-party transport writes: one call, every check, a result per check."""
    from aionet.testing.transports import check_transport
    from aionet.transports.inproc import InprocTransport

    fast = {c.name for c in CHECKS if c.name in SLOW or "backpressure" in c.name}
    results = await check_transport(
        lambda: InprocTransport({}, LimitsSection()),
        "inproc://",
        tmp_path=tmp_path,
        skip=tuple(fast),
        wire=None,
        shares_buffers=True,
    )
    assert set(results) == {c.name for c in CHECKS}
    assert results["close_from_either_side[dialer]"] == "passed"
    assert results["peer_sigkill_gives_clean_connection_closed[connect]"].startswith("skipped")


async def test_a_broken_transport_fails_with_the_checks_name(tmp_path: Path) -> None:
    """The suite can fail: a transport that reorders messages is caught and named."""
    from aionet.testing.transports import check_transport
    from aionet.transports.inproc import InprocTransport

    class Reordering(InprocTransport):  # type: ignore[misc]
        async def connect(self, url: str, *, timeout: float | None = None) -> Any:
            conn = await super().connect(url, timeout=timeout)
            real_send, held = conn.send, []

            async def send(frames: list[Any]) -> None:
                if not held and frames and frames[0] == b"m0":
                    held.append(frames)  # hold the first message back, send it after the next
                    return
                await real_send(frames)
                while held:
                    await real_send(held.pop())

            conn.send = send
            return conn

    only = {"close_from_either_side[dialer]"}
    with pytest.raises(AssertionError, match=r"close_from_either_side\[dialer\]"):
        await check_transport(
            lambda: Reordering({}, LimitsSection()),
            "inproc://",
            tmp_path=tmp_path,
            skip=tuple(c.name for c in CHECKS if c.name not in only),
            wire=None,
            shares_buffers=True,
        )
