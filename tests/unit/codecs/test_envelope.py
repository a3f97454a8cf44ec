"""Envelope kinds: defined once (codecs/envelope.py), unique, and the same numbers as before
the restructuring (the wire format must not change)."""

from __future__ import annotations

import ast
from enum import IntEnum
from pathlib import Path

import pytest

from aionet.codecs import envelope
from aionet.codecs.envelope import CONTROL_MIN, HandshakeKind, Kind, SchedKind, is_sequenced

ROOT = Path(__file__).resolve().parents[3]

# The wire values as they were spread over router.py, link.py, membership.py,
# codecs/handshake.py and scheduler/tasks.py (and bare 8 / 11 literals) before issue 12.
WIRE: dict[type[IntEnum], dict[str, int]] = {
    Kind: {
        "SEND": 1,
        "REQ": 2,
        "REP": 3,
        "ERR": 4,
        "PEERS": 5,
        "BYE": 6,
        "ACK": 7,
        "XFER": 8,
        "CANCEL": 9,
        "HB": 11,
        "HB_ACK": 12,
        "PROBE_REQ": 13,
        "PROBE_RSP": 14,
        "GOSSIP": 15,
        "INLINE_SERVICES": 16,
    },
    HandshakeKind: {"HELLO": 0, "REJECT": 9, "CONFIRM": 10, "WELCOME": 11, "RESUME": 12},
    SchedKind: {"SUBMIT": 1, "CANCEL": 2, "FREE": 3, "RESULTS": 4, "LOAD": 5, "RECONCILE": 6, "DEPARTED": 7},
}
PREFIX = {Kind: "", HandshakeKind: "", SchedKind: "M_"}  # module constant = PREFIX + member name


def constant_names() -> set[str]:
    return {PREFIX[e] + m.name for e in WIRE for m in e}


@pytest.mark.parametrize("enum", list(WIRE), ids=lambda e: e.__name__)
def test_values_are_the_previous_wire_values(enum: type[IntEnum]) -> None:
    assert {m.name: m.value for m in enum} == WIRE[enum]


@pytest.mark.parametrize("enum", list(WIRE), ids=lambda e: e.__name__)
def test_no_two_kinds_collide(enum: type[IntEnum]) -> None:
    values = [m.value for m in enum]
    assert len(values) == len(set(values)) == len(enum.__members__)  # no aliases either


def test_handshake_kinds_a_link_could_confuse_are_phase_separated() -> None:
    """HELLO and CONFIRM are told from link traffic by value; REJECT, WELCOME and RESUME share
    CANCEL's, HB's and HB_ACK's values, safe only because they are read before a link exists
    on the connection (a link message always follows the handshake's last one) and are
    therefore not link kinds a reader might dispatch."""
    link_values = {k.value for k in Kind}
    assert {HandshakeKind.HELLO, HandshakeKind.CONFIRM}.isdisjoint(link_values)
    assert {k.value for k in HandshakeKind} & link_values == {Kind.CANCEL, Kind.HB, Kind.HB_ACK}


def test_module_constants_are_plain_ints_of_the_members() -> None:
    """The hot path compares the module constants: plain ints (no enum subclass), in step."""
    for enum in WIRE:
        for m in enum:
            const = getattr(envelope, PREFIX[enum] + m.name)
            assert type(const) is int and const == m.value, (enum.__name__, m.name)
    assert set(envelope.__all__) >= constant_names()


def test_sequenced_and_control_kinds_keep_their_rules() -> None:
    # link.py's old rule: kinds 1..6 and 8 (XFER) are sequenced, and 9 (CANCEL) since; node.py's:
    # control kinds >= 11
    for kind in range(-2, 40):
        assert is_sequenced(kind) == (1 <= kind <= 6 or kind in (8, 9)), kind
    assert CONTROL_MIN == 11
    controls = [Kind.HB, Kind.HB_ACK, Kind.PROBE_REQ, Kind.PROBE_RSP, Kind.GOSSIP, Kind.INLINE_SERVICES]
    assert [k for k in Kind if k >= CONTROL_MIN] == controls
    assert not any(is_sequenced(k) for k in Kind if k >= Kind.ACK and k not in (Kind.XFER, Kind.CANCEL))


def kind_definitions_outside_envelope(root: Path = ROOT) -> list[str]:
    """Places under ``root/aionet`` that define a kind constant themselves (``SEND = 1``, ...)
    instead of importing it from codecs/envelope.py, or that compare a kind with a bare int
    literal (``kind < 11``, ``env[0] == 8``) or register a control handler for one."""
    names = constant_names() | {"SEQUENCED_MAX"}
    found: list[str] = []
    for path in sorted((root / "aionet").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "aionet/codecs/envelope.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                # an int in the value: a kind number (a transport's ACK = b"..." frame tag is not)
                if any(isinstance(v, ast.expr) and _is_int(v) for v in ast.walk(node.value)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for leaf in ast.walk(t):
                    if isinstance(leaf, ast.Name) and leaf.id in names:
                        found.append(f"{rel}:{node.lineno}: defines {leaf.id}")
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_is_kind_expr(s) for s in sides) and any(_is_int(s) for s in sides):
                    found.append(f"{rel}:{node.lineno}: compares a kind with a bare int")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_control_handler"
                and node.args
                and _is_int(node.args[0])
            ):
                found.append(f"{rel}:{node.lineno}: control handler for a bare int kind")
    return found


def _is_int(e: ast.expr) -> bool:
    if isinstance(e, ast.UnaryOp):
        e = e.operand
    return isinstance(e, ast.Constant) and type(e.value) is int


def _is_kind_expr(e: ast.expr) -> bool:
    """``kind`` or ``env[0]`` / ``msg[0]`` / ``envelope[0]``: how aionet reads an envelope's kind."""
    if isinstance(e, ast.Name):
        return e.id == "kind"
    return (
        isinstance(e, ast.Subscript)
        and isinstance(e.value, ast.Name)
        and e.value.id in ("env", "msg", "envelope")
        and isinstance(e.slice, ast.Constant)
        and e.slice.value == 0
    )


def test_every_kind_is_defined_in_envelope_only() -> None:
    assert kind_definitions_outside_envelope() == []


def test_the_scan_finds_scattered_definitions(tmp_path: Path) -> None:
    """The scan above can fail: it flags the shapes the kinds had before issue 12."""
    pkg = tmp_path / "aionet"
    pkg.mkdir()
    (pkg / "router.py").write_text('SEND = 1\nXFER: int = 8\nACK = b"\\x07"  # a frame tag: not flagged\n')
    (pkg / "node.py").write_text(
        "def f(kind, env, node):\n"
        "    if kind < 11 or env[0] == 8:\n"
        "        node.add_control_handler(16, f)\n"
        "    return kind == SEND\n"
    )
    found = kind_definitions_outside_envelope(tmp_path)
    assert len(found) == 5, found
    assert any("defines SEND" in f for f in found) and any("defines XFER" in f for f in found)
