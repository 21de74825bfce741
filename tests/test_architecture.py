"""The tree is the architecture: imports point one way, no cycles, the core never imports the UI.

storage <- format, digest <- the read operations, verify, write <- spec <- prune, reshard, migrate,
copy, du <- safetensors <- doctor <- commands, the public API <- the app. Every import of
``ckpt_cli/`` counts, function-level and ``TYPE_CHECKING`` ones included (a lazy import is still
a dependency).

Two packages are homes of a concept whose modules sit at the layers of what they import:

- ``core/digest/``: the digests themselves (``ld1``, the recorded digests, carried digests, file
  checksums, the ``DigestReport`` document in ``__init__``) sit beside ``format`` (layer 2):
  format's leaf scan feeds ``ld1`` and the value hasher, the records describe format's arrays, and
  verify, write, migrate and safetensors use them. ``digest.items`` (``ckpt digest`` of an Orbax
  item) is a read operation (it reads ``inspect``'s leaves); ``digest.safetensors``
  (``digest_any``: safetensors or Orbax) reads safetensors files: it sits with ``safetensors``.
- ``core/spec/``: the rule language (spec files, ops, the working tree, the rule engine,
  ``--target`` functions) plans over ``inspect``'s leaves and ``state``'s roles, so it sits above
  the read operations and below migrate, safetensors and doctor, which plan with it.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from tests.support.paths import REPO

PACKAGE = REPO / "ckpt_cli"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Modules of ``ckpt_cli`` that ``name`` imports (``from pkg import mod`` names the module)."""
    out: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in MODULES else target)
    return {m for m in out if m.split(".")[0] == "ckpt_cli" and m != name}


def _external(path: Path) -> set[str]:
    tops: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            tops.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            tops.add(node.module.split(".")[0])
    return tops


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}

# Layers, lowest first: a module imports only its own layer or lower ones, and within a layer
# only its own group (the read operations, verify and write do not lean on one another).
READ_OPS = (
    "listing",
    "inspect",
    "state",
    "step_state",
    "stats",
    "diff",
    "digest",
    "checkpoint",
    "trend",
)
UTILITIES = (
    "progress",
    "schema",
    "units",
    "executor",
    "scale",
    "workers",
    "split",
    "dask_preload",
    "textfiles",
    "regex",
    "threads",
    "step_ranges",
    "kernels",
)


def layer(name: str) -> tuple[int, str]:
    parts = name.split(".")
    if name in ("ckpt_cli.errors", "ckpt_cli._version"):
        return 0, "shared"
    if parts[:2] == ["ckpt_cli", "core"]:
        sub = parts[2] if len(parts) > 2 else ""
        if sub == "":
            return 1, "core"
        if sub == "storage" or sub in UTILITIES:
            return 1, sub if sub == "storage" else "utilities"
        if sub == "format":
            return 2, "format"
        if sub == "digest":
            # The digests beside format; reading a checkpoint to digest it above the readers.
            module = parts[3] if len(parts) > 3 else ""
            if module == "items":
                return 3, "read"
            if module == "safetensors":
                return 6, "safetensors"
            return 2, "digest"
        if sub in READ_OPS:
            return 3, "read"
        if sub in ("verify", "write"):
            return 3, sub
        # spec: the rule language, over inspect's leaves; below everything that plans with it.
        if sub == "spec":
            return 4, sub
        # du: the read view of a root that leans on verify's walk of every OCDBT version.
        if sub in ("prune", "reshard", "migrate", "copy", "du"):
            return 5, sub
        # average: a writer over reshard's layout and migrate's destination: above both.
        if sub == "average":
            return 6, sub
        # safetensors: the format, and export/import, which reuse the rule language, migrate's
        # planner and reshard's partition rules: one layer above them.
        if sub == "safetensors":
            return 6, sub
        # doctor: explains a checkpoint against a target with migrate's planner, reads
        # safetensors headers for --like: above both.
        if sub == "doctor":
            return 7, sub
        raise AssertionError(f"{name}: a core module outside the architecture's packages")
    if parts[:2] == ["ckpt_cli", "commands"]:
        return 8, "commands"
    if name in ("ckpt_cli", "ckpt_cli.orbax"):
        # ckpt_cli.orbax: the trainer's side (imports jax and orbax), beside the public API.
        return 8, "api"
    if name in ("ckpt_cli.app", "ckpt_cli.__main__", "ckpt_cli.signals"):
        return 9, "app"
    raise AssertionError(f"{name}: a module the architecture does not place")


def test_the_package_is_parsed() -> None:
    assert len(MODULES) > 60
    assert sum(len(deps) for deps in GRAPH.values()) > 200  # the edges were really found


def test_no_import_cycles() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in GRAPH:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert cycles == []


