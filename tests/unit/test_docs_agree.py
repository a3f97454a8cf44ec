"""README.md, docs/*.md and benchmarks/README.md say what the code does: the checks a reader
would make by hand, made mechanical so that a renamed key, flag or function fails here first.

- config: every key a TOML block shows exists (in the README with its default, unless it is
  one of the few shown with an example value), every schema key is in the README's reference,
  every `section.key` named in prose exists with any default stated beside it, and every
  transport option is listed with its default in docs/transports.md;
- environment: every ``AIONET_*`` variable named is a config override or one the code reads;
- command line: every ``aionet <command> [OP] --flag`` written exists in the click tree, every
  ``--flag`` in prose belongs to some command or shipped script, every option is documented;
- Python: every ``python`` block parses; every ``aionet.X.Y``, class and exception named
  exists; ``node.X`` / ``grp.X`` / ``node.cache.X`` / ``ctx.X`` exist and the calls shown bind
  to their signatures; ``node.stats()`` paths, the members() example and the hook table match;
- files: every repository path, ``::test`` name, relative link, pip extra, example and
  benchmark script the docs name exists (and every script and example has a mention).

Pure: reads files and imports modules, opens no sockets.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import shlex
import tomllib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

import aionet
from aionet.config import Config

ROOT = Path(aionet.__file__).parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
#: keys the docs show with an example value on purpose (a name, addresses, a token path...)
EXAMPLE_KEYS = {
    "node.name",
    "node.listen",
    "node.join",
    "transport.tcp",
    "transport.tls",
    "transport.zmq",
    "scheduler.resources",
    "scheduler.allow_modules",
    "security.token_file",
    "security.tls_cert",
    "security.tls_key",
    "security.tls_ca",
}


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def fenced(path: Path, *langs: str) -> Iterator[tuple[int, str]]:
    """(line number, body) of each fenced block in ``path`` whose language is one of ``langs``."""
    text = path.read_text(encoding="utf-8")
    for m in FENCE.finditer(text):
        if m.group(1) in langs:
            yield text.count("\n", 0, m.start()) + 2, m.group(2)


def prose(path: Path) -> str:
    """The page without its fenced blocks."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


# ------------------------------------------------------------------ configuration keys
def schema() -> dict[str, Any]:
    """``section.key`` -> default, for every key of the config schema."""
    cfg = Config()
    out = {}
    for sec in dataclasses.fields(cfg):
        section = getattr(cfg, sec.name)
        for f in dataclasses.fields(section):
            out[f"{sec.name}.{f.name}"] = getattr(section, f.name)
    return out


def documented(paths: list[Path]) -> dict[str, tuple[str, Any]]:
    """``section.key`` -> (where, value) for every key set in a TOML block of ``paths``."""
    out: dict[str, tuple[str, Any]] = {}
    for path in paths:
        for line, body in fenced(path, "toml"):
            for sname, table in tomllib.loads(body).items():
                for key, value in table.items():
                    out.setdefault(f"{sname}.{key}", (f"{rel(path)}:{line}", value))
    return out


def test_every_key_a_doc_shows_exists_with_the_default_it_shows() -> None:
    known = schema()
    bad = []
    for path in DOCS:
        for line, body in fenced(path, "toml"):
            for sname, table in tomllib.loads(body).items():
                for key, value in table.items():
                    name, where = f"{sname}.{key}", f"{rel(path)}:{line}"
                    if name not in known:
                        bad.append(f"{where}: {name} is not a config key")
                    elif path == README and name not in EXAMPLE_KEYS:  # docs/ show how to turn things on
                        shown = Config.from_dict({sname: {key: value}}, env={})
                        if getattr(getattr(shown, sname), key) != known[name]:
                            bad.append(f"{where}: {name} = {value!r}, but the default is {known[name]!r}")
    assert not bad, "\n".join(bad)


def test_every_config_key_is_in_the_readme_reference() -> None:
    missing = sorted(set(schema()) - set(documented([README])))
    assert not missing, f"add these keys (with their defaults) to a TOML block of README.md: {missing}"


