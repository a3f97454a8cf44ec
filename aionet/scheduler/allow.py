"""Which task functions a node runs: ``scheduler.allow_modules`` and the modules never run.

A task names its function by import path, and any accepted peer can submit one, so the path
is untrusted input. A node runs a function only when

1. its module is named by the node's own ``scheduler.allow_modules`` (a module name matches an
   entry equal to it or starting with the entry and a dot; ``aionet serve --app pkg.mod:setup``
   adds ``pkg``) or that list is ``["*"]`` (anything installed: for trusted clusters only, as
   installed third-party code can run commands too);
2. its module is not one that is never run, whatever the list says: the whole Python standard
   library (``sys.stdlib_module_names``: os, subprocess, pickle, marshal, builtins, importlib,
   runpy, code, ctypes, shutil, pty, socket, asyncio, timeit, pydoc, ... any of which runs
   commands, unpickles, executes code or touches files), ``__main__``, CPython's ``test``
   package, aionet itself, pip/setuptools and the pickle extensions cloudpickle and dill.

Both are decided on the module NAME before anything is imported (importing runs code). After
the import the resolved object is checked again: the path may not walk through a module or a
dunder attribute (``mypkg.tasks:os.system``), and the function must be defined in an allowed,
never-refused module (``from subprocess import run`` in an allowed module does not make
``mypkg.tasks:run`` runnable).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable
from typing import Any

from ..errors import ConfigError

__all__ = [
    "ALLOW_ANY",
    "NEVER_RUN",
    "app_packages",
    "is_never_run",
    "never_run_reason",
    "normalize_allow",
    "refuse_name",
    "refuse_object",
]

ALLOW_ANY = "*"

# Beyond the standard library: modules that run code, unpickle or install packages, and aionet
# itself (its CLI starts nodes; nothing in it is a task).
NEVER_RUN: frozenset[str] = frozenset(
    {"__main__", "test", "aionet", "pip", "setuptools", "pkg_resources", "_distutils_hack", "cloudpickle", "dill"}
)

#: the one aionet module whose functions may run as tasks (when allowed): no-ops and sleeps for
#: `aionet bench tasks`, nothing that runs commands or takes code
BENCH_TASKS = "aionet.testing.benchtasks"

_HOW = "add it (or its package) to scheduler.allow_modules in that node's config (env AIONET_SCHEDULER_ALLOW_MODULES)"


def _top(module: str) -> str:
    return module.partition(".")[0]


def is_never_run(module: str) -> bool:
    """True for a module no node runs tasks from, whatever ``scheduler.allow_modules`` says."""
    top = _top(module)
    return module != BENCH_TASKS and (top in sys.stdlib_module_names or top in NEVER_RUN)


def never_run_reason(module: str) -> str:
    top = _top(module)
    what = "part of the Python standard library" if top in sys.stdlib_module_names else "on aionet's never-run list"
    return (
        f"module {module!r} is {what}, and a node never runs tasks from it whatever scheduler.allow_modules says "
        "(it could run commands, unpickle or execute code); call what you need from a function in a module of your "
        "own and allow that module"
    )


def _valid_name(module: str) -> bool:
    return bool(module) and all(part.isidentifier() for part in module.split("."))


def normalize_allow(entries: Iterable[Any], what: str = "scheduler.allow_modules") -> tuple[str, ...]:
    """Validate ``allow_modules`` entries: module names or prefixes (``"mypkg"``,
    ``"mypkg.tasks"``) or ``"*"``. Naming a never-run module is an error: it can never work."""
    out: list[str] = []
    for entry in entries:
        if not isinstance(entry, str):
            raise ConfigError(f"{what}: entries must be module names, not {entry!r}")
        name = entry.strip()
        if name == ALLOW_ANY:
            out.append(name)
            continue
        if not _valid_name(name):
            raise ConfigError(f"{what}: {entry!r} is not a module name (e.g. 'mypkg' or 'mypkg.tasks', or '*')")
        if is_never_run(name):
            raise ConfigError(f"{what}: {never_run_reason(name)}")
        if name not in out:
            out.append(name)
    return tuple(out)


def app_packages(apps: Iterable[str]) -> list[str]:
    """The top-level packages of ``--app pkg.mod:setup`` specs, for ``scheduler.allow_modules``
    (never-run or malformed names are skipped: the app loader reports those)."""
    out: list[str] = []
    for spec in apps:
        top = _top(spec.partition(":")[0].strip())
        if _valid_name(top) and not is_never_run(top) and top not in out:
            out.append(top)
    return out


def _allowed(module: str, allow: tuple[str, ...]) -> bool:
    return any(p == ALLOW_ANY or module == p or module.startswith(p + ".") for p in allow)


def refuse_name(path: str, allow: tuple[str, ...]) -> str | None:
    """Why the function at ``path`` ("pkg.mod:fn") may not run here, or None. Imports nothing."""
    module, _, attr = path.partition(":")
    if not _valid_name(module) or not attr or not all(p.isidentifier() for p in attr.split(".")):
        return f"{path!r} is not a task function path ('pkg.module:function')"
    if is_never_run(module):
        return never_run_reason(module)
    if any(p.startswith("__") for p in attr.split(".")):
        return f"{path!r} names a dunder attribute; tasks run module-level functions and class attributes only"
    if not _allowed(module, allow):
        if not allow:
            listed = "scheduler.allow_modules is empty, so this node runs no tasks"
        else:
            listed = f"module {module!r} is not in its scheduler.allow_modules {list(allow)}"
        return (
            f"{listed}; to run it there, {_HOW}, e.g. allow_modules = [{_top(module)!r}], or start it with "
            f"`aionet serve --app {module}:<setup>`"
        )
    return None


def refuse_object(path: str, obj: Any, hops: list[Any], allow: tuple[str, ...]) -> str | None:
    """Checks after the import: ``hops`` are the objects walked through after the module
    (``Cls`` for ``mod:Cls.method``), ``obj`` is the resolved function."""
    for hop in hops:
        if isinstance(hop, types.ModuleType):
            return f"{path!r} reaches through the module {hop.__name__!r}; name the function's own module instead"
    defined = getattr(obj, "__module__", None)
    if not isinstance(defined, str):
        defined = type(obj).__module__
    if is_never_run(defined):
        return f"{path!r} is defined in {defined!r}: {never_run_reason(defined)}"
    if not _allowed(defined, allow):
        return (
            f"{path!r} is defined in module {defined!r}, which is not in scheduler.allow_modules {list(allow)}; {_HOW}"
        )
    return None