def test_imports_point_one_way() -> None:
    wrong = []
    for name, deps in GRAPH.items():
        here, group = layer(name)
        for dep in deps:
            there, other = layer(dep)
            if there > here or (there == here and other != group and here in (3, 5)):
                wrong.append(f"{name} -> {dep}")
    assert wrong == []


def test_the_layers_are_populated() -> None:
    groups = {layer(name) for name in MODULES}
    for expected in [(1, "storage"), (2, "format"), (2, "digest"), (3, "read"), (3, "verify")]:
        assert expected in groups
    for expected in [
        (3, "write"),
        (4, "spec"),
        (5, "prune"),
        (5, "reshard"),
        (5, "migrate"),
        (6, "safetensors"),
        (7, "doctor"),
        (8, "commands"),
    ]:
        assert expected in groups


def test_the_core_never_imports_the_ui() -> None:
    core = {n: p for n, p in MODULES.items() if n.startswith("ckpt_cli.core")}
    assert len(core) > 40
    offenders = {n: sorted(_external(p) & {"typer", "rich", "click"}) for n, p in core.items()}
    assert {n: e for n, e in offenders.items() if e} == {}


def is_renderer(name: str) -> bool:
    """A command's text renderer (``commands/<x>_text.py``) or the text primitives they share
    (``_text``, ``_write_text``): imported only inside a command's function, once it runs."""
    return name.startswith("ckpt_cli.commands.") and name.endswith("_text")


def test_commands_import_the_core_through_functions_only() -> None:
    """``ckpt --help`` imports no core module: commands import it when they run. Renderers may
    import result types at the top: only a running command imports them (test_startup checks
    that ``ckpt --help`` loads neither)."""
    renderers = [n for n in MODULES if is_renderer(n)]
    assert len(renderers) >= 12
    commands = [n for n in MODULES if n.startswith("ckpt_cli.commands.") and not is_renderer(n)]
    assert len(commands) >= 7
    for name, path in MODULES.items():
        if not name.startswith("ckpt_cli.commands.") or is_renderer(name):
            continue
        tree = ast.parse(path.read_text())
        top = [
            n
            for n in tree.body
            if isinstance(n, ast.ImportFrom)
            and (
                (n.module or "").startswith("ckpt_cli.core")
                or is_renderer(n.module or "")
                or any(is_renderer(f"{n.module}.{a.name}") for a in n.names)
            )
        ]
        assert top == [], name


@pytest.mark.parametrize(
    "old",
    [
        "layout", "resolve", "metadata", "arrays", "scan", "digests", "shardgrid", "structure",
        "checks", "inventory", "ocdbt", "deep", "problems", "scale_verify", "writer",
        "pipeline", "steps", "rewrite", "memory", "retention", "deletion", "objstore",
        "remote", "migrate_spec", "migrate_rules", "migrate_ops", "migrate_tree",
        "migrate_layout", "migrate_target", "initializers", "inspection", "compare",
        "format.ldigest", "format.ldranges", "format.digests", "format.filesums", "format.layout",
        "migrate.digests", "migrate.layout", "migrate.ops", "migrate.spec", "migrate.tree",
        "migrate.target", "migrate.rules", "migrate.initializers", "migrate.stack",
        "safetensors.digest",
    ],
)  # fmt: skip
def test_the_old_flat_modules_are_gone(old: str) -> None:
    assert importlib.util.find_spec(f"ckpt_cli.core.{old}") is None


