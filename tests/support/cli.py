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


TRACEBACK = "Traceback (most recent call last):"


def ckpt_failure(stderr: str) -> str | None:
    """ckpt's own internal error in ``stderr`` (its ``ckpt: internal error`` line, or a
    traceback through a frame of ``ckpt_cli``: a thread of ckpt's that died), or None.

    A traceback with no frame of ckpt's is not the command's: in-process runs share
    ``sys.stderr`` with what other tests left running, e.g. a TensorStore future an Orbax call
    awaited in an asyncio loop that has closed since; it completes later and TensorStore's
    thread prints ``RuntimeError: Event loop is closed`` (asyncio frames only) into whatever
    captures ``sys.stderr`` at that moment (seen once in a clean-clone CI, during a fuzz run)."""
    for line in stderr.splitlines():
        if line.startswith("ckpt: internal error"):
            return line
    for chunk in stderr.split(TRACEBACK)[1:]:
        block = []
        for line in chunk.splitlines()[1:]:
            block.append(line)
            if line and not line[0].isspace():
                break  # the exception's own line ends the traceback
        if any(line.lstrip().startswith("File ") and "ckpt_cli" in line for line in block):
            return TRACEBACK + "\n" + "\n".join(block)
    return None
