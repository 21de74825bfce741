"""The signal handler of ``app.main`` (``ckpt_cli.signals``), in a process of its own: what the boundary relies on."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = r"""
import os, signal, sys, time
from ckpt_cli.signals import on_signal
from ckpt_cli.errors import Interrupted
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, on_signal)
caught = []
try:
    try:
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
        time.sleep(5)
    except Exception as e:  # what the core's read loops catch: must not see it
        caught.append(repr(e))
except Interrupted as e:
    print("INTERRUPTED", e.exit_code, caught)
"""


@pytest.mark.parametrize(("sig", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_signal_raises_interrupted_past_except_exception(sig: str, code: int) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, sig], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["INTERRUPTED", str(code), "[]"]


SECOND = r"""
import os, signal, time
from ckpt_cli.signals import on_signal
from ckpt_cli.errors import Interrupted
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, on_signal)
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
except Interrupted:
    os.kill(os.getpid(), signal.SIGTERM)  # a second signal during the cleanup
    time.sleep(5)
print("not reached")
"""


def test_second_signal_stops_at_once() -> None:
    proc = subprocess.run([sys.executable, "-c", SECOND], capture_output=True, text=True)
    assert proc.returncode == 143
    assert proc.stdout == ""
    assert "interrupted again" in proc.stderr


def test_errors_raised_from_an_interrupt_are_not_printed_by_the_hooks() -> None:
    """An extension that turns the Interrupted into an ImportError and reports it through
    PyErr_Print (sys.excepthook) or as unraisable prints nothing; other errors still print."""
    from types import SimpleNamespace

    from ckpt_cli.errors import Interrupted
    from ckpt_cli.signals import quiet_excepthook, quiet_unraisable

    def chained() -> ImportError:
        try:
            try:
                raise Interrupted(15)
            except Interrupted as e:
                raise ImportError("initialization failed") from e
        except ImportError as e:
            return e

    printed: list[object] = []
    hook = quiet_excepthook(lambda kind, value, tb: printed.append(value))
    unraisable = quiet_unraisable(lambda u: printed.append(u.exc_value))
    quiet = [chained(), Interrupted(2)]
    for error in quiet:
        hook(type(error), error, None)
        unraisable(SimpleNamespace(exc_value=error))
    assert printed == []
    other = ValueError("a real bug")
    hook(ValueError, other, None)
    unraisable(SimpleNamespace(exc_value=other))
    assert printed == [other, other]


AT_THE_END = r"""
import os, signal, sys
from ckpt_cli import app, signals

def run():  # a command that wrote its output and exits with its own code
    print("the output")
    sys.stdout.flush()
    sys.exit(int(sys.argv[2]))

def once(function):
    sent = []
    def wrapped(*args):
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), getattr(signal, sys.argv[1]))
        return function(*args)
    return wrapped

app._run = run
# The signal lands in the handler that takes the run's SystemExit, before `finished` (in
# `_status`) or while `finished` puts its handlers in: the window CI once hit (exit 1, nothing).
if sys.argv[3] == "status":
    app._status = once(app._status)
else:
    signals.finished = once(signals.finished)
app.main()
"""


@pytest.mark.parametrize("where", ["status", "finished"])
@pytest.mark.parametrize("code", [0, 3])
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_as_the_run_ends_leaves_its_exit_code(sig: str, code: int, where: str) -> None:
    """A signal after the command has ended (output written, SystemExit on its way out) but
    before ``signals.finished`` took over: the run ends as it would have, with its own code and
    nothing on stderr (not an uncaught Interrupted: exit 1 and no line)."""
    proc = subprocess.run(
        [sys.executable, "-c", AT_THE_END, sig, str(code), where],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (code, "the output\n", "")
