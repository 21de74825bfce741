"""Asking the kernel to write back what a writer has written, as it goes, without waiting.

A writer's files are synced once, when they are whole (``Location.sync_tree`` before a step's
commit marker, ``fsync`` before an export's rename). Until then they sit in the page cache, and
the kernel writes back only what is past its dirty limits: a sync at the end would wait for all
the rest at once, with every core idle. ``start_writeback`` starts a range's write-back and
returns (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; elsewhere nothing: the final sync
does it all). ``Writeback`` does that for the files TensorStore finishes under a directory.
Durability comes from the final sync either way; these are hints, and their errors are ignored.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any

_SYNC_FILE_RANGE_WRITE = 2
_libc_fns: dict[str, Any] = {}

#: Bytes written between two passes over the directory (``Writeback``), at the least.
EVERY = 64 << 20
#: And at the least this much per file the directory held at the last pass: a pass lists the
#: whole tree, so passes thin out as it grows (a pass every 1 GiB at 16,384 files).
EVERY_PER_FILE = 64 << 10
#: TensorStore's file kvstore writes a file under this suffix, then renames it.
TS_PARTIAL_SUFFIX = ".__lock"


def libc_function(name: str, argtypes: list[Any]) -> Any:
    """The C library's function ``name`` (Linux only; ``None`` elsewhere or where it lacks it),
    looked up once."""
    if name not in _libc_fns:
        _libc_fns[name] = None
        if sys.platform.startswith("linux"):
            import ctypes
            import ctypes.util

            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                fn = getattr(libc, name)
                fn.argtypes = argtypes
                fn.restype = ctypes.c_int
                _libc_fns[name] = fn
            except (OSError, AttributeError):
                pass
    return _libc_fns[name]


def start_writeback(fd: int, start: int, end: int) -> None:
    """Ask the kernel to start writing ``[start, end)`` of ``fd`` back, without waiting; a
    hint: errors ignored."""
    import ctypes

    fn = libc_function(
        "sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    )
    if fn is not None and end > start:
        fn(fd, start, end - start, _SYNC_FILE_RANGE_WRITE)


class Writeback:
    """Starts the write-back of every file finished under ``root`` as a writer goes: fed the
    bytes written (``wrote``), it lists the tree on a thread of its own every ``EVERY`` bytes
    (more as the tree grows) and hints each file it has not hinted yet, once. Files still being
    written (TensorStore's ``*.__lock``) wait for a later pass; the writer never waits for one.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        #: Inodes hinted: a file replaced under its name is a new one. (A number the file
        #: system reuses after a delete is missed: the final sync has it.)
        self.hinted: set[int] = set()
        self.passes = 0
        self._pending = 0
        self._files = 0
        self._thread: threading.Thread | None = None

    def wrote(self, nbytes: int) -> None:
        self._pending += nbytes
        if self._pending < max(EVERY, self._files * EVERY_PER_FILE):
            return
        if self._thread is not None and self._thread.is_alive():
            return  # the last pass still runs: the next write starts the next one
        self._pending = 0
        self._thread = threading.Thread(target=self._pass, name="ckpt-writeback", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Wait for a pass that runs (a listing and hints: short)."""
        if self._thread is not None:
            self._thread.join()

    def _pass(self) -> None:
        self.passes += 1
        # A hint: nothing of it may reach the user (a thread's error prints a traceback).
        with contextlib.suppress(OSError):
            self._files = self._hint_new()

    def _hint_new(self) -> int:
        """Hint every finished file not hinted yet; returns how many files the tree holds."""
        files = 0
        dirs = [self.root]
        while dirs:
            try:
                with os.scandir(dirs.pop()) as entries:
                    listed = list(entries)
            except OSError:
                continue  # removed meanwhile (an aborted write)
            for entry in listed:
                if entry.is_dir(follow_symlinks=False):
                    dirs.append(entry.path)
                    continue
                files += 1
                inode = entry.inode()  # no stat: the listing has it
                if entry.name.endswith(TS_PARTIAL_SUFFIX) or inode in self.hinted:
                    continue
                self.hinted.add(inode)
                _hint(entry.path)
        return files


def _hint(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # renamed or removed meanwhile: the final sync has what is left
    try:
        start_writeback(fd, 0, os.fstat(fd).st_size)
    except OSError:
        pass
    finally:
        os.close(fd)


def writeback_for(location: Any) -> Writeback | None:
    """A ``Writeback`` for a local directory; ``None`` for an object store (nothing cached)."""
    from ckpt_cli.core.storage.local import LocalLocation

    return Writeback(location.path) if isinstance(location, LocalLocation) else None
