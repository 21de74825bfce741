"""The README and the docs stay true to the code.

The README is the front door: it starts with the two make commands, has one line per command and
stays short. The facts live in docs/: every verify problem code with its severity, every exit
code, a JSON section for every command that prints JSON.
"""

from __future__ import annotations

import re

import typer

from ckpt_cli import errors
from ckpt_cli.app import app
from ckpt_cli.commands import COMMANDS as REGISTRY
from ckpt_cli.core.verify.problems import CODES
from tests.conftest import REPO

README = (REPO / "README.md").read_text()
DOCS = REPO / "docs"
COMMANDS = [c.name for c in REGISTRY]


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
    page = (DOCS / "verify.md").read_text()
    assert CODES
    for code, (severity, _) in CODES.items():
        rows = [
            line for line in page.splitlines() if re.search(rf"^\| `{re.escape(code)}` \|", line)
        ]
        assert rows, f"problem code {code} is not in docs/verify.md's table"
        assert any(f"| {severity} |" in row for row in rows), (
            f"{code}: severity {severity} not documented"
        )


def test_the_problem_code_table_names_no_code_that_does_not_exist() -> None:
    page = (DOCS / "verify.md").read_text()
    table = page.split("## Problem codes", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M)
    assert len(listed) >= 20
    assert sorted(listed) == sorted(CODES), set(listed) ^ set(CODES)


def test_every_exit_code_is_documented() -> None:
    codes = sorted({v for k, v in vars(errors).items() if k.startswith("EXIT_")})
    assert codes == [0, 1, 2, 3, 70, 130]
    readme_rows = README.split("## Exit codes", 1)[1]
    page = (DOCS / "troubleshooting.md").read_text()
    for code in codes:
        assert re.search(rf"^\| {code} \|", page, re.M), (
            f"exit code {code} not in troubleshooting.md"
        )
        assert re.search(rf"^\| {code} \|", readme_rows, re.M), (
            f"exit code {code} not in the README"
        )


def test_every_command_that_prints_json_has_its_schema_documented() -> None:
    group = typer.main.get_command(app)
    page = (DOCS / "json.md").read_text()
    with_json = [
        name
        for name in COMMANDS
        if any("--json" in p.opts for p in group.commands[name].params)  # type: ignore[attr-defined]
    ]
    assert with_json
    for name in with_json:
        section = re.search(rf"^## `ckpt {name}`\n(.*?)(?=^## |\Z)", page, re.M | re.S)
        assert section, f"docs/json.md has no section for ckpt {name}"
        assert re.search(r'"schema_version": \d', section.group(1)), name


def test_the_design_page_names_every_package_and_module() -> None:
    page = (DOCS / "design.md").read_text()
    block = page.split("## The layout", 1)[1].split("```", 2)[1]
    modules = sorted((REPO / "ckpt_cli").rglob("*.py"))
    assert len(modules) > 50
    for path in modules:
        rel = path.relative_to(REPO / "ckpt_cli")
        for package in rel.parts[:-1]:
            assert f"{package}/" in block, f"docs/design.md's layout does not show {package}/"
        if path.stem == "__init__" and len(rel.parts) > 1:
            continue
        name = path.name if len(rel.parts) == 1 else path.stem
        assert re.search(rf"\b{re.escape(name)}\b", block), (
            f"docs/design.md's layout does not name ckpt_cli/{rel}"
        )
