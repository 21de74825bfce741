"""Forcing an interleaving of two commands on one bucket root: hold a chosen request of one
command at the S3 test server (moto's ``S3Server.before_request``) until the test releases it.

    with hold(s3.server, "PUT", r"/5/\\.ckpt-writing$") as held:
        writer = start("cp", src, dst)
        held.wait_reached(writer)  # the writer is now blocked inside that request
        other = ckpt("prune", dst, "--clean-tmp", ...)  # runs to its end meanwhile
    # leaving the block releases the writer; or call held.release() inside it

Several holds may be active on one server at once (each its own request); a request that
matches none passes. Leaving the ``with`` block always releases every held request, so a
failing test never leaves a command blocked. The commands run in their own processes (the
``start``/``ckpt`` helpers of tests/support/ckpt_process.py): nothing in ckpt knows it is tested.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from tests.support.remote_servers import BUCKET, S3Server

#: How long a held request waits for its release at most (a test that forgets it fails, the
#: server thread does not hang forever).
HOLD_LIMIT = 120.0


class Hold:
    """The ``nth`` request whose method is ``method`` and whose key (the path after the bucket)
    matches ``key_regex`` is held until ``release()``; the others pass."""

    def __init__(self, server: S3Server, method: str, key_regex: str, nth: int = 1) -> None:
        self.server = server
        self.method = method
        self.pattern = re.compile(key_regex)
        self.nth = nth
        self.seen = 0
        #: The key of the held request, once one is held.
        self.key: str | None = None
        self.reached = threading.Event()
        self._gate = threading.Event()
        self._lock = threading.Lock()

    def matches(self, method: str, path: str) -> bool:
        key = path.lstrip("/").removeprefix(f"{BUCKET}/")
        if method != self.method or not self.pattern.search(key):
            return False
        with self._lock:
            self.seen += 1
            if self.seen != self.nth:
                return False
            self.key = key
        return True

    def block(self) -> None:
        self.reached.set()
        self._gate.wait(HOLD_LIMIT)

    def release(self) -> None:
        self._gate.set()

    def wait_reached(self, *procs: subprocess.Popen[str], timeout: float = 120) -> None:
        """Until the request is held; fails at once if one of ``procs`` exits first (it never
        made that request), with its stderr."""
        deadline = time.monotonic() + timeout
        while not self.reached.wait(0.02):
            for p in procs:
                if p.poll() is not None:
                    err = p.stderr.read() if p.stderr else ""
                    raise AssertionError(
                        f"{p.args!r} exited {p.returncode} before {self.method} "
                        f"{self.pattern.pattern}: {err[-400:]}"
                    )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {self.method} {self.pattern.pattern} in {timeout} s")

    def __enter__(self) -> Hold:
        _install(self.server).append(self)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
        holds = _install(self.server)
        if self in holds:
            holds.remove(self)
        if not holds:
            self.server.before_request = None


def hold(server: S3Server, method: str, key_regex: str, nth: int = 1) -> Hold:
    """A ``Hold`` on ``server`` (a context manager: see the module's docstring). ``method``: the
    HTTP method, or ``LIST`` for a listing (``S3Server`` counts them apart)."""
    return Hold(server, method, key_regex, nth)


def _install(server: S3Server) -> list[Hold]:
    """The holds of ``server``, its ``before_request`` hook dispatching to them."""
    current: Any = server.before_request
    holds: list[Hold] | None = getattr(current, "holds", None)
    if holds is not None:
        return holds
    assert current is None, "another before_request hook is installed on this server"
    holds = []

    def dispatch(method: str, path: str) -> None:
        for h in list(holds):
            if h.matches(method, path):
                h.block()
                return

    dispatch.holds = holds  # type: ignore[attr-defined]
    server.before_request = dispatch
    return holds


def wait_for(cond: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)
