"""verify's problems as blocks: ``severity  code``, then the leaf and file whole, then the
message wrapped at spaces to the terminal (one line through a pipe). A table folded each column
inside its own width and cut words out of the messages at 80 columns."""

from __future__ import annotations

from collections.abc import Iterable

from ckpt_cli.commands.render.layout import Paint, wrap
from ckpt_cli.core.verify.problems import Problem

INDENT = "  "


def problem_lines(problems: Iterable[Problem], paint: Paint, width: int | None) -> list[str]:
    out: list[str] = []
    for p in problems:
        colour = "red" if p.severity == "error" else "yellow"
        out.append(f"{paint(p.severity, colour)}  {paint(p.code, 'bold')}")
        for label, value in (("leaf", p.leaf), ("file", p.file)):
            if value:
                out.append(f"{INDENT}{paint(label + ':', 'dim')} {paint(value, '')}")
        out += [paint(line, "") for line in wrap(p.message, width, first=INDENT, indent=INDENT)]
    return out
