"""The lists of commands outside the reference pages, written from the registry
(``ckpt_cli.commands.COMMANDS``) by docs/gen_reference.py and checked by its ``--check``.

- README.md and docs/index.md: the command lists between ``<!-- commands -->`` and
  ``<!-- /commands -->`` (each command's usage, its ``Command.summary``, its pages).
- docs/reference/json.md: the version table between ``<!-- versions -->`` markers. Its
  per-command sections are prose written by hand: the check names a command without its
  section, sections out of the registry's order, and one that shows another
  ``schema_version`` than the command prints.
- The site's nav: ``nav_entries``, put after the reference index by docs/hooks.py.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _app() -> Any:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from ckpt_cli.app import app

    return app


#: file (relative to the repository) -> the generated blocks it holds (marker name -> renderer).
BLOCK_FILES = {
    "README.md": ("commands",),
    "docs/index.md": ("commands",),
    "docs/reference/json.md": ("versions",),
}


def usage_line(app: Any, name: str) -> str:
    """``ckpt NAME ARG...``: the command with its arguments, as its usage line names them."""
    import typer

    cmd = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    arguments = [p.name.upper() for p in cmd.params if p.param_type_name == "argument"]
    return " ".join(["ckpt", name, *arguments])


def readme_commands(app: Any) -> str:
    """README.md's list: one line per command, its summary, its reference page and guides."""
    from ckpt_cli.commands import COMMANDS

    lines = []
    for c in COMMANDS:
        links = [f"[reference](docs/reference/{c.name}.md)"]
        links += [f"[{label}](docs/{page})" for label, page in c.guides]
        lines.append(f"- `{usage_line(app, c.name)}` — {c.summary} ({', '.join(links)}).")
    return "\n".join(lines)


def index_commands(app: Any) -> str:
    """docs/index.md's table: one row per command, its usage linked to its reference page."""
    from ckpt_cli.commands import COMMANDS

    lines = ["| command | what it does |", "|---|---|"]
    for c in COMMANDS:
        summary = c.summary.replace("|", "\\|")
        lines.append(f"| [`{usage_line(app, c.name)}`](reference/{c.name}.md) | {summary} |")
    return "\n".join(lines)


def json_versions() -> str:
    """docs/reference/json.md's table: the ``schema_version`` each command prints now."""
    from ckpt_cli.commands import COMMANDS

    lines = ["| command | `schema_version` |", "|---|---|"]
    lines += [f"| `{c.name}` | {c.schema_version()} |" for c in COMMANDS]
    return "\n".join(lines)


def _block_body(app: Any, path: str, marker: str) -> str:
    if marker == "versions":
        return json_versions()
    return readme_commands(app) if path == "README.md" else index_commands(app)


def fill_block(text: str, marker: str, body: str) -> str | None:
    """``text`` with what stands between ``<!-- marker -->`` and ``<!-- /marker -->`` replaced
    by ``body``; None when the markers are not there (once each, in that order)."""
    start, end = f"<!-- {marker} -->\n", f"\n<!-- /{marker} -->"
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        return None
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}{body}{end}{tail}"


def render_blocks(repo: Path = REPO) -> tuple[dict[Path, str], list[str]]:
    """Every file holding generated blocks, as it should read; and the problems no rewrite can
    fix (markers missing, a json.md section missing or showing another version)."""
    app = _app()
    texts: dict[Path, str] = {}
    problems: list[str] = []
    for name, markers in BLOCK_FILES.items():
        path = repo / name
        text = path.read_text()
        for marker in markers:
            filled = fill_block(text, marker, _block_body(app, name, marker))
            if filled is None:
                problems.append(f"{name}: no <!-- {marker} --> ... <!-- /{marker} --> block")
                continue
            text = filled
        texts[path] = text
    problems += json_section_problems((repo / "docs" / "reference" / "json.md").read_text())
    return texts, problems


def json_section_problems(page: str) -> list[str]:
    """The per-command sections of json.md: one ``## `ckpt NAME` `` per command, in the
    registry's order, each showing the ``schema_version`` the command prints."""
    from ckpt_cli.commands import COMMANDS

    where = "docs/reference/json.md"
    problems = []
    found = re.findall(r"^## `ckpt (\S+)`$", page, re.M)
    names = [c.name for c in COMMANDS]
    for c in COMMANDS:
        section = re.search(rf"^## `ckpt {c.name}`\n(.*?)(?=^## |\Z)", page, re.M | re.S)
        if section is None:
            problems.append(
                f'{where}: no section "## `ckpt {c.name}`" (write what its --json prints)'
            )
            continue
        shown = re.search(r'"schema_version": (\d+)', section.group(1))
        if shown is None or int(shown.group(1)) != c.schema_version():
            problems.append(
                f"{where}: the section of ckpt {c.name} shows schema_version "
                f"{shown and shown.group(1)}, the command prints {c.schema_version()}"
            )
    ordered = [n for n in found if n in names]
    if ordered != [n for n in names if n in found]:
        problems.append(f"{where}: sections out of the registry's order: {ordered}")
    extra = [n for n in found if n not in names]
    if extra:
        problems.append(f"{where}: sections of no command: {extra}")
    return problems


def stale_blocks(repo: Path = REPO) -> list[str]:
    """The files whose generated blocks differ from the registry, and the problems."""
    texts, problems = render_blocks(repo)
    stale = [str(p.relative_to(repo)) for p, t in texts.items() if p.read_text() != t]
    return stale + problems


def write_blocks(repo: Path = REPO) -> tuple[list[Path], list[str]]:
    """Rewrite the generated blocks that differ; return what changed and what is left to fix."""
    texts, problems = render_blocks(repo)
    changed = [p for p, t in texts.items() if p.read_text() != t]
    for path in changed:
        path.write_text(texts[path])
    return changed, problems


def nav_entries() -> list[dict[str, str]]:
    """The site nav's command pages (docs/hooks.py puts them after the reference index)."""
    from ckpt_cli.commands import COMMANDS

    return [{f"ckpt {c.name}": f"reference/{c.name}.md"} for c in COMMANDS]
