"""Stream one safetensors file: the header first from the plan, then blocks at their offsets.

The file is written under a temporary name in its final directory, sized up front, filled by
positioned writes in any order, and renamed to its final name only once every byte of every
tensor was written (tracked per tensor as element ranges). Anything else leaves no file under
the final name: an exception inside the ``with`` block, or a missing block at ``commit``.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import os
import secrets
import sys
from types import TracebackType
from typing import Any

from ckpt_cli.core.safetensors.blocks import check_contiguous, flat_offset
from ckpt_cli.core.safetensors.dtypes import itemsize, numpy_dtype, numpy_dtype_name
from ckpt_cli.core.safetensors.header import TensorEntry
from ckpt_cli.core.safetensors.plan import ShardFile
from ckpt_cli.errors import StorageError

TMP_MARK = ".ckpt-tmp-"
#: Bytes written between two requests to start writing back (``sync_file_range``, which does not
#: wait): the kernel writes back as the export goes, so dirty pages stay bounded and the final
#: ``fsync`` before the rename is short, without the writer ever blocking on the disk midway.
SYNC_EVERY = 64 << 20


class SafetensorsWriter:
    """Write ``shard`` to ``path``. Use as a context manager and call ``commit()`` at the end."""

    def __init__(self, path: str, shard: ShardFile) -> None:
        self.path = path
        self.shard = shard
        self.tmp_path = f"{path}{TMP_MARK}{secrets.token_hex(4)}"
        self._entries = shard.header.by_name()
        self._written: dict[str, list[tuple[int, int]]] = {n: [] for n in self._entries}
        self._fd: int | None = None
        self.bytes_written = 0
        self._unsynced = 0
        self._synced_to = 0  # file offset below which writeback was requested

    def __enter__(self) -> SafetensorsWriter:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is not None or os.path.exists(self.tmp_path):
            self.abort()

    def open(self) -> None:
        try:
            self._fd = os.open(self.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            _reserve(self._fd, self.shard.size)
            _pwrite_all(self._fd, memoryview(self.shard.encoded_header), 0)
        except OSError as e:
            self.abort()
            raise StorageError.from_error(f"cannot write {self.tmp_path}", e) from None

    def write_block(self, name: str, start: tuple[int, ...], block: Any) -> None:
        """Write ``block`` (a numpy array, C-contiguous within the tensor) at ``start``."""
        import numpy as np

        entry = self._entries[name]
        want = numpy_dtype(numpy_dtype_name(entry.dtype, f"tensor {name!r}"))
        if block.dtype != want:
            raise ValueError(f"tensor {name!r} is {want}, block is {block.dtype}")
        check_contiguous(entry.shape, start, block.shape)
        count = int(np.prod(block.shape, dtype=np.int64))
        if count == 0:
            return
        first = flat_offset(entry.shape, start) if entry.shape else 0
        self._claim(name, first, first + count)
        data = np.ascontiguousarray(block)
        if data.dtype.byteorder == ">":
            data = data.astype(data.dtype.newbyteorder("<"))
        raw = data.reshape(-1).view(np.uint8)
        offset = self.shard.header.data_start + entry.begin + first * itemsize(entry.dtype)
        if self._fd is None:
            raise ValueError(f"{self.path}: the writer is not open")
        try:
            _pwrite_all(self._fd, raw.data, offset)
            self._unsynced += raw.nbytes
            if self._unsynced >= SYNC_EVERY:
                end = offset + raw.nbytes
                start_writeback(self._fd, min(self._synced_to, offset), end)
                self._synced_to = end
                self._unsynced = 0
        except OSError as e:
            raise StorageError.from_error(f"cannot write {self.tmp_path}", e) from None
        self.bytes_written += raw.nbytes

    def write_tensor(self, name: str, array: Any) -> None:
        entry = self._entries[name]
        self.write_block(name, (0,) * len(entry.shape), array.reshape(entry.shape))

    def missing(self) -> list[TensorEntry]:
        """Tensors some of whose elements were not written yet."""
        out = []
        for name, entry in self._entries.items():
            covered = sum(b - a for a, b in self._written[name])
            if covered != entry.size and entry.nbytes:
                out.append(entry)
        return out

    def commit(self) -> None:
        """Check every byte was written, flush to disk, rename to the final name."""
        missing = self.missing()
        if missing:
            names = ", ".join(repr(t.name) for t in missing[:3])
            self.abort()
            raise ValueError(f"{self.path}: {len(missing)} tensor(s) not fully written: {names}")
        assert self._fd is not None
        try:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
            os.replace(self.tmp_path, self.path)
        except OSError as e:
            self.abort()
            raise StorageError.from_error(f"cannot write {self.path}", e) from None

    def abort(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            finally:
                self._fd = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp_path)

    def _claim(self, name: str, a: int, b: int) -> None:
        spans = self._written[name]
        i = bisect.bisect_left(spans, (a, b))
        if (i > 0 and spans[i - 1][1] > a) or (i < len(spans) and spans[i][0] < b):
            raise ValueError(f"tensor {name!r}: elements {a}..{b} were already written")
        # Merge with neighbours so the list stays short for long streams of blocks.
        if i > 0 and spans[i - 1][1] == a:
            a = spans.pop(i - 1)[0]
            i -= 1
        if i < len(spans) and spans[i][0] == b:
            b = spans.pop(i)[1]
        spans.insert(i, (a, b))


_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range: Any = None


def start_writeback(fd: int, start: int, end: int) -> None:
    """Ask the kernel to start writing ``[start, end)`` of ``fd`` back, without waiting
    (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``); elsewhere, nothing: the final ``fsync``
    does it all. Durability comes from that ``fsync`` either way."""
    global _sync_file_range
    if _sync_file_range is None:
        _sync_file_range = False
        if sys.platform.startswith("linux"):
            import ctypes
            import ctypes.util

            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                fn = libc.sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
                _sync_file_range = fn
            except (OSError, AttributeError):
                pass
    if _sync_file_range and end > start:
        _sync_file_range(fd, start, end - start, _SYNC_FILE_RANGE_WRITE)  # a hint: errors ignored


def _reserve(fd: int, size: int) -> None:
    """Give the file its final size; reserve the blocks where the file system can, so a full
    disk fails now rather than halfway."""
    if hasattr(os, "posix_fallocate") and size:
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
    os.ftruncate(fd, size)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n