def test_every_aionet_variable_named_in_the_docs_exists() -> None:
    known = {f"AIONET_{name.replace('.', '_').upper()}" for name in schema()}
    tests = [p for p in (ROOT / "tests").rglob("*.py") if p.name != Path(__file__).name]  # not this file
    files = [*(ROOT / "aionet").rglob("*.py"), *tests]
    source = "\n".join(p.read_text(encoding="utf-8") for p in files)
    read_by_code = set(re.findall(r"\bAIONET_[A-Z0-9_]+\b", source))
    bad = []
    for path in DOCS:
        for var in sorted(set(re.findall(r"\bAIONET_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))):
            if var not in known and var not in read_by_code:
                bad.append(f"{rel(path)}: {var}")
    assert not bad, "no config key or code reads these variables:\n" + "\n".join(bad)


# ------------------------------------------------------------------ the command line
_SEPARATORS = re.compile(r"\s(?:&&|\|\||\||;)\s")
_STOP = {"#", "&", "--", "\\"}


def command_lines(path: Path) -> Iterator[tuple[str, str]]:
    """(where, text) of every shell-ish line and inline code span of a page."""
    for line, body in fenced(path, "", "bash", "sh", "console"):
        for i, row in enumerate(body.splitlines()):
            yield f"{rel(path)}:{line + i}", row
    for m in re.finditer(r"`([^`\n]+)`", prose(path)):
        yield rel(path), m.group(1)


def aionet_invocations(text: str) -> Iterator[list[str]]:
    """The words after ``aionet`` of each command in a line (``a && b``, ``VAR=x aionet ...``,
    ``python -m aionet ...``), up to a comment or ``--``; ``[--opt]`` counts as ``--opt``."""
    for part in _SEPARATORS.split(text):
        try:
            tokens = shlex.split(part, comments=False, posix=True)
        except ValueError:
            tokens = part.split()
        while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
            tokens.pop(0)
        if tokens[:2] in (["python", "-m"], ["python3", "-m"]):
            tokens = tokens[2:]
        if not tokens or tokens[0] != "aionet":
            continue
        words = []
        for tok in tokens[1:]:
            if tok in _STOP or tok.startswith("#"):
                break
            words.append(tok.strip("[]"))
        yield words


def options_of(cmd: click.Command) -> set[str]:
    opts = {"--help"}
    for p in cmd.params:
        opts.update(getattr(p, "opts", ()))
        opts.update(getattr(p, "secondary_opts", ()))
    return opts


def test_every_command_and_flag_in_the_docs_exists() -> None:
    main = importlib.import_module("aionet.cli").main
    ctx = click.Context(main)
    bad = []
    for path in DOCS:
        for where, text in command_lines(path):
            for words in aionet_invocations(text):
                if not words or words[0].startswith("-"):
                    continue
                cmd = main.get_command(ctx, words[0])
                if cmd is None:
                    bad.append(f"{where}: `aionet {words[0]}` is not a command")
                    continue
                choices = [p for p in cmd.params if isinstance(p, click.Argument) and isinstance(p.type, click.Choice)]
                if choices and len(words) > 1 and re.fullmatch(r"[a-z_0-9]+(\|[a-z_0-9]+)*", words[1]):
                    for op in words[1].split("|"):  # `aionet bench allreduce|broadcast ...`
                        if op not in choices[0].type.choices:
                            bad.append(f"{where}: `aionet {words[0]} {op}`: not one of {choices[0].type.choices}")
                for w in words[1:]:
                    flag = w.split("=")[0]
                    if flag.startswith("-") and len(flag) > 1 and flag not in options_of(cmd):
                        bad.append(f"{where}: `aionet {words[0]} {flag}` is not an option (in {text.strip()!r})")
    assert not bad, "\n".join(bad)


#: flags of other programs the docs show (torchrun, mpirun, srun, useradd, kubectl, valgrind, pytest)
FOREIGN_FLAGS = {
    "--dist",
    "--standalone",
    "--nproc-per-node",
    "--oversubscribe",
    "--signal",
    "--uid",
    "--from-file",
    "--toggle-collect",
    "--collect-atstart",
}


def all_cli_flags() -> set[str]:
    """Every option of every aionet command."""
    main = importlib.import_module("aionet.cli").main
    ctx = click.Context(main)
    flags: set[str] = set()
    for name in main.list_commands(ctx):
        flags |= options_of(main.get_command(ctx, name))
    return flags


def script_flags() -> set[str]:
    """Options of the shipped scripts (argparse in benchmarks/ and examples/, their shell drivers)."""
    flags: set[str] = set()
    for top in ("benchmarks", "examples"):
        for p in (ROOT / top).rglob("*"):
            if p.suffix in (".py", ".sh"):
                flags.update(re.findall(r"[\"'\s(|](--[a-z][\w-]*)", p.read_text(encoding="utf-8")))
    return flags


def test_every_flag_the_docs_mention_belongs_to_some_command() -> None:
    """A flag named in prose (`--iters`, `--count N`) cannot be tied to its command mechanically,
    but it must at least exist: on an aionet command or a shipped script."""
    known = all_cli_flags() | script_flags() | FOREIGN_FLAGS
    bad = []
    for path in DOCS:
        for flag in sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", path.read_text(encoding="utf-8")))):
            if flag not in known:
                bad.append(f"{rel(path)}: {flag}")
    assert not bad, "no aionet command or shipped script has these options:\n" + "\n".join(bad)


# ------------------------------------------------------------------ Python names
def python_blocks() -> Iterator[tuple[str, str]]:
    for path in DOCS:
        for line, body in fenced(path, "python"):
            yield f"{rel(path)}:{line}", body


@pytest.mark.parametrize("where, body", list(python_blocks()), ids=[w for w, _ in python_blocks()])
def test_python_block_parses(where: str, body: str) -> None:
    compile(body, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | ast.PyCF_ONLY_AST)


def string_literals_in_package() -> set[str]:
    """Every string constant in the package: service names (``aionet.echo``), entry-point groups
    and logger names are names too, though no attribute holds them."""
    out: set[str] = set()
    for p in (ROOT / "aionet").rglob("*.py"):
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("aionet."):
                out.add(n.value)
    return out


def resolves(dotted: str) -> bool:
    """``aionet.a.b.C`` names a module or an attribute reachable from one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


_DOTTED = re.compile(r"(?<![\w./-])aionet(?:\.[A-Za-z_]\w*)+")


def test_every_aionet_name_in_the_docs_exists() -> None:
    literals = string_literals_in_package()
    bad = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in _DOTTED.finditer(text):
            name = m.group(0)
            if name.endswith(("_py", ".py", ".md", ".toml", ".json")) or name in literals:
                continue
            if not resolves(name) and not any(lit.startswith(name + ".") for lit in literals):
                bad.append(f"{rel(path)}:{text.count(chr(10), 0, m.start()) + 1}: {name}")
    for where, body in python_blocks():
        tree = compile(body, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | ast.PyCF_ONLY_AST)
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "aionet":
                missing = [a.name for a in n.names if not resolves(f"{n.module}.{a.name}")]
                bad += [f"{where}: from {n.module} import {name}" for name in missing]
            elif isinstance(n, ast.Import):
                missing = [a.name for a in n.names if a.name.startswith("aionet") and not resolves(a.name)]
                bad += [f"{where}: import {name}" for name in missing]
    assert not bad, "the docs name these, the package has no such thing:\n" + "\n".join(bad)


# ------------------------------------------------------------------ methods and attributes the docs call
def receivers() -> dict[str, type]:
    """The variable names the docs use for each public object, and its class."""
    from aionet.cache.api import Cache, Lease
    from aionet.collectives.group import Group
    from aionet.membership import Membership
    from aionet.node import Node
    from aionet.scheduler import Scheduler
    from aionet.scheduler.tasks import TaskContext, TaskRef

    return {
        "node.cache": Cache,
        "node.membership": Membership,
        "node.scheduler": Scheduler,
        "node": Node,
        "grp": Group,
        "ctx": TaskContext,
        "ref": TaskRef,
        "lease": Lease,
    }


FILE_SUFFIXES = {"toml", "yaml", "yml", "pem", "key", "py", "json"}


def has_member(cls: type, name: str) -> bool:
    """A class attribute, or an instance attribute its ``__init__`` (or any method) assigns."""
    if hasattr(cls, name):
        return True
    for klass in cls.__mro__:
        if klass.__module__.startswith("aionet"):
            src = Path(inspect.getsourcefile(klass) or "").read_text(encoding="utf-8")
            if re.search(rf"\bself\.{name}\s*(?::[^=\n]*)?=(?!=)", src):
                return True
    return False


def test_every_method_the_docs_call_exists() -> None:
    classes = receivers()
    pattern = re.compile(r"(?<![\w.])(" + "|".join(re.escape(r) for r in classes) + r")\.([A-Za-z_]\w*)")
    config_keys = {name.split(".", 1)[1] for name in schema() if name.startswith("node.")}
    bad, checked = set(), 0
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in pattern.finditer(text):
            recv, attr = m.groups()
            if attr in FILE_SUFFIXES or (recv == "node" and attr in config_keys):  # node.toml, node.join_timeout
                continue
            checked += 1
            if not has_member(classes[recv], attr):
                line = text.count("\n", 0, m.start()) + 1
                bad.add(f"{rel(path)}:{line}: {recv}.{attr} ({classes[recv].__name__} has no {attr})")
    assert checked > 100, checked  # the pattern still finds the calls
    assert not bad, "\n".join(sorted(bad))


def calls_in_docs() -> Iterator[tuple[str, ast.Call]]:
    """Every call in a python block, and in each inline code span that parses as Python."""
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | ast.PyCF_ONLY_AST
    sources = list(python_blocks())
    for path in DOCS:
        sources += [(rel(path), m.group(1)) for m in re.finditer(r"`([^`\n]+\))`", prose(path))]
    for where, src in sources:
        try:
            tree = compile(src.strip(), where, "exec", flags=flags)
        except SyntaxError:
            continue  # prose such as `grp.allreduce(x, compression="fp16"|"bf16")` reads, not runs
        yield from ((where, n) for n in ast.walk(tree) if isinstance(n, ast.Call))


def test_every_call_the_docs_show_binds_to_the_signature() -> None:
    """``b.request("a", "double", 21, timeout=1.0)``: the keywords and the number of positional
    arguments fit the method (a renamed keyword fails here rather than in a user's program)."""
    classes = {**receivers(), "a": receivers()["node"], "b": receivers()["node"]}
    bad, checked = [], 0
    for where, call in calls_in_docs():
        if not isinstance(call.func, ast.Attribute):
            continue
        cls = classes.get(ast.unparse(call.func.value))
        method = getattr(cls, call.func.attr, None) if cls else None
        if not callable(method) or any(isinstance(a, ast.Starred) for a in call.args):
            continue
        sig = inspect.signature(method)
        params = list(sig.parameters.values())[1:]  # self
        try:
            inspect.Signature(params).bind(*call.args, **{k.arg: k.value for k in call.keywords if k.arg})
            checked += 1
        except TypeError as exc:
            bad.append(f"{where}: {ast.unparse(call)}: {exc} (signature {call.func.attr}{sig})")
    assert checked > 30, checked
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------ transport options (docs/transports.md)
def transport_schemas() -> dict[str, dict[str, Any]]:
    """``[transport] <name>`` -> {option: default}, from each transport's declared schema."""
    from aionet.transports import inproc, tcp, tls, ucx
    from aionet.transports.rdma import transport as rdma
    from aionet.transports.zmq import options as zmq

    tables = {"tcp": tcp.SCHEMA, "tls": tls.TLS_SCHEMA, "inproc": inproc.SCHEMA, "zmq": zmq.SCHEMA}
    tables |= {"ucx": ucx.SCHEMA, "rdma": rdma.SCHEMA}
    return {name: {k: o.default for k, o in schema.items()} for name, schema in tables.items()}


_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "s": 1, "ms": 1}


def shown_default(text: str) -> Any:
    """The value a parenthesis after an option starts with (``64 MiB``, ``1 s``, ``true``, ``""``),
    or ``...`` when it starts with words."""
    m = re.match(r'\s*(?:(true|false)|("")|(\{\})|(\d+(?:\.\d+)?)(?:\s*(KiB|MiB|GiB|ms|s)\b)?)', text)
    if not m:
        return ...
    if m.group(1):
        return m.group(1) == "true"
    if m.group(2):
        return ""
    if m.group(3):
        return {}
    return float(m.group(4)) * _UNITS.get(m.group(5) or "", 1)


def test_transports_md_lists_every_option_with_its_default() -> None:
    text = (ROOT / "docs" / "transports.md").read_text(encoding="utf-8")
    paragraphs = dict(re.findall(r"Options \(`\[transport\] (\w+) = \{\.\.\.\}`\):(.*?)(?:\n\n|\Z)", text, re.S))
    bad = []
    for name, options in transport_schemas().items():
        para = paragraphs.get(name)
        if para is None:
            bad.append(f"no 'Options (`[transport] {name} = {{...}}`):' paragraph")
            continue
        globs = re.findall(r"`(\w+_)\*`", para)  # `curve_*` options: described below it
        named = set(re.findall(r"`(\w+)`", para))
        shown = dict(re.findall(r"`(\w+)` \(([^)`]*)", para))  # `name` (default...)
        for opt, default in options.items():
            if opt not in named and not any(opt.startswith(g) for g in globs):
                bad.append(f"[transport] {name}: option `{opt}` is not listed")
                continue
            value = shown_default(shown.get(opt, ""))
            if value is not ... and value != default and not (value == {} and not default):
                bad.append(f"[transport] {name}: `{opt}` shown as {shown[opt]!r}, the default is {default!r}")
        bad += [f"[transport] {name}: `{opt}` is listed but is no option" for opt in shown if opt not in options]
    assert not bad, "docs/transports.md:\n" + "\n".join(bad)


#: CamelCase names the docs use that belong to other software (Kubernetes, SLURM, Python)
FOREIGN_CLASSES = {"ContainerCreating", "FailedMount", "PodMonitor", "KillWait"}


def test_every_class_or_exception_the_docs_name_exists() -> None:
    """`TaskLost`, `StaleFenceError`, `BufferPoolStats`: a class named in the docs is defined
    somewhere in the package (or is a builtin), so a renamed exception cannot leave a stale page."""
    import builtins

    defined = set(dir(builtins)) | FOREIGN_CLASSES
    for p in (ROOT / "aionet").rglob("*.py"):
        defined |= {n.name for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))) if isinstance(n, ast.ClassDef)}
    bad = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"`([A-Z][a-z0-9]+[A-Z]\w*)`", text):
            if m.group(1) not in defined:
                bad.append(f"{rel(path)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(1)}")
    assert not bad, "no such class in the package:\n" + "\n".join(bad)


