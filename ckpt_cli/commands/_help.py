"""``--help`` that reads like the manual: plain metavars and examples that render whole.

Typer shows a required argument as ``{path}`` in the usage line and a type column of ``<str>``,
``<bool>`` (for flags, which take no value) and ``<int range>``. ``HelpCommand`` (given to each
``app.command(cls=...)``) shows arguments as ``PATH``, flags without a type, and options without
a metavar of their own as ``NAME`` in capitals. Help text is Markdown (``rich_markup_mode``), so
``[null, model]`` is text, not a Rich style, and an indented ``$ ckpt ...`` block keeps its lines.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperCommand


def _no_type(ctx: Any) -> None:
    return None


class HelpCommand(TyperCommand):
    """A command whose help shows plain metavars."""

    def get_params(self, ctx: Any) -> list[Any]:
        params: list[Any] = super().get_params(ctx)
        for p in params:
            if isinstance(p, TyperArgument):
                if p.metavar is None:
                    p.metavar = (p.name or "").upper()
                setattr(p, "display_type_rich", _no_type)  # noqa: B010 - per parameter
            elif getattr(p, "is_flag", False) or getattr(p, "count", False):
                if p.metavar is None:
                    p.metavar = ""
            elif p.metavar is None and p.name not in ("help",):
                p.metavar = (p.name or "value").upper()
        return params

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [
            piece[1:-1] if piece.startswith("{") and piece.endswith("}") else piece
            for piece in super().collect_usage_pieces(ctx)
        ]
