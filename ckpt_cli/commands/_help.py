"""``--help`` that reads like the manual: plain metavars and examples that render whole.

Typer shows a required argument as ``{path}`` in the usage line and a type column of ``<str>``,
``<bool>`` (for flags, which take no value) and ``<int range>``. ``HelpCommand`` (given to each
``app.command(cls=...)``, and ``HelpGroup`` to the app) shows arguments as ``PATH``, flags
without a type, and options without a metavar of their own as ``NAME`` in capitals. Help text is Markdown (``rich_markup_mode``), so
``[null, model]`` is text, not a Rich style, and an indented ``$ ckpt ...`` block keeps its lines.

One layout for every command: Typer lays options out as a table whose name columns never wrap,
so the help is squeezed into what the longest names leave (24 characters of ``verify --help``
at 80 columns) and a long name, metavar or unbreakable word is cut with an ellipsis. Below
``NARROW`` columns every options panel is laid out as blocks: the names, negative names and
metavar on one line, the help indented below it, every line wrapped at spaces. A wider terminal
keeps Typer's table unless its help column would be narrower than ``MIN_HELP_COLUMN`` or the
table would cut a cell (the panel is rendered first into a scratch console of the terminal's
width to see).

Everything else goes through public API: ``HelpCommand``/``HelpGroup`` are given to Typer
by its public ``cls=`` parameter and override Click's public ``get_params``, ``format_help``
and ``collect_usage_pieces``; the blocks are drawn with Rich's public ``Panel``, ``Group``,
``Padding`` and ``Text`` in Typer's public style constants (``typer.rich_utils.STYLE_*``).

Why one private hook remains. Typer lays out a command's whole help in one function,
``typer.rich_utils.rich_format_help`` (usage, help text, every panel, epilog), and has no public
setting for where an option's help goes (``rich_markup_mode``, ``rich_help_panel`` and the
terminal width choose markup, grouping and width). Two public routes were weighed and refused:
overriding ``format_help`` to lay out the whole help here would re-implement Typer's formatter
(Markdown help, ``[default: ...]``, env vars, ``[required]``, deprecation marks, panel grouping,
command lists), a second copy that drifts from Typer's on every release; and setting each
option's help text cannot move it below the option. So the one function that prints an options
panel, ``typer.rich_utils._print_options_panel``, is replaced while a help is formatted and
put back after (``_options_as_blocks_when_cut``), and the blocks reuse Typer's own parameter
help (``_get_parameter_help``) so that their text is exactly the table's. Typer is pinned below
0.29 in pyproject.toml; ``tests/commands/test_help.py`` checks that both hooks exist in the
Typer installed (a release without them fails there, loudly) and that every command's help
keeps this layout at 60 to 120 columns. With a Typer that lacks either hook, its own layout is
shown: help never fails.
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Callable, Iterator
from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup

ELLIPSIS = "…"

#: Terminals narrower than this get every option's help below the option: at 100-119 columns
#: the tables of prune and migrate would leave a help column under 40 or cut a name, so
#: commands would differ.
NARROW = 120

#: The narrowest help column a wide terminal's table may leave; else blocks.
MIN_HELP_COLUMN = 40


def _no_type(ctx: Any) -> None:
    return None


def _untyped(kind: Any) -> Any:
    """``kind`` (a parameter type, often a shared instance) as a copy whose help metavar is
    empty: Typer releases before 0.29 show an argument's type as ``<str>`` beside its name."""
    shown = copy.copy(kind)
    shown.get_metavar = lambda *args, **kwargs: ""
    return shown


def _plain_metavars(params: list[Any]) -> list[Any]:
    for p in params:
        if isinstance(p, TyperArgument):
            if p.metavar is None:
                p.metavar = (p.name or "").upper()
            setattr(p, "display_type_rich", _no_type)  # noqa: B010 - per parameter
            p.type = _untyped(p.type)
        elif getattr(p, "is_flag", False) or getattr(p, "count", False):
            if p.metavar is None:
                p.metavar = ""
        elif p.metavar is None and p.name not in ("help",):
            # `filter_`, `format_`: Python's trailing underscore is no part of the name.
            p.metavar = (p.name or "value").rstrip("_").upper()
    return params


class HelpCommand(TyperCommand):
    """A command whose help shows plain metavars."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_metavars(super().get_params(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        with _options_as_blocks_when_cut(), _unpadded_when_piped():
            super().format_help(ctx, formatter)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [
            piece[1:-1] if piece.startswith("{") and piece.endswith("}") else piece
            for piece in super().collect_usage_pieces(ctx)
        ]


class HelpGroup(TyperGroup):
    """``ckpt --help`` the same way: flags (``--version``, ``--install-completion``) without a
    ``<bool>`` type, options as blocks when the table would cut them."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_metavars(super().get_params(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        with _options_as_blocks_when_cut(), _unpadded_when_piped():
            super().format_help(ctx, formatter)


