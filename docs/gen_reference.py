"""Write docs/reference/<command>.md for every command of the ``ckpt`` Typer app, and every
other list of the commands the docs keep, from the registry (``ckpt_cli.commands.COMMANDS``).

Run from the repository root::

    python docs/gen_reference.py           # (re)write the pages: `make docs-reference`
    python docs/gen_reference.py --check   # exit 1 and name every stale page

Besides the pages it writes and checks the lists of commands in README.md, docs/index.md and
docs/reference/json.md (docs/gen_lists.py).

Each page is rendered from the app itself: the command's help (its docstring), its usage line,
every argument and option with its type, default and help, and its exit codes (the sentence
"Exit codes: ..." of the command's help when it has one, and the table of the app's help). The
pages are committed; ``tests/docs/test_reference.py`` regenerates them and fails when one differs,
so a changed option cannot leave its reference page behind.

It reads the Click objects Typer builds (``typer.main.get_command``) through their attributes
only: no terminal width, no colour, no Rich formatting, so the output is the same everywhere.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "docs") not in sys.path:  # gen_lists beside it, when loaded by path (the tests)
    sys.path.insert(0, str(REPO / "docs"))

from gen_lists import stale_blocks, write_blocks  # noqa: E402

OUT = REPO / "docs" / "reference"
HEADER = (
    "<!-- Generated from the Typer app by docs/gen_reference.py: do not edit by hand; "
    "run `make docs-reference`. -->"
)


def _app() -> Any:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from ckpt_cli.app import app

    return app


_CODE_SPAN = re.compile(r"(`[^`]*`)")

#: How option help names the one page on leaf patterns; a link on the reference pages.
LEAF_PATTERNS = "docs/reference/layouts.md#leaf-patterns"


def md(text: str, *, cell: bool = False) -> str:
    """Help text as Markdown: code spans kept, characters Markdown would read as markup escaped
    outside them (``*.orbax-checkpoint-tmp`` is not emphasis; in a table cell ``|`` is not a
    column)."""
    parts = _CODE_SPAN.split(text)
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 1:
            out.append(part)
            continue
        part = part.replace("\\", "\\\\").replace("*", "\\*").replace("_", "\\_")
        part = part.replace("<", "&lt;").replace("[", "\\[")
        if cell:
            part = part.replace("|", "\\|")
        out.append(part)
    joined = "".join(out)
    return " ".join(joined.split()) if cell else joined


def _paragraphs(help_text: str) -> list[str]:
    """The help's paragraphs, each joined into one line (docstrings wrap at 100 columns)."""
    blocks = re.split(r"\n\s*\n", help_text.strip())
    return [" ".join(b.split()) for b in blocks if b.strip()]


_EXIT_SENTENCE = re.compile(r"Exit codes:\s*(.*?)(?:\.\s*$|$)", re.S)


def split_exit_codes(paragraphs: list[str]) -> tuple[list[str], str | None]:
    """Take the "Exit codes: ..." sentence out of a help text; return the rest and the sentence."""
    rest: list[str] = []
    found: str | None = None
    for p in paragraphs:
        i = p.find("Exit codes:")
        if i < 0:
            rest.append(p)
            continue
        m = _EXIT_SENTENCE.search(p[i:])
        found = m.group(1).strip() if m else p[i:]
        before = p[:i].strip()
        if before:
            rest.append(before)
    return rest, found


def exit_code_rows(sentence: str) -> list[tuple[str, str]]:
    """``0 ok · 1 problems found`` (or comma-separated) -> [("0", "ok"), ("1", "problems found")]."""
    items = re.split(r"\s*·\s*|,\s*(?=\d+\s)", sentence)
    rows = []
    for item in items:
        m = re.match(r"(\d+)\s+(.*)", item.strip().rstrip("."))
        if m:
            rows.append((m.group(1), m.group(2).strip()))
    return rows


def _default(param: Any) -> str:
    if getattr(param, "required", False):
        return "required"
    if getattr(param, "is_flag", False) and getattr(param, "secondary_opts", None):
        if param.default is None:  # neither: the help says what decides
            return "—"
        on, off = param.opts[-1], param.secondary_opts[-1]
        return f"`{on}`" if param.default else f"`{off}`"
    if isinstance(getattr(param, "show_default", None), str):
        return md(param.show_default, cell=True)
    default = param.default
    if getattr(param, "is_flag", False):
        return "off" if not default else "on"
    if default is None or default == ():
        return "—"
    if isinstance(default, (list, tuple)):
        return ", ".join(f"`{d}`" for d in default)
    return f"`{default}`"