# ------------------------------------------------------------------ files and tests the docs point to
RATIO_COLUMNS = {"aionet/raw", "aionet/pyzmq"}  # benchmark columns, not paths
_PATH = re.compile(r"(?<![\w./-])((?:aionet|tests|benchmarks|examples|deploy|docs|\.ci)/[\w./*-]*[\w*])(::\w+)?")


def test_every_file_and_test_the_docs_point_to_exists() -> None:
    """`tests/system/test_liveness.py`, `benchmarks/p2p.py`, `deploy/k8s/overlays/cpu`,
    `...::test_name`, and every relative Markdown link: a reader who follows one finds it."""
    bad = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in _PATH.finditer(text):
            target, test = m.group(1).rstrip("."), m.group(2)
            if target.startswith("benchmarks/results") or target in RATIO_COLUMNS:
                continue  # what the benchmarks write (git-ignored); `aionet/raw` is a ratio
            where = f"{rel(path)}:{text.count(chr(10), 0, m.start()) + 1}"
            found = list(ROOT.glob(target)) if "*" in target else [ROOT / target] if (ROOT / target).exists() else []
            if not found:
                bad.append(f"{where}: {target} does not exist")
            elif test and not re.search(rf"\bdef {test[2:]}\b", found[0].read_text(encoding="utf-8")):
                bad.append(f"{where}: {target} has no {test[2:]}")
            # a bare `::test_other` after it names another test of the same file
            after = text[m.end() : m.end() + 2000]
            stop = _PATH.search(after)
            for more in re.findall(r"`::(test_\w+)`", after[: stop.start() if stop else None]):
                if found and found[0].is_file() and f"def {more}" not in found[0].read_text(encoding="utf-8"):
                    bad.append(f"{where}: {target} has no {more}")
        if path.parent.name == "benchmarks":  # its table names scripts beside it: `p2p.py`
            for script in set(re.findall(r"`([\w-]+\.(?:py|sh))`", text)):
                if not (path.parent / script).exists() and not list(ROOT.rglob(script)):
                    bad.append(f"{rel(path)}: {script} does not exist")
        for m in re.finditer(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):  # [text](relative/link)
            if not (path.parent / m.group(1)).exists():
                bad.append(f"{rel(path)}: link {m.group(1)} does not exist")
    assert not bad, "\n".join(bad)


