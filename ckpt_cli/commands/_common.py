"""Shared option aliases, output helpers and human formatting for the commands."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import Annotated, Any

import typer
from rich.console import Console

SCHEMA_VERSION = 1

PathArg = Annotated[
    str,
    typer.Argument(
        help="A CheckpointManager root, a step directory or an item directory.", show_default=False
    ),
]
StepOpt = Annotated[
    int | None,
    typer.Option(
        "--step",
        "-s",
        help="Step to read from a root (default: latest committed).",
        show_default=False,
    ),
]
ItemOpt = Annotated[
    str | None,
    typer.Option("--item", "-i", help="Item to read (default: the only one).", show_default=False),
]
FilterOpt = Annotated[
    str | None,
    typer.Option(
        "--filter",
        "-f",
        help="Only leaves whose dotted name matches: a glob ('params.*kernel'), a regex "
        "('^opt_state\\.'), or re:REGEX.",
        show_default=False,
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON document on stdout (no colour, no progress)."),
]


def stdout_console() -> Console:
    # Piped output (logs, CI) is not cut to 80 columns: nobody reads it in a narrow window.
    return Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 200)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def emit_json(doc: dict[str, Any]) -> None:
    # Indented for a person at a terminal; compact for pipes, where indent=2 would push json
    # onto its slow pure-Python encoder (7x slower on 10,000 leaves, bench/).
    indent = 2 if sys.stdout.isatty() else None
    sys.stdout.write(
        json.dumps({"schema_version": SCHEMA_VERSION, **doc}, indent=indent, default=str) + "\n"
    )


def warn(message: str) -> None:
    sys.stderr.write(f"ckpt: warning: {message}\n")


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def human_count(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def human_age(then: datetime, now: datetime | None = None) -> str:
    seconds = ((now or datetime.now(timezone.utc)) - then).total_seconds()
    if seconds < 0:
        return "in the future"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def shape_str(shape: tuple[int, ...] | None) -> str:
    return "" if shape is None else "[" + ",".join(str(d) for d in shape) + "]"


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def parse_size(text: str, option: str) -> int:
    """``1GiB``, ``512MiB``, ``64M``, ``1000000`` -> bytes."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        from ckpt_cli.errors import UsageError

        raise UsageError(f"{option} {text!r} is not a size: use e.g. 512MiB, 1GiB or bytes")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