def _value_type(annotation: Any) -> tuple[str, bool]:
    """The value an option takes, from the command function's own type hint (plain typing, the
    same under every Typer release): ``int | None`` -> INTEGER; ``list[str]`` -> TEXT, repeatable."""
    import enum
    import types
    import typing

    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else annotation
        origin = typing.get_origin(annotation)
    if origin in (list, tuple, set):
        inner, _ = _value_type(typing.get_args(annotation)[0])
        return inner, True
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation), False
    names = {int: "INTEGER", float: "FLOAT", str: "TEXT", bool: "BOOLEAN", Path: "PATH"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)).upper()), False


def _type(param: Any, hints: dict[str, Any]) -> str:
    if getattr(param, "is_flag", False):
        return "flag"
    value, repeatable = _value_type(hints.get(param.name, str))
    text = md(str(param.metavar), cell=True) if param.metavar else value
    if text.startswith("SIZE"):  # one size parser, one meaning: link it
        text = f"[{text}](layouts.md#sizes-and-durations)"
    if repeatable or getattr(param, "multiple", False):
        text += " (repeatable)"
    return text


def _names(param: Any) -> str:
    names = [*param.opts, *getattr(param, "secondary_opts", [])]
    return ", ".join(f"`{n}`" for n in names)


def _usage(cmd: Any, prog: str) -> str:
    arguments = [_argument_name(p) for p in cmd.params if p.param_type_name == "argument"]
    return " ".join([prog, "[OPTIONS]", *arguments])


def _argument_name(param: Any) -> str:
    name = str(param.metavar or param.name.upper())
    return name + "..." if param.nargs == -1 else name


def _hints(callback: Any) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(callback, include_extras=True) if callback else {}


