"""Ctrl-C and SIGTERM: one exception that nothing mistakes for a failure of the data.

``app.main`` installs ``handle_signals()``: the first SIGINT or SIGTERM raises ``Interrupted`` in
the main thread, wherever it is (inside a TensorStore ``Future.result()`` too: TensorStore runs
Python's signal handlers while it waits). ``Interrupted`` derives from ``BaseException``, so the
``except Exception`` blocks that turn a failed read into a finding ("a chunk cannot be decoded")
or a storage error let it through; the ``finally`` blocks on its way clean up (cancel and drain
futures, stop workers, remove the unfinished step). The boundary prints ``ckpt: interrupted``
and exits 130 (SIGINT) or 143 (SIGTERM), as shells and schedulers expect (128 + the signal).

A second signal while that cleanup runs stops the process at once, naming what may be left.
Worker processes ignore SIGINT (``ignore_in_worker``): a terminal sends Ctrl-C to the whole
process group, and the driver, not each worker, decides how the run ends.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """The run was stopped by a signal (Ctrl-C, ``kill``, ``timeout``, a scheduler)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _State:
    def __init__(self) -> None:
        self.signum: int | None = None
        #: What a forced stop leaves behind, said on stderr (set while a step is written).
        self.leftovers: list[str] = []


_state = _State()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _state.signum is None:
        _state.signum = signum
        raise Interrupted(signum)
    # A second signal during the cleanup: stop now.
    left = "; ".join(_state.leftovers)
    sys.stderr.write(
        "ckpt: interrupted again: stopped without cleaning up"
        + (f"; left {left} (remove it, or let the next ckpt run remove it)" if left else "")
        + "\n"
    )
    sys.stderr.flush()
    os._exit(128 + signum)


@contextmanager
def handle_signals() -> Iterator[None]:
    """Raise ``Interrupted`` on SIGINT and SIGTERM while the block runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _on_signal) for s in SIGNALS}
    _state.signum = None
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def interrupted() -> bool:
    """Whether a signal has asked this process to stop."""
    return _state.signum is not None


@contextmanager
def leaving(description: str) -> Iterator[None]:
    """While the block runs, a forced stop (a second signal) names ``description`` as left."""
    _state.leftovers.append(description)
    try:
        yield
    finally:
        _state.leftovers.remove(description)


def cancel(futures: Iterable[Any]) -> None:
    """Cancel TensorStore (or concurrent.futures) futures; finished ones are left alone."""
    for fut in futures:
        cancel_one = getattr(fut, "cancel", None)
        if cancel_one is not None:
            try:
                cancel_one()
            except Exception:  # a future that cannot be cancelled is drained later
                continue


def ignore_in_worker() -> None:
    """Initializer of worker processes: Ctrl-C reaches the whole process group; the driver
    handles it and stops the workers, so a worker neither dies on it nor prints a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
