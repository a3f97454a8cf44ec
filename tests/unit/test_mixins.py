"""Mixins say what they take from their host: every ``self.x`` a base class in aionet uses is
defined or set by that class (or its own bases), or declared as a class-level annotation, and
every such declaration names something a subclass really sets or defines.

A mixin (``LinkRecovery`` under ``Link``, ``GroupAlgorithms`` under ``Group``, ``Verification``
under ``Membership``) otherwise reads attributes that only the host's ``__init__`` creates,
and neither a reader nor a type checker can tell what it depends on. Read from the source
with ``ast``, like ``test_imports``.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def classes_in(sources: dict[str, str]) -> dict[str, list[tuple[str, ast.ClassDef]]]:
    """Class name -> [(source name, class node)] for every class in ``sources``."""
    out: dict[str, list[tuple[str, ast.ClassDef]]] = {}
    for where, src in sources.items():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append((where, node))
    return out


def base_names(cls: ast.ClassDef) -> list[str]:
    return [b.id if isinstance(b, ast.Name) else b.attr for b in cls.bases if isinstance(b, ast.Name | ast.Attribute)]


def self_attrs(cls: ast.ClassDef, ctx: type[ast.expr_context] | None = None) -> set[str]:
    """``x`` of every ``self.x`` in the class (only stores when ``ctx`` is ``ast.Store``)."""
    return {
        n.attr
        for n in ast.walk(cls)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
        and (ctx is None or isinstance(n.ctx, ctx))
    }


def defined(cls: ast.ClassDef) -> tuple[set[str], set[str]]:
    """(what the class body defines or its methods set on self, its value-less annotations)."""
    names, declared = self_attrs(cls, ast.Store), set()
    for st in cls.body:
        if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(st.name)
        elif isinstance(st, ast.Assign):
            names.update(t.id for t in st.targets if isinstance(t, ast.Name))
        elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            (names if st.value is not None else declared).add(st.target.id)
    return names, declared


def undeclared(sources: dict[str, str]) -> dict[str, list[str]]:
    """``where:Class`` -> the self attributes a base class uses but neither has nor declares."""
    classes = classes_in(sources)
    used_as_base = {b for entries in classes.values() for _, c in entries for b in base_names(c)}

    def has(cls: ast.ClassDef, seen: frozenset[str]) -> set[str]:
        names, declared = defined(cls)
        names |= declared
        for b in base_names(cls):
            if b not in seen:
                for _, bc in classes.get(b, []):
                    names |= has(bc, seen | {b})
        return names

    out = {}
    for name in sorted(used_as_base):
        for where, cls in classes.get(name, []):
            missing = sorted(self_attrs(cls) - has(cls, frozenset({name})) - {"__class__", "__dict__"})
            if missing:
                out[f"{where}:{name}"] = missing
    return out


def phantom_declarations(sources: dict[str, str]) -> dict[str, list[str]]:
    """``where:Class`` -> declared attributes that neither a subclass nor the class itself sets
    or defines."""
    classes = classes_in(sources)
    out = {}
    for entries in classes.values():
        for where, cls in entries:
            _, declared = defined(cls)
            if not declared or cls.decorator_list:
                continue  # nothing declared, or fields of a dataclass-like class
            subs = [c for es in classes.values() for _, c in es if cls.name in base_names(c)]
            if not subs:
                continue  # not used as a base here: its annotations are its own fields
            # what a subclass sets or defines, or the class itself sets (its own typed state)
            provided = set().union(*(defined(s)[0] for s in subs), defined(cls)[0])
            if declared - provided:
                out[f"{where}:{cls.name}"] = sorted(declared - provided)
    return out


def aionet_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "aionet").rglob("*.py"))}


def test_reader_finds_an_undeclared_host_attribute_and_a_phantom_declaration() -> None:
    """The checks below can fail: a mixin reading the host's ``peer`` without declaring it is
    found, declaring it clears it, and a declaration no host provides is found too."""
    src = textwrap.dedent(
        """
        class Mixin:
            def hello(self):
                return self.peer + self.own

            def set_own(self):
                self.own = 1

        class Host(Mixin):
            def __init__(self):
                self.peer = "b"
        """
    )
    assert undeclared({"m.py": src}) == {"m.py:Mixin": ["peer"]}
    declared = src.replace("class Mixin:\n", "class Mixin:\n    peer: str\n    ghost: int\n")
    assert undeclared({"m.py": declared}) == {}
    assert phantom_declarations({"m.py": declared}) == {"m.py:Mixin": ["ghost"]}


def test_every_mixin_declares_the_host_attributes_it_uses() -> None:
    missing = undeclared(aionet_sources())
    assert not missing, (
        "these base classes use self attributes set only by a subclass; declare them as class-level"
        f" annotations (no value) on the base: {missing}"
    )


def test_every_declared_host_attribute_exists_on_a_host() -> None:
    phantom = phantom_declarations(aionet_sources())
    assert not phantom, f"declared on a mixin but set or defined by no subclass; drop them: {phantom}"
