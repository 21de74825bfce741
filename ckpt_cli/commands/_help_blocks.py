"""A command's whole ``--help`` with every option's help below the option, from public data.

What Typer's ``rich_format_help`` prints (usage, help text, argument and option panels grouped
by ``rich_help_panel``, the group's commands, epilog), drawn here the way Typer draws it in
``rich_markup_mode="markdown"`` except that each options panel is a list of blocks instead of a
table: the names, negative names and metavar on one line, the help indented by four below.
Everything is read from public attributes: Click's ``get_usage``, ``get_params``,
``list_commands``/``get_command``, ``get_default(ctx, call=False)``; each parameter's ``help``,
``envvar``/``show_envvar``, ``show_default``, ``required``, ``hidden``, ``rich_help_panel``;
Typer's public style constants and strings (``typer.rich_utils.STYLE_*``, ``DEFAULT_STRING``,
``ENVVAR_STRING``, ...). Why this is not Typer's own code called with other arguments: see
``_help.py``. ``tests/commands/test_help.py`` holds this text equal to Typer's own, line for
line outside the options panels and option by option inside them.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from enum import Enum
from typing import Any

from rich import box
from rich.align import Align
from rich.columns import Columns
from rich.console import Console, Group, RenderableType, group
from rich.emoji import Emoji
from rich.markdown import Markdown
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.theme import Theme
from typer import rich_utils as ru
from typer.core import TyperArgument, TyperGroup, TyperOption


def console() -> Console:
    """A console as Typer makes one for a help: its theme, highlighter, colours and width."""
    styles = {
        "option": ru.STYLE_OPTION,
        "switch": ru.STYLE_SWITCH,
        "negative_option": ru.STYLE_NEGATIVE_OPTION,
        "negative_switch": ru.STYLE_NEGATIVE_SWITCH,
        "types": ru.STYLE_TYPES,
        "types_sep": ru.STYLE_TYPES_SEPARATOR,
        "usage": ru.STYLE_USAGE,
    }
    return Console(
        theme=Theme(styles),
        highlighter=ru.highlighter,
        color_system=ru.COLOR_SYSTEM,
        force_terminal=ru.FORCE_TERMINAL,
        width=ru.MAX_WIDTH,
    )


def panels(obj: Any, ctx: Any) -> list[tuple[str, list[Any]]]:
    """(title, visible parameters) of each panel, in Typer's order: the Arguments panel, other
    panels of arguments, the Options panel, other panels of options; empty ones left out."""
    arguments: dict[str, list[Any]] = {ru.ARGUMENTS_PANEL_TITLE: []}
    options: dict[str, list[Any]] = {ru.OPTIONS_PANEL_TITLE: []}
    for param in obj.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        panel = getattr(param, "rich_help_panel", None)
        if isinstance(param, TyperArgument):
            arguments.setdefault(panel or ru.ARGUMENTS_PANEL_TITLE, []).append(param)
        elif isinstance(param, TyperOption):
            options.setdefault(panel or ru.OPTIONS_PANEL_TITLE, []).append(param)
    return [(title, params) for title, params in [*arguments.items(), *options.items()] if params]


def print_help(obj: Any, ctx: Any, out: Console) -> None:
    """``obj``'s help on ``out``, every options panel as blocks."""
    out.print(Padding(ru.highlighter(obj.get_usage(ctx)), 1), style=ru.STYLE_USAGE_COMMAND)
    if obj.help:
        out.print(Padding(Align(_help_text(obj), pad=False), (0, 1, 1, 1)))
    for title, params in panels(obj, ctx):
        out.print(_blocks(title, params, ctx))
    if isinstance(obj, TyperGroup):
        for table in _command_panels(obj, ctx):
            out.print(table)
    if obj.epilog:
        epilog = _markdown(obj.epilog, style="")
        out.print(Padding(Align(epilog, pad=False), 1))


def _markdown(text: str, *, style: str) -> Markdown:
    return Markdown(Emoji.replace(inspect.cleandoc(text)), style=style)


@group()
def _help_text(obj: Any) -> Iterator[RenderableType]:
    """The command's help: its first paragraph, then the rest dimmed (as Typer shows it)."""
    if obj.deprecated:
        yield Text(ru.DEPRECATED_STRING, style=ru.STYLE_DEPRECATED)
    text = inspect.cleandoc(obj.help or "").partition("\f")[0]
    first, *rest = text.split("\n\n")
    yield _markdown(first.strip(), style=ru.STYLE_HELPTEXT_FIRST_LINE)
    if rest:
        yield Text("")
        yield _markdown("\n\n".join(rest), style=ru.STYLE_HELPTEXT)


def _blocks(title: str, params: list[Any], ctx: Any) -> Panel:
    blocks: list[RenderableType] = []
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
        kind = type_shown(param, ctx)
        if kind:
            head.append(" ")
            head.append(kind, ru.STYLE_TYPES)
        blocks += [head, Padding(parameter_help(param, ctx), (0, 0, 0, 4))]
    return Panel(
        Group(*blocks),
        border_style=ru.STYLE_OPTIONS_PANEL_BORDER,
        title=title,
        title_align=ru.ALIGN_OPTIONS_PANEL,
    )


def type_shown(param: Any, ctx: Any) -> str:
    """The type Typer's table shows for ``param`` (``display_type_rich`` where Typer has it;
    else the metavar of an option, nothing for an argument or a flag)."""
    shown = getattr(param, "display_type_rich", None)
    if shown is not None:
        return str(shown(ctx=ctx) or "")
    if isinstance(param, TyperArgument) or getattr(param, "is_flag", False):
        return ""
    return str(param.make_metavar(ctx=ctx) or "")


