"""The test tree mirrors the package and names tests by behaviour (tests/README.md).

Checked on the files as they are: no test module imports another test module or a conftest
(shared code lives in ``tests/support/``), ``bench/`` imports only ``tests/support/``,
``tests/support/`` holds no test, the top of ``tests/`` holds only the files that describe or
check the tree, no test file is named after its history (a number, an issue, "fixes", a
session), every directory of ``tests/core/`` and ``tests/commands/`` names a package of
``ckpt_cli``, and the mirror holds the other way too: every command of the registry has its
``tests/commands/test_<command>.py``, every package of ``ckpt_cli/core/`` its ``tests/core/<pkg>/``
holding a test module.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.paths import REPO

TESTS = REPO / "tests"
BENCH = REPO / "bench"
SUPPORT = TESTS / "support"
#: What may sit at the top of tests/ besides directories.
TOP_LEVEL = {"__init__.py", "conftest.py", "README.md", "test_architecture.py", Path(__file__).name}
#: A file named after an item of an issue (``test_1_two_writers.py``), an issue itself, the fixes
#: of a session or a session: named after when it was written, not what it proves.
HISTORY_NAME = re.compile(r"^test_\d|issue|fixes|session", re.IGNORECASE)


def python_files(root: Path) -> list[Path]:
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    assert files, f"no Python file under {root}"
    return files


def is_test_module(path: Path) -> bool:
    return path.name.startswith("test_") or path.name == "conftest.py"


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in ``path``, function-level ones included; a
    relative import is reported as ``.`` plus its module so that it cannot slip through."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                out.append((node.lineno, "." * node.level + module))
            else:
                out.append((node.lineno, module))
                # ``from tests.x import test_y`` imports a test module too.
                out += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return out


def names_a_test_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" and any(p.startswith("test_") or p == "conftest" for p in parts)


def test_the_import_scanner_sees_test_modules() -> None:
    """The checks below rely on these answers."""
    assert names_a_test_module("tests.commands.test_prune")
    assert names_a_test_module("tests.conftest")
    assert names_a_test_module("tests.hostile.conftest")
    assert not names_a_test_module("tests.support.prune_roots")
    assert not names_a_test_module("ckpt_cli.core.prune")


def test_no_test_module_imports_another_test_module_or_a_conftest() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}: {module}"
        for path in python_files(TESTS)
        for line, module in imported_modules(path)
        if names_a_test_module(module) or module.startswith(".")
    ]
    assert not found, "shared code belongs in tests/support/ or a fixture:\n" + "\n".join(found)


def test_bench_imports_only_tests_support() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}: {module}"
        for path in python_files(BENCH)
        for line, module in imported_modules(path)
        if module.split(".")[0] == "tests" and not module.startswith("tests.support")
    ]
    assert not found, "bench/ imports from tests/support/ only:\n" + "\n".join(found)


def test_support_holds_no_tests() -> None:
    files = python_files(SUPPORT)
    tests = [p.relative_to(REPO) for p in files if is_test_module(p)]
    assert not tests, f"tests/support/ is for helpers, not tests: {tests}"


def test_top_of_tests_holds_only_what_describes_the_tree() -> None:
    files = [p for p in TESTS.iterdir() if p.is_file()]
    assert files, "tests/ holds no file"
    stray = sorted(p.name for p in files if p.name not in TOP_LEVEL)
    assert not stray, f"move these into the directory of what they test (tests/README.md): {stray}"


def test_every_directory_of_tests_is_described_in_the_readme() -> None:
    """A new top-level directory is a decision about where tests go: tests/README.md's table
    says what each one holds."""
    table = re.findall(r"^\| `([a-z_0-9]+)/", (TESTS / "README.md").read_text(), re.MULTILINE)
    assert table, "tests/README.md has no table of directories"
    dirs = {d.name for d in TESTS.iterdir() if d.is_dir() and d.name != "__pycache__"}
    assert dirs == set(table), (
        f"in tests/ only: {dirs - set(table)}; in the README only: {set(table) - dirs}"
    )


def test_no_test_is_named_after_a_number_or_an_issue() -> None:
    tests = [p for p in python_files(TESTS) if p.name.startswith("test_")]
    assert tests
    named = [str(p.relative_to(REPO)) for p in tests if HISTORY_NAME.search(p.name)]
    assert not named, f"name these after the behaviour they prove: {named}"


@pytest.mark.parametrize(
    "name",
    [
        "test_1_two_writers.py",
        "test_10_x.py",
        "test_issue17_cli.py",
        "test_small_fixes.py",
        "test_matrix_fixes.py",
        "test_session4.py",
    ],
)
def test_history_names_are_recognized(name: str) -> None:
    assert HISTORY_NAME.search(name)


@pytest.mark.parametrize("name", ["test_prune.py", "test_prefix_keys.py", "storage_fixtures.py"])
def test_behaviour_names_are_not_taken_for_history(name: str) -> None:
    assert not HISTORY_NAME.search(name)


def test_every_test_directory_is_a_package() -> None:
    """Modules of one basename live in several directories (test_prune.py in core/prune/ and in
    commands/): each directory needs its ``__init__.py`` for them to import as distinct modules."""
    dirs = {p.parent for p in python_files(TESTS)}
    missing = sorted(str(d.relative_to(REPO)) for d in dirs if not (d / "__init__.py").is_file())
    assert not missing, f"directories without __init__.py: {missing}"


@pytest.mark.parametrize(
    ("tests_dir", "package"),
    [("core", "ckpt_cli/core"), ("commands", "ckpt_cli/commands")],
)
def test_test_directories_mirror_the_package(tests_dir: str, package: str) -> None:
    subdirs = [d for d in (TESTS / tests_dir).iterdir() if d.is_dir() and d.name != "__pycache__"]
    if tests_dir == "core":
        assert subdirs, "tests/core/ has no area directory"
    unmatched = sorted(d.name for d in subdirs if not (REPO / package / d.name).is_dir())
    assert not unmatched, (
        f"tests/{tests_dir}/ directories naming no {package}/ package: {unmatched}"
    )


def command_test_module(name: str) -> Path:
    """Where the tests of the command ``name`` (as typed: ``import``, ``unpin``) live."""
    return TESTS / "commands" / f"test_{name.replace('-', '_')}.py"


def test_every_command_has_its_test_module() -> None:
    """``ckpt X`` is proven at its edge (options, exit codes, JSON, text, bad input) in
    ``tests/commands/test_X.py``, for every command the registry holds."""
    from ckpt_cli.commands import COMMANDS

    names = [c.name for c in COMMANDS]
    assert names, "the registry holds no command"
    missing = [
        str(path.relative_to(REPO)) for n in names if not (path := command_test_module(n)).is_file()
    ]
    assert not missing, f"commands without their test module: {missing}"


def core_packages() -> list[str]:
    """Every package of ``ckpt_cli/core/``: a directory holding Python modules (with or without
    ``__init__.py``), as the tree is now."""
    core = REPO / "ckpt_cli" / "core"
    found = sorted(
        d.name
        for d in core.iterdir()
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
    )
    assert found, "ckpt_cli/core/ holds no package"
    return found


def test_every_core_package_has_a_test_directory_with_tests() -> None:
    missing = []
    for pkg in core_packages():
        tests = sorted((TESTS / "core" / pkg).glob("test_*.py"))
        if not tests:
            missing.append(f"tests/core/{pkg}/")
    assert not missing, f"core packages without a test module in their directory: {missing}"


def test_the_mirror_checks_see_what_they_check() -> None:
    """The two checks above pass on a tree that has what they ask for, not on an empty one."""
    assert "reshard" in core_packages() and "storage" in core_packages()
    assert command_test_module("import").name == "test_import.py"
    assert command_test_module("unpin").parent == TESTS / "commands"