def test_every_benchmark_script_has_a_line_in_benchmarks_readme() -> None:
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([\w.-]+)` \|", text, re.M))
    scripts = {p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh")}
    missing = sorted(scripts - listed)
    assert not missing, f"add a row to benchmarks/README.md's table for: {missing}"


def test_every_option_of_every_command_is_documented() -> None:
    """The other direction: an option added to a command gets a mention in README/docs."""
    main = importlib.import_module("aionet.cli").main
    ctx = click.Context(main)
    text = "\n".join(p.read_text(encoding="utf-8") for p in DOCS)
    missing = []
    for name in main.list_commands(ctx):
        for param in main.get_command(ctx, name).params:
            longs = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
            if longs and not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text) for o in longs):
                missing.append(f"aionet {name} {longs[0]}")
    assert not missing, f"document these options in README.md or docs/: {missing}"


def test_every_extra_the_docs_install_exists() -> None:
    """`pip install 'aionet[plot]'`, `.[gpu]`, "the `ucx` extra": each is in pyproject.toml."""
    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    )
    bad = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        named = re.findall(r"(?:aionet|\.)\[([\w,-]+)\]", text) + re.findall(r"`(\w+)` extra", text)
        bad += [f"{rel(path)}: extra {e!r}" for group in named for e in group.split(",") if e not in extras]
    assert not bad, f"pyproject.toml has no such extra ({sorted(extras)}):\n" + "\n".join(bad)


def test_every_example_is_mentioned() -> None:
    text = "\n".join(p.read_text(encoding="utf-8") for p in DOCS)
    missing = sorted(p.name for p in (ROOT / "examples").glob("*.py") if f"examples/{p.name}" not in text)
    assert not missing, f"say what these examples show in README.md or docs/: {missing}"


_SECTIONS = "|".join(f.name for f in dataclasses.fields(Config))
_KEY_IN_PROSE = re.compile(rf"`({_SECTIONS})\.(\w+)(?:\.(\w+))?`(?:\s+\((?:default )?([^)]*)\))?")


def test_every_section_key_named_in_prose_exists_with_the_default_it_states() -> None:
    """`link.give_up_after` (30 s), `transport.tcp.max_queued_bytes` (64 MiB), `scheduler.drain_timeout`:
    a key named in a sentence exists, and a default stated right after it is the default."""
    known, transports = schema(), transport_schemas()
    node_cls = receivers()["node"]
    bad, checked = [], 0
    for path in DOCS:
        text = prose(path)
        for m in _KEY_IN_PROSE.finditer(text):
            section, key, option, stated = m.groups()
            where = f"{rel(path)}: `{m.group(0).split('`')[1]}`"
            if key in FILE_SUFFIXES or key.isupper() or (section == "node" and has_member(node_cls, key)):
                continue  # `log.py`, `link.STREAM_ACK_BYTES`, `node.send`: not config keys
            if stated and "here" in stated:
                stated = None  # "(300 s here)": this deployment's value, not the default
            if section == "transport" and option:
                default = transports.get(key, {}).get(option, KeyError)
                if default is KeyError:
                    bad.append(f"{where}: [transport] {key} has no option {option}")
                    continue
            elif f"{section}.{key}" not in known or option:
                bad.append(f"{where}: no such config key")
                continue
            else:
                default = known[f"{section}.{key}"]
            checked += 1
            value = shown_default(stated or "")
            if value is not ... and isinstance(default, (int, float)) and not isinstance(default, bool):
                if value != default:
                    bad.append(f"{where} ({stated}): the default is {default!r}")
    assert checked > 40, checked
    assert not bad, "\n".join(bad)


def readme_members_example() -> dict[str, Any]:
    """The dict the README prints as ``node.members()["b"]`` (a comment: ``...`` for values)."""
    body = next(b for _, b in fenced(README, "python") if b.startswith('node.members()["b"]'))
    text = "\n".join(line.split("#", 1)[1] for line in body.splitlines()[1:] if "#" in line)
    text = re.sub(r"\}\}\s+.*$", "}}", text.strip(), flags=re.S)  # the trailing remark
    return ast.literal_eval(text.replace("...", "None"))


def test_the_readme_members_example_has_the_keys_members_returns() -> None:
    from aionet.membership.events import member_view
    from aionet.membership.load import GpuLoad, LoadReport
    from aionet.membership.table import Member, MemberState

    load = LoadReport(gpus=(GpuLoad(0, "gpu", 1, 2, 55.0, 61.0, 70.5),))
    member = Member("b", "id", 1, MemberState.ALIVE, ["tcp://b.example:7700"], 0.0, last_seen=0.0, load=load)
    real = member_view(member, 1.0, LoadReport.unknown())
    shown = readme_members_example()
    assert set(shown) == set(real), set(shown) ^ set(real)
    assert set(shown["load"]) == set(real["load"]), set(shown["load"]) ^ set(real["load"])
    assert set(shown["devices"]) == set(real["devices"])
    assert set(shown["devices"]["gpus"][0]) == set(real["devices"]["gpus"][0])


def test_every_stats_path_the_docs_read_exists() -> None:
    """`node.stats().peers[name].undeliverable`, `st.scheduler.owner.completed`: each step is a
    field of the typed statistics (a mapping step goes to its value type)."""
    import typing

    from aionet.stats import NodeStats

    pattern = re.compile(r"(?:node\.stats\(\)|(?<![\w.])st)((?:\.[a-z_]\w*|\[[^\]\n]+\])+)")
    bad, checked = [], 0
    for path in DOCS:
        for m in pattern.finditer(path.read_text(encoding="utf-8")):
            typ: Any = NodeStats
            for step in re.findall(r"\.\w+|\[[^\]]+\]", m.group(1)):
                while typing.get_origin(typ) in (typing.Union, types.UnionType):  # X | None
                    typ = next(a for a in typing.get_args(typ) if a is not type(None))
                if step.startswith("["):
                    typ = typing.get_args(typ)[1]  # Mapping[str, X]
                    continue
                name = step[1:]
                if name in ("as_dict", "py"):
                    break
                hints = typing.get_type_hints(typ) if dataclasses.is_dataclass(typ) else {}
                if name not in hints:
                    bad.append(f"{rel(path)}: {m.group(0)}: {getattr(typ, '__name__', typ)} has no {name}")
                    break
                typ = hints[name]
                checked += 1
    assert checked >= 10, checked
    assert not bad, "\n".join(bad)


def test_the_readme_hook_table_lists_every_instrument_hook_with_its_parameters() -> None:
    from aionet.instrument import Instrument

    rows = dict(re.findall(r"^\| `(\w+)\(([^)]*)\)` \|", README.read_text(encoding="utf-8"), re.M))
    hooks = {
        name: [p for p in inspect.signature(fn).parameters if p != "self"]
        for name, fn in vars(Instrument).items()
        if callable(fn) and not name.startswith("_")
    }
    assert set(rows) == set(hooks), f"README hook table vs aionet.instrument.Instrument: {set(rows) ^ set(hooks)}"
    bad = {n: (rows[n], hooks[n]) for n in hooks if [a.strip() for a in rows[n].split(",")] != hooks[n]}
    assert not bad, f"parameters differ (README, code): {bad}"
