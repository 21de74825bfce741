"""``ckpt`` run in-process through its real entry point, and the commands the app registers."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> CliResult:
    """Run ``ckpt ARGS`` through the real entry point (the one error boundary) in-process."""
    from ckpt_cli.app import main

    capsys.readouterr()
    old = sys.argv
    sys.argv = ["ckpt", *args]
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old
    out = capsys.readouterr()
    return CliResult(code, out.out, out.err)


def app_commands() -> set[str]:
    import typer

    from ckpt_cli.app import app

    group = typer.main.get_command(app)
    names = set(group.commands)  # type: ignore[attr-defined]
    assert names, "the Typer app registers no command"
    return names
