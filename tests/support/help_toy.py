"""A toy Typer app with the help corners no ckpt command has, drawn by ckpt's ``HelpCommand``:
panels by ``rich_help_panel``, a hidden option, an environment variable shown, Enum, list and
named defaults, a flag pair, a deprecated command, an epilog, a second commands panel
(``tests/commands/test_help.py`` holds its help equal to Typer's own)."""

from __future__ import annotations

import enum
from typing import Annotated

import typer

from ckpt_cli.commands._help import HelpCommand, HelpGroup


class Mode(enum.Enum):
    fast = "fast"
    safe = "safe"


app = typer.Typer(name="toy", cls=HelpGroup, rich_markup_mode="markdown", help="A toy.")


@app.command(cls=HelpCommand, epilog="See also `ckpt verify`.", deprecated=True)
def run(
    path: Annotated[str, typer.Argument(help="Where.")],
    extra: Annotated[str, typer.Argument(help="More.", rich_help_panel="Inputs")] = "x",
    mode: Annotated[Mode, typer.Option(help="How *fast*.", show_default=True)] = Mode.safe,
    tags: Annotated[list[str], typer.Option(help="Tags.", show_default=True)] = ["a", "b"],  # noqa: B006
    token: Annotated[str, typer.Option(envvar="TOY_TOKEN", show_envvar=True, help="Secret.")] = "",
    when: Annotated[str, typer.Option(show_default="the start", rich_help_panel="Timing")] = "now",
    zarr3: Annotated[bool, typer.Option("--zarr3/--zarr2", help="Format.")] = True,
    ghost: Annotated[int, typer.Option(hidden=True)] = 1,
) -> None:
    """Run the toy.

    Second paragraph with `code` and **bold**.
    """


@app.command(cls=HelpCommand, rich_help_panel="More")
def other(count: Annotated[int, typer.Option(min=1, help="How many.")] = 1) -> None:
    """Another toy."""


@app.command(cls=HelpCommand)
def cut(
    url: Annotated[
        str,
        typer.Option(
            help="Fetch https://example.com/a/very/long/unbreakable/path/that/goes/on/and/on/"
            "forever/and/ever/and/ever/more/index.html first."
        ),
    ] = "",
) -> None:
    """A word Typer's table would cut with an ellipsis at 120 columns."""


@app.command(cls=HelpCommand)
def narrow(
    name: Annotated[
        str,
        typer.Option(
            "--an-option-name-so-long-the-help-column-gets-narrow",
            metavar="A_LONG_METAVAR_FOR_IT",
            help="Help long enough to wrap over several lines of a narrow help column.",
        ),
    ] = "",
) -> None:
    """Names that would leave Typer's help column under 40 characters (and be cut) at 120."""