def _typeddicts(tree: ast.Module) -> list[str]:
    """Names of the TypedDicts a module defines: ``class X(TypedDict)``, a subclass of one
    defined in the package (``class X(PlanJSON)``), and the functional ``X = TypedDict(...)``."""
    names = []
    for node in tree.body:
        if (isinstance(node, ast.ClassDef) and node.name.endswith("JSON")) or (
            isinstance(node, ast.ClassDef)
            and any(isinstance(b, ast.Name) and b.id == "TypedDict" for b in node.bases)
        ):
            names.append(node.name)
        elif (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "TypedDict"
        ):
            names.extend(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_no_typeddict_is_defined_twice() -> None:
    """One description of each JSON object: a second copy drifts from the first."""
    where: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        for td in _typeddicts(ast.parse(path.read_text())):
            where.setdefault(td, []).append(name)
    assert len(where) > 40  # the documents' types were really found
    assert {td: mods for td, mods in where.items() if len(mods) > 1} == {}


#: ``to_json`` methods allowed an open annotation, and why.
OPEN_TO_JSON = {
    # The protocol every printed result satisfies: any document at all.
    ("ckpt_cli.commands._output", "Document"),
}

_OPEN = {"Any", "object", "dict", "Mapping"}


def _is_open(annotation: ast.expr | None) -> bool:
    """No annotation, ``Any``/``object``, or a plain mapping (``dict[str, Any]``)."""
    if annotation is None:
        return True
    if isinstance(annotation, ast.Subscript):
        annotation = annotation.value
    return isinstance(annotation, ast.Name) and annotation.id in _OPEN


def test_every_to_json_returns_its_typeddict() -> None:
    """mypy ties a ``to_json`` to the TypedDict it is annotated with; ``dict[str, Any]`` ties it
    to nothing, and the published schema could drift from what is printed."""
    found, open_ = [], []
    for name, path in MODULES.items():
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "to_json":
                    found.append((name, cls.name))
                    if _is_open(fn.returns) and (name, cls.name) not in OPEN_TO_JSON:
                        open_.append(f"{name}.{cls.name}")
    assert len(found) > 40
    assert open_ == []
    assert set(found) >= OPEN_TO_JSON  # an exception that no longer applies is removed


# --- the command registry: one record per command, and every list of commands follows it ---


def _registry_names() -> list[str]:
    from ckpt_cli.commands import COMMANDS

    names = [c.name for c in COMMANDS]
    assert len(names) >= 12
    return names


def test_every_command_is_registered_once() -> None:
    import ckpt_cli.commands as package
    from ckpt_cli.app import app
    from ckpt_cli.commands import COMMANDS
    from ckpt_cli.commands._command import Command

    names = _registry_names()
    assert len(set(names)) == len(names), names
    assert len({id(c.function) for c in COMMANDS}) == len(COMMANDS)
    assert [c.name for c in app.registered_commands] == names
    # A Command record defined in a module of commands/ but left out of the registry would be
    # half-registered: every record is in it.
    records = []
    for name in MODULES:
        if name.startswith("ckpt_cli.commands.") and not is_renderer(name):
            module = importlib.import_module(name)
            records += [v for v in vars(module).values() if isinstance(v, Command)]
    assert records
    assert {id(r) for r in records} == {id(c) for c in COMMANDS}
    assert package.COMMANDS is COMMANDS


def test_every_command_is_in_the_top_level_help() -> None:
    from typer.testing import CliRunner

    from ckpt_cli.app import app

    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    listed = [line.strip("│ ").split(" ")[0] for line in result.output.splitlines()]
    for name in _registry_names():
        assert name in listed, name


def test_every_command_has_its_reference_page_and_index_row() -> None:
    index = (REPO / "docs" / "reference" / "index.md").read_text()
    for name in _registry_names():
        assert (REPO / "docs" / "reference" / f"{name}.md").is_file(), name
        assert f"[`ckpt {name}`]({name}.md)" in index, name


def test_every_command_has_its_published_schema() -> None:
    import json

    from ckpt_cli.commands import COMMANDS

    versions = json.loads((REPO / "docs" / "schemas" / "versions.json").read_text())
    assert COMMANDS
    for c in COMMANDS:
        assert c.json_output().documents, f"ckpt {c.name} --json: no document type in its record"
        assert (REPO / "docs" / "schemas" / f"{c.name}.schema.json").is_file(), c.name
        assert str(c.schema_version()) in versions[c.name], c.name


def test_the_docs_index_table_lists_the_registry_in_order() -> None:
    """docs/index.md's table of commands: one row per registered command, in the registry's
    order, with the command's arguments as its usage line names them."""
    import re

    import typer

    from ckpt_cli.app import app

    group = typer.main.get_command(app)
    page = (REPO / "docs" / "index.md").read_text()
    rows = re.findall(r"^\| \[`ckpt (\S+)([^`]*)`\]\(reference/(\S+)\.md\) \|", page, re.M)
    assert [r[0] for r in rows] == _registry_names()
    for name, args, target in rows:
        assert target == name
        params = group.commands[name].params  # type: ignore[attr-defined]
        arguments = [p.name.upper() for p in params if p.param_type_name == "argument"]
        assert args.split() == arguments, (name, args)


def test_shell_completion_offers_every_command() -> None:
    import os
    import subprocess
    import sys

    ckpt = str(Path(sys.executable).with_name("ckpt"))
    env = {
        **os.environ,
        "_CKPT_COMPLETE": "complete_bash",
        "COMP_WORDS": "ckpt ",
        "COMP_CWORD": "1",
    }
    proc = subprocess.run([ckpt], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    offered = proc.stdout.split()
    for name in _registry_names():
        assert name in offered, name


# --- functions stay short: 60 lines at most (decorators and docstring included) ---

MAX_FUNCTION_LINES = 60
#: Functions still over the cap, each with why (to be shrunk; the list only shrinks): none.
LONG_FUNCTIONS: set[str] = set()


def _function_lengths() -> dict[str, int]:
    """``module:Qual.name`` -> lines, for every function of the package (nested ones too)."""
    lengths: dict[str, int] = {}

    def walk(node: ast.AST, module: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                name = f"{prefix}{child.name}"
                lengths[f"{module}:{name}"] = (child.end_lineno or start) - start + 1
                walk(child, module, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, module, f"{prefix}{child.name}.")

    for module, path in MODULES.items():
        walk(ast.parse(path.read_text()), module, "")
    return lengths


def test_no_function_is_over_the_cap() -> None:
    lengths = _function_lengths()
    assert len(lengths) > 500
    long = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES}
    assert {n: long[n] for n in sorted(set(long) - LONG_FUNCTIONS)} == {}, (
        f"functions over {MAX_FUNCTION_LINES} lines: split them"
    )
    assert not any(name.startswith(("ckpt_cli.commands", "ckpt_cli.app")) for name in long)
    stale = sorted(LONG_FUNCTIONS - set(long))
    assert stale == [], f"now under the cap (or gone): remove them from LONG_FUNCTIONS: {stale}"


# --- modules stay small: 500 lines at most ---

MAX_MODULE_LINES = 500


def test_no_module_is_over_the_cap() -> None:
    """A module over the cap holds more than one concept: split it into cohesive modules (a
    package whose ``__init__`` holds the documents, as ``core/inspect/`` and ``core/diff/``)."""
    lengths = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert max(lengths.values()) > MAX_MODULE_LINES // 2  # the files were really read
    long = {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES}
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: split them"


# --- no private name of Typer, Click or Rich: their internals change without notice ---

UI_LIBRARIES = ("typer", "click", "rich")
#: Underscore names that are public protocol (namedtuple's), not private state.
PUBLIC_UNDERSCORE = {"_asdict", "_replace", "_fields", "_make", "_field_defaults"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__") and name not in PUBLIC_UNDERSCORE


def _ui_module(module: str) -> bool:
    return module.split(".")[0] in UI_LIBRARIES


def private_ui_uses(source: str) -> list[str]:
    """``line: what`` for each private name of typer, click or rich that ``source`` uses: a
    private module or name imported from them, an underscore attribute of a name bound to
    them, and, in a module that imports any of them, an underscore attribute of any object
    but ``self``/``cls`` (a parameter, a context, a console: their objects) or a
    ``getattr``/``hasattr``/``setattr``/``delattr`` of an underscore name."""
    tree = ast.parse(source)
    found: list[str] = []
    bound: set[str] = set()  # local names of their modules and of what is imported from them
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in (a for a in node.names if _ui_module(a.name)):
                if any(_private(part) for part in alias.name.split(".")):
                    found.append(f"{node.lineno}: import {alias.name}")
                bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and not node.level and _ui_module(node.module or ""):
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if any(_private(part) for part in dotted.split(".")):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                bound.add(alias.asname or alias.name)
    if not bound:
        return found
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            if not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
                found.append(f"{node.lineno}: .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            found.append(f"{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return found


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from typer import rich_utils\nrich_utils._print_options_panel = 1", ["2: ._print"]),
        ("import typer.rich_utils as ru\nru._get_parameter_help()", ["2: ._get_parameter"]),
        ("from typer.core import _split_opt", ["1: from typer.core import _split_opt"]),
        ("import typer._click", ["1: import typer._click"]),
        ("from typer._click import types", ["1: from typer._click import types"]),
        ("import rich\ndef f(param):\n    return param._range_help()", ["3: ._range_help"]),
        (
            "import click\ndef f(ctx):\n    return getattr(ctx, '_meta')",
            ["3: getattr(..., '_meta')"],
        ),
        ("import typer\nclass A:\n    def f(self):\n        return self._x", []),
        ("import typer\nfrom x import p\np._asdict()\ntyper.__version__", []),
        ("import os\ndef f(pool):\n    return pool._processes", []),  # not their object
    ],
)
def test_the_private_name_scanner_sees_each_form(source: str, expected: list[str]) -> None:
    uses = private_ui_uses(source)
    assert len(uses) == len(expected), uses
    for use, start in zip(uses, expected, strict=True):
        assert use.startswith(start), (use, start)


def test_no_module_uses_a_private_name_of_typer_click_or_rich() -> None:
    """``commands/_help.py`` once patched ``typer.rich_utils._print_options_panel``; the help is
    now drawn from public attributes (its docstring says how)."""
    users = [name for name, path in MODULES.items() if _external(path) & set(UI_LIBRARIES)]
    assert "ckpt_cli.commands._help" in users and "ckpt_cli.app" in users
    found = {name: uses for name in users if (uses := private_ui_uses(MODULES[name].read_text()))}
    assert found == {}
