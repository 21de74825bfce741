"""SIGINT and SIGTERM in ckpt: how a run is stopped, from the first line of the app to its exit.

Four phases, each with its handler:

- while ckpt is still importing (``while_starting``, installed by ``ckpt_cli.app`` before any
  slow import): nothing to clean up yet, so one line and the exit code, no traceback of the
  import cut short;
- while a command runs (``install``, from ``app.main``): the signal raises ``Interrupted``
  past ``except Exception`` so the cleanup on the way out runs; a second signal during that
  cleanup stops the process at once;
- once the run is over (``finished``): a signal while the interpreter joins threads and runs
  exit callbacks ends the process with the run's own exit code (one that comes as the command's
  exit passes ``app.main``, before ``finished`` is in, does the same there);
- past the last exit callback (``ignore_at_exit``): ignored, so a late signal cannot turn a
  finished run into a death by signal.

The hooks of ``quiet_hooks`` keep an extension's report of an interrupted import or callback
(``PyErr_Print``, an unraisable error) off stderr: the boundary reports the stop in one line.

Only the standard library at module level: this module is imported before anything slow.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: The signal that stopped the current run (at most one: a second one exits at once).
_stopping: list[int] = []


def _exit_while_starting(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C/SIGTERM while ckpt is still importing: nothing to clean up yet, and no
    traceback of the import that was cut short (``install`` puts the real handler in)."""
    sys.stderr.write("ckpt: interrupted\n")
    os._exit(128 + signum)


def _ignore_signals_at_exit() -> None:
    """The last exit callback (registered first): past it the interpreter restores the default
    action of a signal it handled while it tears down, so a late signal would kill a finished
    run (exit -2/-15, no line). Ignored from here (process-wide, which the interpreter leaves
    alone), it is dropped and the run's own exit code stands."""
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def while_starting() -> None:
    """The first thing ckpt does: the starting handler, and the exit callback that runs last."""
    for signum in SIGNALS:
        signal.signal(signum, _exit_while_starting)
    atexit.register(_ignore_signals_at_exit)


def from_interrupt(error: BaseException | None) -> bool:
    """Whether ``error`` is an ``Interrupted`` or was raised while handling one (an extension
    turns it into an ``ImportError`` of its own: its cause or context is the interrupt)."""
    from ckpt_cli.errors import Interrupted

    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, Interrupted):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def quiet_unraisable(hook: Callable[[Any], None]) -> Callable[[Any], None]:
    """``sys.unraisablehook`` that says nothing of an ``Interrupted`` raised where Python can
    only print it (a destructor, a callback of an extension): the boundary reports the stop."""

    def quiet(unraisable: Any) -> None:
        if not from_interrupt(unraisable.exc_value):
            hook(unraisable)

    return quiet


def quiet_excepthook(hook: Callable[..., None]) -> Callable[..., None]:
    """``sys.excepthook`` that prints nothing for an ``Interrupted`` (or an error raised from
    one): C code that reports an error through ``PyErr_Print`` (an extension's import of another
    one's C API) would print its traceback; the boundary reports the stop in one line."""

    def quiet(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if not from_interrupt(value):
            hook(kind, value, tb)

    return quiet


def quiet_hooks() -> None:
    """Install both quiet hooks. Before Typer is imported: it keeps the hook it finds as the
    one its own hook calls."""
    sys.excepthook = quiet_excepthook(sys.__excepthook__)
    sys.unraisablehook = quiet_unraisable(sys.__unraisablehook__)


def on_signal(signum: int, frame: FrameType | None) -> None:
    """SIGINT/SIGTERM: stop the run through ``Interrupted`` (its cleanup runs on the way out);
    a second signal during that cleanup stops the process at once."""
    from ckpt_cli.errors import Interrupted

    if _stopping:
        sys.stderr.write(
            "ckpt: interrupted again: stopped without cleaning up (a later run of the same "
            "command removes the unfinished step it left)\n"
        )
        sys.stderr.flush()
        os._exit(128 + signum)
    if _importing(frame):
        # Cut short, an extension's module init fails in its own way: numpy's C API prints the
        # traceback of the import it could not finish to stderr before ckpt can say a word.
        # Let the import finish and take the signal again right after it (imports take
        # milliseconds; the repeat checks again).
        import threading

        again = threading.Timer(0.02, os.kill, (os.getpid(), signum))
        again.daemon = True
        again.start()
        return
    _stopping.append(signum)
    raise Interrupted(signum)


def _importing(frame: FrameType | None) -> bool:
    """Whether the main thread is inside an import (a frame of importlib's bootstrap)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def install() -> None:
    """A run begins: a signal from now on raises ``Interrupted`` (``on_signal``)."""
    _stopping.clear()
    for signum in SIGNALS:
        signal.signal(signum, on_signal)


def stopped_by() -> int | None:
    """The signal that stopped this run, or None."""
    return _stopping[0] if _stopping else None


def finished(code: int) -> None:
    """The run is over (output written, cleanup done): a signal from now on, while the
    interpreter joins threads and runs exit callbacks, ends the process with this code."""

    def exit_now(signum: int, frame: FrameType | None) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    for signum in SIGNALS:
        signal.signal(signum, exit_now)