def parameter_help(param: Any, ctx: Any) -> Columns:
    """The help cell of Typer's table: the help, then ``[env var: ...]``, ``[default: ...]``
    and ``[required]`` where they apply."""
    items: list[RenderableType] = []
    written = getattr(param, "help", None)
    if written:
        text = "\n".join(written.split("\n\n")).strip()
        items.append(_markdown(text, style=ru.STYLE_OPTION_HELP))
    envvar = _envvar(param, ctx)
    if envvar and getattr(param, "show_envvar", None):
        items.append(Text(ru.ENVVAR_STRING.format(envvar), style=ru.STYLE_OPTION_ENVVAR))
    default = _default_shown(param, ctx)
    if default:
        items.append(Text(ru.DEFAULT_STRING.format(default), style=ru.STYLE_OPTION_DEFAULT))
    if param.required:
        items.append(Text(ru.REQUIRED_LONG_STRING, style=ru.STYLE_REQUIRED_LONG))
    return Columns(items)


def _envvar(param: Any, ctx: Any) -> str:
    """The environment variable(s) read for ``param``, as Click resolves them."""
    envvar = getattr(param, "envvar", None)
    if envvar is None and getattr(param, "allow_from_autoenv", None) and param.name:
        prefix = getattr(ctx, "auto_envvar_prefix", None)
        envvar = None if prefix is None else f"{prefix}_{param.name.upper()}"
    if envvar is None:
        return ""
    return envvar if isinstance(envvar, str) else ", ".join(str(e) for e in envvar)


def _default_shown(param: Any, ctx: Any) -> str:
    """What goes in ``[default: ...]``, or ""; the default read without calling a factory or
    converting it (Click's resilient parsing, as for its own help)."""
    resilient = ctx.resilient_parsing
    ctx.resilient_parsing = True
    try:
        value = param.get_default(ctx, call=False)
    finally:
        ctx.resilient_parsing = resilient
    as_text = isinstance(param.show_default, str)
    if not as_text and (value is None or not (param.show_default or ctx.show_default)):
        return ""
    return _default_string(param, value, as_text=as_text)


def _default_string(param: Any, value: Any, *, as_text: bool) -> str:
    if as_text:
        return f"({param.show_default})"
    if isinstance(value, (list, tuple)):
        parts = [_default_string(param, v, as_text=False) for v in value]
        return ", ".join(parts) if any(parts) else ""
    if isinstance(value, Enum):
        return str(value.value)
    if inspect.isfunction(value):
        return "(dynamic)"
    if isinstance(param, TyperOption) and param.is_bool_flag:
        if param.secondary_opts:  # the name of the flag in force, without its prefix
            if not param.default:
                return _unprefixed(param.secondary_opts[0])
            return _unprefixed(param.opts[0]) if param.opts else str(value)
        if not value:
            return ""
    return "" if value is None else str(value)


def _unprefixed(opt: str) -> str:
    """``--zarr3`` -> ``zarr3``, ``-s`` -> ``s``, ``/debug`` -> ``debug`` (Click's prefixes)."""
    first = opt[:1]
    if first.isalnum():
        return opt
    return opt[2:] if opt[1:2] == first else opt[1:]


def _command_panels(obj: Any, ctx: Any) -> list[Panel]:
    """The group's visible commands by ``rich_help_panel``, one table each, the first column
    as wide as the longest name of any panel."""
    by_panel: dict[str, list[Any]] = {ru.COMMANDS_PANEL_TITLE: []}
    for name in obj.list_commands(ctx):
        command = obj.get_command(ctx, name)
        if command is not None and not command.hidden:
            title = getattr(command, "rich_help_panel", None) or ru.COMMANDS_PANEL_TITLE
            by_panel.setdefault(title, []).append(command)
    widest = max((len(c.name or "") for cs in by_panel.values() for c in cs), default=0)
    return [_commands(title, cs, widest) for title, cs in by_panel.items() if cs]


def _commands(title: str, commands: list[Any], widest: int) -> Panel:
    table = Table(
        highlight=False,
        show_header=False,
        expand=True,
        box=getattr(box, ru.STYLE_COMMANDS_TABLE_BOX, None),
        show_lines=ru.STYLE_COMMANDS_TABLE_SHOW_LINES,
        leading=ru.STYLE_COMMANDS_TABLE_LEADING,
        border_style=ru.STYLE_COMMANDS_TABLE_BORDER_STYLE,
        row_styles=ru.STYLE_COMMANDS_TABLE_ROW_STYLES,
        pad_edge=ru.STYLE_COMMANDS_TABLE_PAD_EDGE,
        padding=ru.STYLE_COMMANDS_TABLE_PADDING,
    )
    table.add_column(style=ru.STYLE_COMMANDS_TABLE_FIRST_COLUMN, no_wrap=True, width=widest)
    table.add_column("Description", justify="left", no_wrap=False, ratio=10)
    deprecated = any(c.deprecated for c in commands)
    for command in commands:
        style = ru.STYLE_DEPRECATED_COMMAND if command.deprecated else ""
        name = Text(command.name or "", style=style)
        first = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]
        first = first.replace("\b\n", "") if first.startswith("\b") else first.replace("\n", " ")
        row: list[RenderableType | None] = [
            name,
            _markdown(first.strip(), style=ru.STYLE_OPTION_HELP),
        ]
        if deprecated:
            mark = Text(ru.DEPRECATED_STRING, style=ru.STYLE_DEPRECATED)
            row.append(mark if command.deprecated else None)
        table.add_row(*row)
    return Panel(
        table,
        border_style=ru.STYLE_COMMANDS_PANEL_BORDER,
        title=title,
        title_align=ru.ALIGN_COMMANDS_PANEL,
    )
