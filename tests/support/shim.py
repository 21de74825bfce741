"""Run ``ckpt ARGS`` with fault injection at the level of the operating system calls.

Used by the hostile-input and fault tests to stop, kill or interrupt a ckpt process at an exact
point, or to make an entry vanish between two listings, without depending on ckpt's internals
(only on the file system calls any implementation has to make)::

    python tests/support/shim.py '{"on_write": "_METADATA", "nth": 1, "signal": "STOP"}' -- reshard S D ...

Spec fields (all optional):

- ``on_write`` NAME, ``nth`` N, ``signal`` STOP|KILL|INT: send that signal to this process at the
  N-th file write (``open`` for writing, ``os.open`` with write flags, ``os.replace`` /
  ``os.rename`` / ``os.mkdir`` targets) whose base name is NAME or starts with ``NAME.`` or
  ``.NAME.``; NAME ``*`` counts every write. STOP pauses it until the test sends SIGCONT.
- ``count_to`` FILE: at exit, write the number of writes that matched ``on_write`` to FILE.
- ``vanish`` {"path": P, "to": Q, "when": W}: the first time W (default: P) is listed
  (``os.scandir``/``os.listdir``), rename P to Q just before: an entry that disappears between
  a listing of its parent and its own (a trainer renaming its save meanwhile), or appears.
- ``watch`` DIR, ``watch_log`` FILE: append to FILE every path below DIR that this process
  lists, stats or opens from Python (``os.scandir``/``listdir``/``stat``/``lstat``, ``open``,
  ``os.open``): proof that a reader did, or did not, leave the checkpoint.
- ``mem_limit`` BYTES: RLIMIT_AS for this process.
"""

from __future__ import annotations

import atexit
import builtins
import json
import os
import signal
import sys
from typing import Any

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def main() -> None:
    sep = sys.argv.index("--")
    spec: dict[str, Any] = json.loads(sys.argv[1])
    args = sys.argv[sep + 1 :]
    if spec.get("mem_limit"):
        import resource

        limit = int(spec["mem_limit"])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if spec.get("on_write"):
        _hook_writes(spec)
    if spec.get("watch"):
        _hook_watch(spec["watch"], spec["watch_log"])
    if spec.get("vanish"):
        v = spec["vanish"]
        _hook_vanish(v["path"], v["to"], v.get("when", v["path"]))
    from ckpt_cli.app import main as ckpt_main

    sys.argv = ["ckpt", *args]
    ckpt_main()


def _hook_writes(spec: dict[str, Any]) -> None:
    name = spec["on_write"]
    nth = int(spec.get("nth", 1))
    sig = getattr(signal, "SIG" + spec.get("signal", "STOP"))
    seen = [0]
    if spec.get("count_to"):
        atexit.register(lambda: _write_count(spec["count_to"], seen[0]))

    def matches(path: Any) -> bool:
        try:
            base = os.path.basename(os.fsdecode(path))
        except TypeError:
            return False  # a file descriptor
        return name == "*" or base == name or base.startswith((name + ".", "." + name + "."))

    def event(path: Any) -> None:
        if not matches(path):
            return
        seen[0] += 1
        if seen[0] == nth:
            os.kill(os.getpid(), sig)

    real_open, real_os_open = builtins.open, os.open
    real_replace, real_rename, real_mkdir = os.replace, os.rename, os.mkdir

    def open_(file: Any, mode: str = "r", *a: Any, **k: Any) -> Any:
        if any(c in mode for c in "wax+"):
            event(file)
        return real_open(file, mode, *a, **k)

    def os_open(path: Any, flags: int, *a: Any, **k: Any) -> int:
        if flags & _WRITE_FLAGS:
            event(path)
        return real_os_open(path, flags, *a, **k)

    def replace(src: Any, dst: Any, *a: Any, **k: Any) -> None:
        event(dst)
        real_replace(src, dst, *a, **k)

    def rename(src: Any, dst: Any, *a: Any, **k: Any) -> None:
        event(dst)
        real_rename(src, dst, *a, **k)

    def mkdir(path: Any, *a: Any, **k: Any) -> None:
        event(path)
        real_mkdir(path, *a, **k)

    builtins.open = open_
    os.open = os_open
    os.replace = replace
    os.rename = rename
    os.mkdir = mkdir


def _write_count(path: str, n: int) -> None:
    with open(path, "w") as f:
        f.write(str(n))


def _hook_vanish(path: str, to: str, when: str) -> None:
    real_scandir, real_listdir = os.scandir, os.listdir
    done = [False]

    def before(p: Any) -> None:
        if done[0] or p is None or isinstance(p, int):
            return
        if os.path.abspath(os.fsdecode(p)) == os.path.abspath(when):
            done[0] = True
            os.rename(path, to)

    def scandir(p: Any = ".") -> Any:
        before(p)
        return real_scandir(p)

    def listdir(p: Any = ".") -> Any:
        before(p)
        return real_listdir(p)

    os.scandir = scandir  # type: ignore[assignment]
    os.listdir = listdir


def _hook_watch(directory: str, log: str) -> None:
    watched = os.path.realpath(directory)
    real_log_open = builtins.open

    busy = [False]

    def note(p: Any, follow: bool = True) -> None:
        if busy[0] or p is None or isinstance(p, int):
            return
        busy[0] = True  # realpath itself calls os.lstat
        try:
            raw = os.fsdecode(p)
            if follow:
                full = os.path.realpath(raw)
            else:  # lstat looks at the link itself, not where it leads
                full = os.path.join(os.path.realpath(os.path.dirname(raw)), os.path.basename(raw))
            if full == watched or full.startswith(watched + os.sep):
                with real_log_open(log, "a") as f:
                    f.write(full + "\n")
        except (TypeError, ValueError):
            pass
        finally:
            busy[0] = False

    def wrap(fn: Any, follow: bool = True) -> Any:
        def inner(p: Any = ".", *a: Any, **k: Any) -> Any:
            note(p, follow and k.get("follow_symlinks", True))
            return fn(p, *a, **k)

        return inner

    os.scandir = wrap(os.scandir)
    os.listdir = wrap(os.listdir)
    os.stat = wrap(os.stat)
    os.lstat = wrap(os.lstat, follow=False)
    os.open = wrap(os.open)
    builtins.open = wrap(builtins.open)


if __name__ == "__main__":
    main()
