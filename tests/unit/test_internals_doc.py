"""docs/internals.md names every module of the package, so the map a contributor reads stays true."""

from __future__ import annotations

import re
from pathlib import Path

import aionet

PACKAGE = Path(aionet.__file__).parent
DOC = PACKAGE.parent / "docs" / "internals.md"


def modules() -> set[str]:
    """Every Python module of the package, as a path relative to ``aionet/``."""
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}


def named_in_doc(text: str) -> set[str]:
    """Module paths in the first column of the page's tables (``| `cli/serve.py` | ...``)."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Za-z0-9_/]+\.py)`", line.split("|")[1]))
    return names


def test_every_module_has_a_line_in_internals_md() -> None:
    missing = sorted(modules() - named_in_doc(DOC.read_text()))
    assert not missing, f"add these modules to docs/internals.md: {missing}"


def test_internals_md_names_no_module_that_is_gone() -> None:
    stale = sorted(named_in_doc(DOC.read_text()) - modules())
    assert not stale, f"docs/internals.md names modules that no longer exist: {stale}"
