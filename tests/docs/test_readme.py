"""The README and the docs stay true to the code.

The README is the front door: it starts with the two make commands, has one line per command and
stays short. The facts live in docs/: every verify problem code with its severity, every exit
code, a JSON section for every command that prints JSON.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

import pytest
import typer

from ckpt_cli import errors
from ckpt_cli.app import app
from ckpt_cli.commands import COMMANDS as REGISTRY
from ckpt_cli.core.verify.problems import CODES
from tests.support.cli import CliResult
from tests.support.docs_examples import (
    UPDATE_DOCS,
    console_commands,
    first_mismatch,
    normalized,
    pages,
    shows,
)
from tests.support.paths import FIXTURES, REPO
from tests.support.tutorial_run import SCRIPT_COMMAND, TutorialRun

README = (REPO / "README.md").read_text()
DOCS = REPO / "docs"
COMMANDS = [c.name for c in REGISTRY]
#: Where the README's sample output says the reader's checkout is.
READER_DIR = "/home/you/ckpt"


def test_readme_starts_with_the_two_commands() -> None:
    before, fence, rest = README.partition("```")
    assert fence, "the README has no code block"
    assert not re.search(r"^#{2,} ", before, re.M), "a section comes before the two commands"
    assert before.lstrip().startswith("# ") and before.count("\n") <= 3
    head = rest.split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in head.splitlines()[1:] if line.strip()]
    assert commands == ["make demo", "make test"]


def test_readme_is_short_and_has_one_line_per_command() -> None:
    assert len(README.splitlines()) <= 250
    assert len(COMMANDS) >= 12
    section = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    for name in COMMANDS:
        lines = [line for line in section.splitlines() if line.startswith(f"- `ckpt {name} ")]
        assert len(lines) == 1, f"the README's Commands section needs one line for ckpt {name}"
        assert f"(docs/reference/{name}.md)" in lines[0]


def test_readme_links_point_at_files_that_exist() -> None:
    links = re.findall(r"\]\(((?:docs/)[^)#]+)(?:#[^)]*)?\)", README)
    assert links
    for link in links:
        assert (REPO / link).is_file(), f"README links to {link}, which does not exist"


def test_every_problem_code_is_documented_with_its_severity() -> None:
    page = (DOCS / "how-to" / "verify.md").read_text()
    assert CODES
    for code, (severity, _) in CODES.items():
        rows = [
            line for line in page.splitlines() if re.search(rf"^\| `{re.escape(code)}` \|", line)
        ]
        assert rows, f"problem code {code} is not in docs/how-to/verify.md's table"
        assert any(f"| {severity} |" in row for row in rows), (
            f"{code}: severity {severity} not documented"
        )


def test_the_problem_code_table_names_no_code_that_does_not_exist() -> None:
    page = (DOCS / "how-to" / "verify.md").read_text()
    table = page.split("## Problem codes", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M)
    assert len(listed) >= 20
    assert sorted(listed) == sorted(CODES), set(listed) ^ set(CODES)


def test_every_exit_code_is_documented() -> None:
    codes = sorted({v for k, v in vars(errors).items() if k.startswith("EXIT_")})
    assert codes == [0, 1, 2, 3, 70, 130]
    readme_rows = README.split("## Exit codes", 1)[1]
    page = (DOCS / "reference" / "exit-codes.md").read_text()
    for code in codes:
        assert re.search(rf"^\| {code} \|", page, re.M), (
            f"exit code {code} not in docs/reference/exit-codes.md"
        )
        assert re.search(rf"^\| {code} \|", readme_rows, re.M), (
            f"exit code {code} not in the README"
        )


def test_every_command_that_prints_json_has_its_schema_documented() -> None:
    group = typer.main.get_command(app)
    page = (DOCS / "reference" / "json.md").read_text()
    with_json = [
        name
        for name in COMMANDS
        if any("--json" in p.opts for p in group.commands[name].params)  # type: ignore[attr-defined]
    ]
    assert with_json
    for name in with_json:
        section = re.search(rf"^## `ckpt {name}`\n(.*?)(?=^## |\Z)", page, re.M | re.S)
        assert section, f"docs/reference/json.md has no section for ckpt {name}"
        assert re.search(r'"schema_version": \d', section.group(1)), name


def test_the_design_page_names_every_package_and_module() -> None:
    page = (DOCS / "explanation" / "design.md").read_text()
    block = page.split("## The layout", 1)[1].split("```", 2)[1]
    modules = sorted((REPO / "ckpt_cli").rglob("*.py"))
    assert len(modules) > 50
    for path in modules:
        rel = path.relative_to(REPO / "ckpt_cli")
        for package in rel.parts[:-1]:
            assert f"{package}/" in block, (
                f"docs/explanation/design.md's layout does not show {package}/"
            )
        if path.stem == "__init__" and len(rel.parts) > 1:
            continue
        name = path.name if len(rel.parts) == 1 else path.stem
        assert re.search(rf"\b{re.escape(name)}\b", block), (
            f"docs/explanation/design.md's layout does not name ckpt_cli/{rel}"
        )


@pytest.mark.slow
def test_the_quick_start_runs_as_written_after_pip_install(
    tutorial_run: TutorialRun, tmp_path: Path
) -> None:
    """Its script saves a real checkpoint with the installed Orbax (the shared ``tutorial_run``
    ran it, as written); then every command runs in a copy of that run, as written, with the
    exit code it states and the output it shows (times and sizes masked). ``CKPT_UPDATE_DOCS=1``
    writes what they print into the README instead, and the block into docs/index.md, which
    shows it word for word (tests/docs/test_front_door.py)."""
    commands = console_commands(REPO / "README.md", section="Quick start")
    # The install is the one line not run here (no network in tests): it names a real extra.
    # Installing the built wheel into a fresh venv is the install tests' job.
    install = commands.pop(0).text
    assert install == "pip install '.[orbax]'"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "orbax-checkpoint" in " ".join(project["optional-dependencies"]["orbax"])
    assert len(commands) >= 10
    script = commands.pop(0)
    assert script.text.split("#")[0].strip() == SCRIPT_COMMAND
    assert shows(normalized(tutorial_run.result.stdout, tmp_path, READER_DIR), list(script.output))
    assert all(c.text.startswith("ckpt ") for c in commands)
    workdir = tutorial_run.copy_into(tmp_path)
    mismatch = first_mismatch(commands, workdir, READER_DIR)
    if os.environ.get(UPDATE_DOCS) == "1":  # the docs' first page shows the same block
        _copy_quick_start(REPO / "README.md", REPO / "docs" / "index.md")
    assert mismatch is None, mismatch
    assert (workdir / "runs" / "first-pt" / "model.safetensors").is_file()
    assert sorted(p.name for p in (workdir / "runs" / "copy").iterdir()) == ["200", "300"]


def _copy_quick_start(src: Path, dst: Path) -> None:
    """The console block under ``## Quick start`` of ``src`` replaces the one of ``dst``."""

    def block(text: str) -> tuple[int, int]:
        start = text.index("```console\n", text.index("## Quick start\n"))
        return start, text.index("\n```\n", start) + 5

    text, target = src.read_text(), dst.read_text()
    (a, b), (c, d) = block(text), block(target)
    dst.write_text(target[:c] + text[a:b] + target[d:])


