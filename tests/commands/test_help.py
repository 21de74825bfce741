"""``--help`` of every command on an 80-column terminal: real examples, intact text, plain
metavars."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ckpt_cli.commands import COMMANDS as REGISTRY
from tests.support.terminal import run_on_terminal

COMMANDS = [c.name for c in REGISTRY]


def _help(*command: str, columns: int = 80) -> str:
    screen = run_on_terminal([*command, "--help"], columns)
    assert screen.code == 0, screen.stderr
    assert not screen.too_wide()
    # The panels' frame is decoration: keep what is inside it.
    return "\n".join(line.strip().strip("│").strip() for line in screen.lines)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_real_examples_that_render_whole(command: str) -> None:
    from ckpt_cli.commands import command as find

    examples = [f"$ ckpt {command} {example}" for example in find(command).examples]
    assert 2 <= len(examples) <= 4, command
    lines = _help(command).splitlines()
    for example in examples:
        assert example in lines, f"{example!r} not whole on one line of the help"


def _every_command() -> list[str]:
    from ckpt_cli.app import app

    names = [c.name for c in app.registered_commands if c.name]
    assert names == COMMANDS
    return ["", *names]  # "": `ckpt --help` itself


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("command", _every_command())
def test_help_metavars_are_plain(command: str, columns: int) -> None:
    text = _help(*([command] if command else []), columns=columns)
    assert not re.search(r"<(bool|str|int|float|list\[str\]|int range)>|\{\w+\}", text), text
    assert "…" not in text  # nothing cut off


def test_long_option_names_are_whole_on_a_narrow_terminal() -> None:
    """prune's negative flag pair, reshard's and migrate's long names: whole at 80 columns
    (options laid out as blocks where Typer's table would cut them)."""
    for command, names in {
        "prune": ["--keep-missing-metric", "--drop-missing-metric", "--clean-tmp"],
        "reshard": ["--max-chunk-bytes", "--scheduler"],
        "migrate": ["--allow-mismatch", "--max-chunk-bytes", "--record-digests"],
    }.items():
        words = set(_help(command).split())
        for name in names:
            assert name in words, (command, name)


def test_rule_examples_survive_rich_markup() -> None:
    text = " ".join(_help("reshard").split())
    assert "'params.*kernel: [null, model]'" in text
    assert "'params.*kernel=[null, model]'" in text


def test_top_level_help_lists_every_command() -> None:
    text = _help()
    for command in COMMANDS:
        assert re.search(rf"^{command}\s", text, re.MULTILINE), command


def test_help_shows_no_trailing_underscore_placeholder() -> None:
    """Parameters named ``filter_``/``format_`` (Python keywords) show as PATTERN/FORMAT."""
    for command in ("inspect", "diff", "export"):
        text = _help(command)
        assert not re.search(r"\b[A-Z]+_\b", text), (command, text)
    assert "PATTERN" in _help("inspect")
    assert "FORMAT" in _help("export")


def test_every_command_has_examples_in_its_record() -> None:
    assert REGISTRY
    for c in REGISTRY:
        assert 2 <= len(c.examples) <= 4, c.name
        assert f"$ ckpt {c.name} {c.examples[0]}" in c.help()


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["ls", ".", "--bogus"], "No such option: --bogus"),
        (["bogus"], "No such command 'bogus'"),
        (["ls"], "Missing argument 'PATH'"),
        (["prune", ".", "--mode", "avg"], "Invalid value for '--mode'"),
    ],
)
def test_usage_errors_are_one_line_on_stderr(args: list[str], phrase: str) -> None:
    """Click's usage errors: one ``ckpt: error:`` line naming the help to read, exit 2; no
    boxed panel, nothing on stdout."""
    import subprocess

    from tests.support.interrupts import CKPT

    proc = subprocess.run([CKPT, *args], capture_output=True, text=True, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ckpt: error: ") and phrase in lines[0], lines[0]
    assert "--help`)" in lines[0] and "╭" not in proc.stderr


def _panels(screen_lines: list[str]) -> dict[str, list[str]]:
    """The inside of each options or arguments panel of a help screen, by title: the frame
    (``│ `` and `` │``) removed, trailing spaces kept off."""
    panels: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in screen_lines:
        if line.startswith("╭─"):
            title = line.strip("╭─╮ ").split(" ─")[0].strip()
            current = panels.setdefault(title, []) if title != "Commands" else None
        elif line.startswith("╰"):
            current = None
        elif current is not None and line.startswith("│"):
            current.append(line[2:-2].rstrip())
    return panels


def _help_columns(inside: list[str], inner: int) -> list[int]:
    """Width of the help column of each continuation line (a line that starts with spaces)."""
    return [inner - (len(line) - len(line.lstrip())) for line in inside if line.startswith(" ")]


def _laid_out_as_blocks(inside: list[str]) -> bool:
    """Every option on a line of its own (names, metavar), its help indented by four below."""
    heads = [line for line in inside if not line.startswith(" ")]
    helps = [line for line in inside if line.startswith(" ")]
    return (
        bool(heads)
        and all("  " not in head for head in heads)
        and all(line.startswith("    ") and line[4] != " " for line in helps)
    )


@pytest.mark.parametrize("columns", [60, 80, 100, 120])
@pytest.mark.parametrize("command", _every_command())
def test_help_layout_is_the_same_for_every_command(command: str, columns: int) -> None:
    """Below 120 columns every option's help goes under the option, for every command; at any
    width no line is wider than the terminal and no help column narrower than 40 characters
    (a wide terminal may keep Typer's two columns)."""
    screen = run_on_terminal([*([command] if command else []), "--help"], columns)
    assert screen.code == 0, screen.stderr
    too_wide = [line for line in screen.lines if len(line) > columns]
    assert not too_wide, "\n".join(too_wide)
    panels = _panels(screen.lines)
    assert "Options" in panels, screen.text
    for title, inside in panels.items():
        narrowest = min(_help_columns(inside, columns - 4), default=columns)
        assert narrowest >= 40, (title, narrowest, "\n".join(inside))
        if columns < 120:
            assert _laid_out_as_blocks(inside), (title, "\n".join(inside))


@pytest.mark.parametrize(
    ("command", "example"), [(c.name, e) for c in REGISTRY for e in c.examples]
)
def test_every_help_example_parses(command: str, example: str) -> None:
    """Every option of every example exists and takes the value given (the examples are run
    end to end by the docs tests)."""
    import shlex

    from typer.main import get_command

    from ckpt_cli.app import app

    click_command = get_command(app).commands[command]  # type: ignore[attr-defined]
    # A trailing `# exit N` states the example's exit code (tests/README.md): a comment.
    click_command.make_context(command, shlex.split(example, comments=True))


@pytest.mark.parametrize("command", _every_command())
def test_piped_help_ends_no_line_in_whitespace(command: str) -> None:
    """`ckpt verify --help | grep ...`: no line padded to the width (docs/how-to/terminal.md)."""
    import os
    import subprocess

    from tests.support.interrupts import CKPT

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    args = [CKPT, *([command] if command else []), "--help"]
    proc = subprocess.run(args, capture_output=True, text=True, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Usage:" in proc.stdout and "--help" in proc.stdout
    padded = [line for line in proc.stdout.splitlines() if line != line.rstrip()]
    assert not padded, padded


# --- the blocks are Typer's help, laid out otherwise: held equal to Typer's own output ---


def _contexts(app: Any) -> list[tuple[Any, Any]]:
    """(Click command, its context) for the app's group and each of its commands."""
    from typer.main import get_command

    group = get_command(app)
    top = group.make_context(app.info.name, [], resilient_parsing=True)
    commands = [group.commands[name] for name in group.list_commands(top)]  # type: ignore[attr-defined]
    assert commands
    subs = [(c, c.make_context(c.name, [], parent=top, resilient_parsing=True)) for c in commands]
    return [(group, top), *subs]


def _typers_and_ours(
    command: Any, ctx: Any, columns: int, monkeypatch: Any, capsys: Any
) -> tuple[str, str]:
    """Typer's own help of ``command`` and ckpt's blocks, as printed at ``columns``."""
    from typer.core import TyperCommand, TyperGroup

    from ckpt_cli.commands import _help_blocks as blocks
    from tests.support.terminal import plain

    monkeypatch.setenv("COLUMNS", str(columns))
    base = TyperGroup if isinstance(command, TyperGroup) else TyperCommand
    base.format_help(command, ctx, ctx.make_formatter())
    typers = plain(capsys.readouterr().out)
    blocks.print_help(command, ctx, blocks.console())
    ours = plain(capsys.readouterr().out)
    assert "Usage:" in typers and "Usage:" in ours
    return typers, ours


def _outside_option_panels(text: str, titles: set[str]) -> list[str]:
    kept: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("╭─") and line.strip("╭─╮ ").split(" ─")[0].strip() in titles:
            inside = True
        if not inside:
            kept.append(line)
        if line.startswith("╰"):
            inside = False
    return kept


#: The range Typer's table shows after a bounded number's type (``N [x>=1]``); the blocks have
#: never shown it (ckpt's help before the blocks were drawn from public data did not either).
_RANGE = re.compile(r"\[[-+0-9.x<=>]+\]")


def _words(text: str, *, ranges: bool = True) -> list[str]:
    """The words of a help in reading order, frames and name separators left out."""
    for mark in "│╭╮╰╯─,":
        text = text.replace(mark, " ")
    return [w for w in text.split() if w != "/" and (ranges or not _RANGE.fullmatch(w))]


def _apps() -> list[Any]:
    from ckpt_cli.app import app
    from tests.support.help_toy import app as toy

    return [app, toy]


@pytest.mark.parametrize("which", ["ckpt", "toy"])
def test_the_blocks_say_what_typers_own_help_says(
    which: str, monkeypatch: Any, capsys: Any
) -> None:
    """Where ckpt draws the help itself (blocks), it is Typer's help otherwise: line for line
    outside the options panels at 80 columns, and word for word in the same order at 200
    (where Typer keeps its tables whole), for ckpt's every command and a toy app's corners.
    A Typer that formats anything differently fails here."""
    from ckpt_cli.commands._help_blocks import panels

    app = _apps()[["ckpt", "toy"].index(which)]
    for command, ctx in _contexts(app):
        titles = {title for title, _ in panels(command, ctx)}
        typers, ours = _typers_and_ours(command, ctx, 80, monkeypatch, capsys)
        assert _outside_option_panels(ours, titles) == _outside_option_panels(typers, titles)
        typers, ours = _typers_and_ours(command, ctx, 200, monkeypatch, capsys)
        assert "…" not in typers
        assert _words(ours) == _words(typers, ranges=False), command.name


@pytest.mark.parametrize(("name", "blocks"), [("cut", True), ("narrow", True), ("other", False)])
def test_a_wide_terminal_keeps_typers_tables_unless_they_would_cut(
    name: str, blocks: bool, monkeypatch: Any, capsys: Any
) -> None:
    """At 120 columns a command whose table would cut a word (``cut``) or leave its help column
    under 40 characters (``narrow``, whose name Typer's table cuts too) is laid out as blocks,
    whole; another (``other``) is Typer's own help, unchanged."""
    from typer.core import TyperCommand

    from tests.support.help_toy import app
    from tests.support.terminal import plain

    command, ctx = next((c, x) for c, x in _contexts(app) if c.name == name)
    monkeypatch.setenv("COLUMNS", "120")
    command.format_help(ctx, ctx.make_formatter())
    shown = plain(capsys.readouterr().out)
    panels = _panels(shown.splitlines())
    assert panels and "…" not in shown
    assert all(_laid_out_as_blocks(inside) is blocks for inside in panels.values()), shown
    TyperCommand.format_help(command, ctx, ctx.make_formatter())
    typers = "".join(line.rstrip() + "\n" for line in plain(capsys.readouterr().out).splitlines())
    assert (shown == typers) is not blocks
    assert ("…" in typers) is blocks  # what the blocks spare the reader