@contextlib.contextmanager
def _unpadded_when_piped() -> Iterator[None]:
    """Through a pipe, the help without the spaces Rich pads each line with to the width
    (``ckpt verify --help | grep``, a pager, a file): written whole once formatted. On a
    terminal it is printed as Typer prints it."""
    import sys

    if sys.stdout.isatty():
        yield
        return
    shown = io.StringIO()
    try:
        with contextlib.redirect_stdout(shown):
            yield
    finally:
        sys.stdout.write("".join(line.rstrip() + "\n" for line in shown.getvalue().splitlines()))


@contextlib.contextmanager
def _options_as_blocks_when_cut() -> Iterator[None]:
    """Typer's options panel, or blocks when its table would cut a cell (see the module)."""
    from typer import rich_utils

    original = getattr(rich_utils, "_print_options_panel", None)
    if original is None or not hasattr(rich_utils, "_get_parameter_help"):
        yield  # another Typer: its own layout
        return
    rich_utils._print_options_panel = _panel(original)
    try:
        yield
    finally:
        rich_utils._print_options_panel = original


def _panel(original: Callable[..., None]) -> Callable[..., None]:
    def panel(*, name: str, params: list[Any], ctx: Any, markup_mode: Any, console: Any) -> None:
        from rich.console import Console

        if not params:  # Typer prints no panel for none (the app's Arguments)
            return
        if console.width >= NARROW and _help_column(params, ctx, console.width) >= MIN_HELP_COLUMN:
            scratch = io.StringIO()
            probe = Console(
                width=console.width, file=scratch, color_system=None, force_terminal=False
            )
            original(name=name, params=params, ctx=ctx, markup_mode=markup_mode, console=probe)
            rendered = scratch.getvalue()
            written = "".join(str(getattr(p, "help", None) or "") for p in params)
            if rendered.count(ELLIPSIS) <= written.count(ELLIPSIS):
                original(
                    name=name, params=params, ctx=ctx, markup_mode=markup_mode, console=console
                )
                return
        _print_blocks(name=name, params=params, ctx=ctx, markup_mode=markup_mode, console=console)

    return panel


def _help_column(params: list[Any], ctx: Any, width: int) -> int:
    """About the width Typer's table leaves its help column: the panel's frame, then each name
    column as wide as its widest cell, one space of padding either side."""
    columns: list[list[str]] = []
    for param in params:
        opts = [o for o in param.opts if o.startswith("--")]
        shorts = [o for o in param.opts if not o.startswith("--")]
        negs = list(param.secondary_opts)
        cells = [
            "*" if param.required else "",
            ",".join(opts),
            ",".join(shorts),
            ",".join(negs),
            _type_shown(param, ctx),
        ]
        columns.append(cells)
    names = sum(max((len(row[i]) for row in columns), default=0) + 2 for i in range(5))
    return width - 4 - names


def _type_shown(param: Any, ctx: Any) -> str:
    """The type Typer's table shows for ``param`` (``display_type_rich`` where Typer has it;
    older releases: the metavar of an option, nothing for a flag)."""
    shown = getattr(param, "display_type_rich", None)
    if shown is not None:
        return str(shown(ctx=ctx) or "")
    if isinstance(param, TyperArgument) or getattr(param, "is_flag", False):
        return ""
    return str(param.make_metavar(ctx=ctx) or "")


def _print_blocks(
    *, name: str, params: list[Any], ctx: Any, markup_mode: Any, console: Any
) -> None:
    from rich.console import Group
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.text import Text
    from typer import rich_utils as ru

    blocks: list[Any] = []
    for param in params:
        head = Text(overflow="fold")
        if param.required:
            head.append(ru.REQUIRED_SHORT_STRING + " ", style=ru.STYLE_REQUIRED_SHORT)
        if isinstance(param, TyperArgument):
            head.append(param.metavar or (param.name or "").upper(), style=ru.STYLE_OPTION)
        else:
            longs = [o for o in param.opts if o.startswith("--")]
            shorts = [o for o in param.opts if not o.startswith("--")]
            head.append(", ".join(longs + shorts), style=ru.STYLE_OPTION)
            if param.secondary_opts:
                head.append(" / ")
                head.append(", ".join(param.secondary_opts), style=ru.STYLE_NEGATIVE_OPTION)
        kind = _type_shown(param, ctx)
        range_help = getattr(param, "_get_number_range_help_str", None)  # newer Typer only
        span = range_help() if range_help is not None else ""
        if kind or span:
            head.append(" ")
            head.append(" ".join(x for x in (kind, span and f"[{span}]") if x), ru.STYLE_TYPES)
        helptext = ru._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode)
        blocks += [head, Padding(helptext, (0, 0, 0, 4))]
    console.print(
        Panel(
            Group(*blocks),
            border_style=ru.STYLE_OPTIONS_PANEL_BORDER,
            title=name,
            title_align=ru.ALIGN_OPTIONS_PANEL,
        )
    )
