"""The scheduler's modules import one another in one direction only (type-checking imports
included), and none is over 800 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import aionet.scheduler

PKG = "aionet.scheduler"
DIR = Path(aionet.scheduler.__file__).parent
MAX_LINES = 800


def _imports(path: Path) -> set[str]:
    """Sibling modules ``path`` imports anywhere: top level, functions, ``if TYPE_CHECKING:``."""
    mods = {p.stem for p in DIR.glob("*.py")}
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                base = f"{PKG}.{node.module}" if node.module else PKG
            elif node.level == 0 and node.module:
                base = node.module
            else:
                continue  # ..x: outside the package
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for n in names:
            if n.startswith(PKG + "."):
                m = n[len(PKG) + 1 :].split(".")[0]
                if m in mods and m != path.stem:
                    out.add(m)
    return out


def graph() -> dict[str, set[str]]:
    return {p.stem: _imports(p) for p in DIR.glob("*.py") if p.stem != "__init__"}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state and (cyc := visit(m)) is not None:
                return cyc
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state and (cyc := visit(n)) is not None:
            return cyc
    return None


def test_find_cycle_sees_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_scheduler_imports_are_acyclic() -> None:
    g = graph()
    assert {"owner", "worker", "service", "state", "tasks", "wire"} <= set(g)
    cyc = find_cycle(g)
    assert cyc is None, "import cycle in aionet.scheduler: " + " -> ".join(cyc or ())


def test_layers_point_down() -> None:
    """Only the service drives the owner and the worker; the bottom modules import no state machine."""
    g = graph()
    for m, deps in g.items():
        if m != "service":
            assert not deps & {"service", "owner", "worker"} - {m}, f"{m} imports {sorted(deps)}"
    assert not g["wire"]
    assert g["tasks"] <= {"wire"}


def test_no_module_over_800_lines() -> None:
    for p in DIR.glob("*.py"):
        n = len(p.read_text().splitlines())
        assert n <= MAX_LINES, f"{p.name} has {n} lines (split it along its concerns)"
