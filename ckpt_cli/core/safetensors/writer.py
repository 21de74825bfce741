"""Stream one safetensors file: the header first from the plan, then blocks at their offsets.

The file is written under a temporary name in its final directory, sized up front, filled by
positioned writes in any order, and renamed to its final name only once every byte of every
tensor was written (tracked per tensor as element ranges). Anything else leaves no file under
the final name: an exception inside the ``with`` block, or a missing block at ``commit``.

Blocks that arrive in file order (as ``export`` writes them) go to the disk without the page
cache (``O_DIRECT``, where the file system takes it): copied into one reused, page-aligned
staging buffer and written from it in whole pages. Copying a GiB into the page cache cost more
system time than everything else an export does (fresh cache pages to allocate and fill; see
docs/explanation/performance.md), and the cache only held pages the export never reads again.
The first block out of order, or a file system that refuses ``O_DIRECT``, switches the file to
positioned writes through the page cache for the rest. Either way one ``fsync`` before the
rename makes the file durable.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import os
import secrets
import sys
import threading
from types import TracebackType
from typing import Any

from ckpt_cli.core.safetensors.blocks import check_contiguous, flat_offset
from ckpt_cli.core.safetensors.dtypes import itemsize, numpy_dtype, numpy_dtype_name
from ckpt_cli.core.safetensors.header import TensorEntry
from ckpt_cli.core.safetensors.plan import ShardFile
from ckpt_cli.core.storage.writeback import libc_function, start_writeback
from ckpt_cli.errors import StorageError

TMP_MARK = ".ckpt-tmp-"
#: Bytes written between two requests to start writing back (``sync_file_range``, which does not
#: wait): the kernel writes back as the export goes, so dirty pages stay bounded and the final
#: ``fsync`` before the rename is short, without the writer ever blocking on the disk midway.
SYNC_EVERY = 64 << 20
#: The staging buffer of direct writes: written out whenever full (a multiple of ``PAGE``).
STAGE_BYTES = 8 << 20
#: Alignment of direct writes (offsets, lengths, buffer addresses): the file systems' block.
PAGE = 4096


class SafetensorsWriter:
    """Write ``shard`` to ``path``. Use as a context manager and call ``commit()`` at the end."""

    def __init__(self, path: str, shard: ShardFile) -> None:
        self.path = path
        self.shard = shard
        self.tmp_path = f"{path}{TMP_MARK}{secrets.token_hex(4)}"
        self._entries = shard.header.by_name()
        self._written: dict[str, list[tuple[int, int]]] = {n: [] for n in self._entries}
        #: Guards the bookkeeping (and the direct stream) when several threads write blocks.
        self._lock = threading.Lock()
        self._fd: int | None = None
        self.bytes_written = 0
        self._unsynced = 0
        self._synced_to = 0  # file offset below which writeback was requested
        self._direct: _DirectStream | None = None
        #: Bytes that went to the file through the direct stream (the rest: the page cache).
        self.direct_bytes = 0

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
            self._direct = _DirectStream.open(self.tmp_path, self.shard.encoded_header)
            if self._direct is None:
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
        data = np.ascontiguousarray(block)
        if data.dtype.byteorder == ">":
            data = data.astype(data.dtype.newbyteorder("<"))
        raw = data.reshape(-1).view(np.uint8)
        offset = self.shard.header.data_start + entry.begin + first * itemsize(entry.dtype)
        try:
            with self._lock:
                fd = self._fd
                if fd is None:
                    raise ValueError(f"{self.path}: the writer is not open")
                self._claim(name, first, first + count)
                done = 0
                if self._direct is not None:
                    try:
                        if self._direct.append(raw.data, offset):
                            self.bytes_written += raw.nbytes
                            return
                    except _Refused as e:
                        done = e.done
                    self._leave_direct()
            # Outside the lock: the jobs of a shared file write their blocks at once.
            _pwrite_all(fd, raw.data[done:], offset + done)
            with self._lock:
                self.bytes_written += raw.nbytes
                self._unsynced += raw.nbytes
                if self._unsynced < SYNC_EVERY:
                    return
                end = offset + raw.nbytes
                begin, self._synced_to, self._unsynced = min(self._synced_to, offset), end, 0
            start_writeback(fd, begin, end)
        except OSError as e:
            raise StorageError.from_error(f"cannot write {self.tmp_path}", e) from None

    def share(self) -> None:
        """Blocks will come from several threads in any order from now on: the direct stream
        (blocks in file order only) hands over to positioned writes through the page cache."""
        with self._lock:
            if self._direct is not None:
                try:
                    self._leave_direct()
                except OSError as e:
                    raise StorageError.from_error(f"cannot write {self.tmp_path}", e) from None

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
            if self._direct is not None:
                try:
                    self.direct_bytes = self._direct.finish()
                    self._direct = None
                    os.ftruncate(self._fd, self.shard.size)  # the last page was written whole
                except _Refused:
                    self._leave_direct()
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
            os.replace(self.tmp_path, self.path)
        except OSError as e:
            self.abort()
            raise StorageError.from_error(f"cannot write {self.path}", e) from None

    def _leave_direct(self) -> None:
        """A block out of file order: what is staged goes through the page cache, and so does
        everything after it."""
        assert self._direct is not None and self._fd is not None
        direct, self._direct = self._direct, None
        pos, staged = direct.close()
        self.direct_bytes = pos
        _pwrite_all(self._fd, staged, pos)

    def abort(self) -> None:
        if self._direct is not None:
            self._direct.close()
            self._direct = None
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


#: ``f_type`` of tmpfs (``TMPFS_MAGIC``): reserving its blocks allocates and zeroes memory.
_TMPFS_MAGIC = 0x01021994


class _Refused(Exception):
    """The file system refused a direct write; ``done`` bytes of the block were staged."""

    def __init__(self, done: int) -> None:
        self.done = done


class _DirectStream:
    """The file's bytes in order from offset 0, written in whole pages with ``O_DIRECT`` from
    one staging buffer of ``STAGE_BYTES`` (allocated once per file, page-aligned)."""

    def __init__(self, fd: int, header: bytes) -> None:
        import mmap

        self.fd = fd
        self.stage = mmap.mmap(-1, STAGE_BYTES)
        self.view = memoryview(self.stage)
        self.pos = 0  # file offset of stage[0]: a multiple of PAGE
        self.fill = 0
        self.stage_writes = 0
        self._copy(memoryview(header))

    @classmethod
    def open(cls, path: str, header: bytes) -> _DirectStream | None:
        """A second descriptor on ``path`` for direct writes; None where there is no
        ``O_DIRECT`` or the file system refuses it (tmpfs and others)."""
        flag = getattr(os, "O_DIRECT", 0)
        if not flag or os.environ.get("CKPT_NO_DIRECT_IO"):
            return None
        try:
            fd = os.open(path, os.O_WRONLY | flag)
        except OSError:
            return None
        return cls(fd, header)

    @property
    def end(self) -> int:
        return self.pos + self.fill

    def append(self, data: memoryview, offset: int) -> bool:
        """Stage ``data`` (bytes) when it starts where the file so far ends, writing the stage
        out whenever full; False when it starts elsewhere (nothing staged). ``_Refused`` when
        the file system refuses a direct write (``done``: the bytes of ``data`` staged)."""
        if offset != self.end:
            return False
        done = 0
        while done < len(data):
            done += self._copy(data[done:])
            if self.fill == STAGE_BYTES:
                self._flush(STAGE_BYTES, done)
        return True

    def _copy(self, data: memoryview) -> int:
        n = min(len(data), STAGE_BYTES - self.fill)
        self.view[self.fill : self.fill + n] = data[:n]
        self.fill += n
        return n

    def _flush(self, nbytes: int, done: int = 0) -> None:
        """Write ``stage[:nbytes]`` (whole pages) at ``pos``; keep what follows."""
        try:
            _pwrite_all(self.fd, self.view[:nbytes], self.pos)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            raise _Refused(done) from None  # no direct writes of this alignment here
        self.stage_writes += 1
        rest = max(0, self.fill - nbytes)
        if rest:
            self.view[:rest] = self.view[nbytes : self.fill]
        self.pos += nbytes
        self.fill = rest

    def finish(self) -> int:
        """Write what is staged (its last page whole: the caller truncates the file to its
        size) and close; the file's length so far. ``_Refused`` as ``append``."""
        end = self.end
        if self.fill:
            self._flush(-(-self.fill // PAGE) * PAGE)
        self.close()
        return end

    def close(self) -> tuple[int, memoryview]:
        """Close the descriptor; the file offset and bytes still staged (valid until the
        stream is collected)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        return self.pos, self.view[: self.fill]


def _reserve(fd: int, size: int) -> None:
    """Give the file its final size, and reserve its blocks where the file system does that
    without writing them (``fallocate``), so a full disk fails now rather than halfway.

    Not on tmpfs, where reserving means allocating and zeroing the file's memory before the
    blocks overwrite it (on a gVisor host 2.0-2.5 s for 3 GiB, on the main thread); a full tmpfs
    still fails at its write, and the temporary file goes. Not through glibc's
    ``posix_fallocate`` either: on a file system without ``fallocate`` (NFSv3, many FUSE
    mounts) it writes a byte into every block of the file instead."""
    if size and not _is_tmpfs(fd) and _fallocate(fd, size):
        return
    os.ftruncate(fd, size)


def _fallocate(fd: int, size: int) -> bool:
    """Reserve ``[0, size)`` of ``fd`` with Linux ``fallocate``; False where the file system
    (or the platform) has no such call. Other errors (a full disk) are raised."""
    import ctypes

    fn = libc_function("fallocate", [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64])
    if fn is None:
        return False
    while fn(fd, 0, 0, size) != 0:
        err = ctypes.get_errno()
        if err == errno.EINTR:
            continue
        if err in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return False
        raise OSError(err, os.strerror(err))
    return True


def _is_tmpfs(fd: int) -> bool:
    """Whether ``fd`` lies on tmpfs (``fstatfs``'s ``f_type``; 64-bit Linux only)."""
    import ctypes

    fn = libc_function("fstatfs", [ctypes.c_int, ctypes.c_void_p])
    if fn is None or ctypes.sizeof(ctypes.c_long) != 8:
        return False
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes; f_type comes first
    if fn(fd, buf) != 0:
        return False
    return int.from_bytes(buf.raw[:8], sys.byteorder) == _TMPFS_MAGIC


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n
