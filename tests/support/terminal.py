"""``ckpt`` on a pseudo-terminal of a given size, as a person at a terminal runs it.

The window size is set on the terminal (``TIOCSWINSZ``) and in ``COLUMNS``/``LINES``; stdin,
stdout and (unless ``stderr_tty=False``) stderr are the terminal. The screen text comes back
with ANSI sequences removed and ``\\r\\n`` turned into ``\\n``: one logical line per printed line,
before the terminal folds anything, so a line wider than the window is visible as such.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.interrupts import CKPT

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[=>78]")


def plain(raw: str) -> str:
    """Screen text without colours, cursor movements or hyperlinks; CR-LF as LF."""
    text = _ANSI.sub("", raw).replace("\r\n", "\n")
    # Progress bars redraw a line with a bare CR: keep what was drawn last.
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


def display_width(line: str) -> int:
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)


@dataclass
class Screen:
    code: int
    text: str  # what the terminal showed (stdout, and stderr when it is the terminal)
    stderr: str  # stderr when it was a pipe
    columns: int

    @property
    def lines(self) -> list[str]:
        return self.text.split("\n")

    def too_wide(self) -> list[str]:
        """Lines wider than the window, except one unbreakable word (a path longer than the
        terminal: cutting it is the worse choice)."""
        return [
            line
            for line in self.lines
            if display_width(line) > self.columns and len(line.split()) > 1
        ]


class Terminal:
    """One ``ckpt`` process on a pseudo-terminal; read what it shows, type, send signals."""

    def __init__(
        self,
        args: list[str],
        columns: int = 80,
        rows: int = 40,
        *,
        stderr_tty: bool = True,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.columns = columns
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        environment = {**os.environ, "COLUMNS": str(columns), "LINES": str(rows)}
        environment.update({"TERM": "xterm-256color", **(env or {})})
        for name in ("NO_COLOR", "FORCE_COLOR", "CI"):
            environment.pop(name, None)
        self.master = master
        self.proc = subprocess.Popen(
            [CKPT, *[str(a) for a in args]],
            stdin=slave,
            stdout=slave,
            stderr=slave if stderr_tty else subprocess.PIPE,
            env=environment,
            cwd=cwd,
            start_new_session=True,
            # The terminal becomes the controlling terminal, as in a shell.
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        os.close(slave)
        self.raw = b""

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: every process holding the terminal has gone
            return False
        if not data:
            return False
        self.raw += data
        return True

    @property
    def text(self) -> str:
        return plain(self.raw.decode(errors="replace"))

    def expect(self, needle: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            if time.monotonic() > deadline or not self._read(0.1):
                if needle in self.text:
                    return
                raise AssertionError(f"{needle!r} never shown; the screen:\n{self.text}")

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def signal(self, sig: signal.Signals) -> None:
        # As the terminal does for Ctrl-C: the whole foreground process group.
        os.killpg(self.proc.pid, sig)

    def finish(self, timeout: float = 60) -> Screen:
        deadline = time.monotonic() + timeout
        while self._read(0.1):
            if time.monotonic() > deadline:
                os.killpg(self.proc.pid, signal.SIGKILL)
                raise AssertionError(f"still running after {timeout} s:\n{self.text}")
            if self.proc.poll() is not None and not select.select([self.master], [], [], 0)[0]:
                break
        code = self.proc.wait()
        os.close(self.master)
        err = self.proc.stderr.read().decode() if self.proc.stderr else ""
        return Screen(code, self.text, err, self.columns)


def run_on_terminal(
    args: list[str], columns: int, *, stderr_tty: bool = False, **kw: object
) -> Screen:
    """Run to the end on a terminal ``columns`` wide (stderr a pipe unless ``stderr_tty``)."""
    return Terminal(args, columns, stderr_tty=stderr_tty, **kw).finish()  # type: ignore[arg-type]