def _requirement_names(requirements: list[str]) -> list[str]:
    """``'jax[cpu]>=0.7'`` -> ``'jax[cpu]'``: the name as a reader types it, extras kept."""
    return [re.split(r"[<>=!~;\s]", r, maxsplit=1)[0] for r in requirements]


def test_the_dependency_lists_are_pyprojects() -> None:
    """The README's and install.md's `pip install ckpt-orbax` line name every dependency of pyproject.toml,
    and install.md's table of extras names what each extra adds."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = _requirement_names(project["dependencies"])
    install = (DOCS / "how-to" / "install.md").read_text()
    assert len(base) >= 8
    for name, text in (("README.md", README), ("docs/how-to/install.md", install)):
        line = re.search(r"^pip install ckpt-orbax\s+# the CLI and library: (.*)$", text, re.M)
        assert line, f"{name} has no `pip install ckpt-orbax` line naming the dependencies"
        assert sorted(line.group(1).split(", ")) == sorted(base), name
    extras = project["optional-dependencies"]
    assert {"orbax", "dask", "docs", "dev"} <= set(extras)
    for extra, requirements in extras.items():
        row = re.search(rf"^\| `{extra}` \| (.*?) \| .* \|$", install, re.M)
        assert row, f"docs/how-to/install.md's table has no row for the {extra} extra"
        shown = re.findall(r"`([^`]+)`", row.group(1))
        own = [n for n in _requirement_names(requirements) if not n.startswith("ckpt-orbax")]
        assert sorted(shown) == sorted(own), f"the {extra} extra: {set(shown) ^ set(own)}"


def test_every_ls_sample_shows_the_columns_ls_prints(cli: Callable[..., CliResult]) -> None:
    """A sample of `ckpt ls` in the README or the docs has the header `ckpt ls` prints today, in
    its order (one once showed `metrics` before `format`)."""
    result = cli("ls", FIXTURES / "seed_mlp")
    assert result.code == 0, result.stderr
    printed = next(line.split() for line in result.stdout.splitlines() if "status" in line)
    assert printed[:2] == ["step", "status"] and "format" in printed
    samples = [
        command
        for page in pages()
        for command in console_commands(page)
        if command.text.startswith("ckpt ls ") and command.output
    ]
    assert len(samples) >= 3
    for sample in samples:
        header = [line.split() for line in sample.output if "status" in line]
        assert header == [printed], f"{sample.where}: the ls header is not what ls prints"


def test_the_docs_cite_only_files_the_repository_has() -> None:
    """A file named in backticks (`CONTRIBUTING.md`, `fixtures/README.md`) exists: docs/design.md
    once cited a STYLE.md the repository does not have."""
    cited = [
        (page, name)
        for page in pages()
        for name in re.findall(r"`((?:[\w.-]+/)*[\w.-]+\.md)`", page.read_text())
        if "<" not in name
    ]
    assert len(cited) >= 5
    for page, name in cited:
        assert (REPO / name).is_file(), f"{page.relative_to(REPO)} cites {name}, which is not there"
