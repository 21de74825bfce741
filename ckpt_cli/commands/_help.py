"""``--help`` that reads like the manual: plain metavars and examples that render whole.

Typer shows a required argument as ``{path}`` in the usage line and a type column of ``<str>``,
``<bool>`` (for flags, which take no value) and ``<int range>``. ``HelpCommand`` (given to each
``app.command(cls=...)``, and ``HelpGroup`` to the app) shows arguments as ``PATH``, flags
without a type, and options without a metavar of their own as ``NAME`` in capitals. Help text is
Markdown (``rich_markup_mode``), so ``[null, model]`` is text, not a Rich style, and an indented
``$ ckpt ...`` block keeps its lines.

One layout for every command: Typer lays options out as a table whose name columns never wrap,
so the help is squeezed into what the longest names leave (24 characters of ``verify --help``
at 80 columns) and a long name, metavar or unbreakable word is cut with an ellipsis. Below
``NARROW`` columns the help is drawn with every options panel as blocks: the names, negative
names and metavar on one line, the help indented below it, every line wrapped at spaces. A wider
terminal gets Typer's own help, untouched, unless a panel's help column would be narrower than
``MIN_HELP_COLUMN`` or Typer's table would cut a cell (its help is rendered first into a scratch
buffer to see); then the blocks again.

Public API only. ``HelpCommand``/``HelpGroup`` are given to Typer by its public ``cls=``
parameter and override Click's public ``get_params``, ``format_help`` and
``collect_usage_pieces``. Typer has no public setting for where an option's help goes, and its
one function that lays out a help, ``typer.rich_utils.rich_format_help``, prints every panel as
a table; replacing its private panel function while a help is printed (what ckpt did before)
ties the CLI to Typer internals that change without notice. So where the blocks are wanted,
``format_help`` draws the whole help itself (``_help_blocks.py``): usage, help text, panels,
the group's commands and epilog, from Click's and Typer's public attributes and Typer's public
style constants, in Markdown as Typer renders it. That is a second copy of Typer's layout, kept
from drifting by a test (``tests/commands/test_help.py``) that holds it equal to Typer's own
output line for line outside the options panels and option by option inside them, for every
command, on the Typer installed. A markup mode other than Markdown (not ckpt's) gets Typer's
own help at every width. ``tests/test_architecture.py`` fails on any private name of Typer,
Click or Rich used anywhere in ``ckpt_cli``.
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
        with _unpadded_when_piped():
            _format_help(self, ctx, lambda: super(HelpCommand, self).format_help(ctx, formatter))

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
        with _unpadded_when_piped():
            _format_help(self, ctx, lambda: super(HelpGroup, self).format_help(ctx, formatter))


def _format_help(obj: Any, ctx: Any, typers: Callable[[], None]) -> None:
    """Typer's own help (``typers``) where its tables fit, else the help drawn with blocks."""
    from ckpt_cli.commands import _help_blocks as blocks

    if getattr(obj, "rich_markup_mode", None) != "markdown":
        typers()
        return
    out = blocks.console()
    if _tables_fit(obj, ctx, out.width, typers):
        typers()
    else:
        blocks.print_help(obj, ctx, out)


def _tables_fit(obj: Any, ctx: Any, width: int, typers: Callable[[], None]) -> bool:
    """Whether Typer's tables keep every cell whole with a help column of at least
    ``MIN_HELP_COLUMN`` at ``width``: its help is rendered into a scratch buffer (Rich takes
    the width from the terminal, not from the file written to) and no more ellipses may show
    than the help texts hold."""
    from ckpt_cli.commands._help_blocks import panels

    shown = panels(obj, ctx)
    if width < NARROW or any(_help_column(ps, ctx, width) < MIN_HELP_COLUMN for _, ps in shown):
        return False
    scratch = io.StringIO()
    with contextlib.redirect_stdout(scratch):
        typers()
    return scratch.getvalue().count(ELLIPSIS) <= _written(obj, ctx, shown).count(ELLIPSIS)


def _written(obj: Any, ctx: Any, shown: list[tuple[str, list[Any]]]) -> str:
    """Every text of the help as written: an ellipsis in it is no cut."""
    texts = [obj.help or "", obj.epilog or ""]
    texts += [str(getattr(p, "help", None) or "") for _, ps in shown for p in ps]
    if isinstance(obj, TyperGroup):
        for name in obj.list_commands(ctx):
            command = obj.get_command(ctx, name)
            texts.append("" if command is None else command.short_help or command.help or "")
    return "".join(texts)


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


def _help_column(params: list[Any], ctx: Any, width: int) -> int:
    """About the width Typer's table leaves its help column: the panel's frame, then each name
    column as wide as its widest cell, one space of padding either side."""
    from ckpt_cli.commands._help_blocks import type_shown

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
            type_shown(param, ctx),
        ]
        columns.append(cells)
    names = sum(max((len(row[i]) for row in columns), default=0) + 2 for i in range(5))
    return width - 4 - names