def _params_tables(cmd: Any, hints: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    arguments = [p for p in cmd.params if p.param_type_name == "argument"]
    options = [p for p in cmd.params if p.param_type_name == "option" and not p.hidden]
    if arguments:
        lines += ["## Arguments", "", "| argument | required | help |", "|---|---|---|"]
        for p in arguments:
            name = _argument_name(p)
            help_text = md(getattr(p, "help", None) or "", cell=True)
            lines.append(f"| `{name}` | {'yes' if p.required else 'no'} | {help_text} |")
        lines.append("")
    lines += ["## Options", "", "| option | value | default | help |", "|---|---|---|---|"]
    for p in options:
        help_text = md(p.help or "", cell=True)
        help_text = help_text.replace(LEAF_PATTERNS, "[leaf patterns](layouts.md#leaf-patterns)")
        lines.append(f"| {_names(p)} | {_type(p, hints)} | {_default(p)} | {help_text} |")
    lines.append("| `-h`, `--help` | flag | off | Show the help and exit. |")
    lines.append("")
    return lines


def _exit_table(rows: list[tuple[str, str]]) -> list[str]:
    lines = ["| code | meaning |", "|---|---|"]
    lines += [f"| {code} | {md(meaning, cell=True)} |" for code, meaning in rows]
    return [*lines, ""]


def render_command(app: Any, name: str) -> str:
    import typer

    group = typer.main.get_command(app)
    cmd = group.commands[name]  # type: ignore[attr-defined]
    hints = _hints(cmd.callback)
    record = _record(name)
    # The docstring without the examples the help appends: they get a code block of their own.
    paragraphs = _paragraphs(inspect.getdoc(record.function) or "")
    body, own_exit = split_exit_codes(paragraphs)
    _, app_exit = split_exit_codes(_paragraphs(group.help or ""))
    lines = [HEADER, "", f"# ckpt {name}", ""]
    if body:
        lines += [md(body[0]), ""]
    lines += ["```text", _usage(cmd, f"ckpt [GLOBAL OPTIONS] {name}"), "```", ""]
    for p in body[1:]:
        lines += [md(p), ""]
    if record.examples:
        lines += ["## Examples", "", "```console"]
        lines += [f"$ ckpt {name} {example}" for example in record.examples]
        lines += ["```", ""]
    lines += [
        "Global options (`--s3-endpoint`, `--version`) go before the command: see "
        "[the reference index](index.md).",
        "",
    ]
    lines += _params_tables(cmd, hints)
    lines += ["## Exit codes", ""]
    general = exit_code_rows(app_exit or "")
    if own_exit:
        own = exit_code_rows(own_exit)
        codes = {code for code, _ in own}
        lines += [f"From `ckpt {name} --help`, then the codes every command shares:", ""]
        # 0-3 are the command's outcomes, as its help states them; the rest (a bug, an
        # interrupt) can end any command.
        shared = [row for row in general if row[0] not in codes and int(row[0]) > 3]
        lines += _exit_table(own + shared)
    else:
        lines += ["The codes every command uses (from `ckpt --help`):", ""]
        lines += _exit_table(general)
    lines += [
        "See [exit codes](exit-codes.md) for what each code means and [troubleshooting]"
        "(../how-to/troubleshooting.md) for the errors behind it.",
        "",
    ]
    return "\n".join(lines)


def render_index(app: Any) -> str:
    import typer

    group = typer.main.get_command(app)
    hints = _hints(group.callback)
    paragraphs = _paragraphs(group.help or "")
    body, app_exit = split_exit_codes(paragraphs)
    lines = [HEADER, "", "# Command reference", ""]
    lines += [md(p) + "\n" for p in body]
    lines += ["```text", "ckpt [GLOBAL OPTIONS] COMMAND [ARGS]...", "```", ""]
    lines += ["| command | what it does |", "|---|---|"]
    for name in command_names(app):
        cmd = group.commands[name]  # type: ignore[attr-defined]
        first = _paragraphs(cmd.help or "")[0]
        lines.append(f"| [`ckpt {name}`]({name}.md) | {md(first, cell=True)} |")
    lines += [
        "",
        "## Global options",
        "",
        "Given before the command: `ckpt --s3-endpoint URL ls s3://...`.",
        "",
    ]
    lines += ["| option | value | default | help |", "|---|---|---|---|"]
    for p in group.params:
        if p.param_type_name == "option" and not p.hidden:
            lines.append(
                f"| {_names(p)} | {_type(p, hints)} | {_default(p)} | {md(p.help or '', cell=True)} |"
            )
    lines += ["| `-h`, `--help` | flag | off | Show the help and exit. |", ""]
    lines += ["## Exit codes", ""]
    lines += _exit_table(exit_code_rows(app_exit or ""))
    return "\n".join(lines)


def _record(name: str) -> Any:
    """The command's record in the registry (its function and examples)."""
    from ckpt_cli.commands import command

    return command(name)


def command_names(app: Any) -> list[str]:
    """The registry's commands (``ckpt_cli.commands.COMMANDS``), which ``app`` registers."""
    from ckpt_cli.commands import COMMANDS

    return [c.name for c in COMMANDS]


def render_all(out: Path = OUT) -> dict[Path, str]:
    """Every reference page, by path: index.md plus one page per command."""
    app = _app()
    pages = {out / "index.md": render_index(app)}
    for name in command_names(app):
        pages[out / f"{name}.md"] = render_command(app, name)
    return pages


def _generated_extras(out: Path, pages: dict[Path, str]) -> list[Path]:
    """Pages this generator wrote (they start with ``HEADER``) for a command that is gone. The
    hand-written reference pages beside them (json.md, layouts.md, exit-codes.md, ...) are not
    its to judge or delete."""
    return sorted(p for p in set(out.glob("*.md")) - set(pages) if p.read_text().startswith(HEADER))


def stale_pages(out: Path = OUT) -> list[str]:
    """The pages whose committed text differs from what the app renders, is missing, or is left
    over from a removed command, named as paths relative to ``out``'s parent's parent (the
    repository, for the real pages)."""
    pages = render_all(out)
    base = out.parent.parent
    stale = [
        str(path.relative_to(base))
        for path, text in pages.items()
        if not path.is_file() or path.read_text() != text
    ]
    extra = _generated_extras(out, pages)
    return stale + [f"{p.relative_to(base)} (no such command)" for p in extra]


def write_pages(out: Path = OUT) -> list[Path]:
    """Write every page that differs, delete the pages of removed commands; return what changed."""
    out.mkdir(parents=True, exist_ok=True)
    pages = render_all(out)
    changed = []
    for extra in _generated_extras(out, pages):
        extra.unlink()
        changed.append(extra)
    for path, text in pages.items():
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale pages")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages() + stale_blocks()
        for page in stale:
            print(f"stale: {page} (run `make docs-reference`)", file=sys.stderr)
        return 1 if stale else 0
    changed, problems = write_blocks()
    for path in [*write_pages(), *changed]:
        print(f"wrote {path.relative_to(REPO)}")
    for problem in problems:
        print(f"to fix by hand: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
