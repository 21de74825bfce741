"""Read safetensors files block by block with positioned reads, never a whole file at once.

``SafetensorsReader`` validates the header against the file's real size when it opens, then
reads any C-contiguous block of a tensor into a fresh buffer of exactly its size (``os.preadv``
into a numpy array: no lasting mmap, so pages already read do not stay in the process's memory).
Any other box (``read_box``) is one positioned read per C-contiguous run, or, when the runs are
short (a column band of a transposed kernel: thousands of runs of a few KiB), copied out of a
mapping of a few MiB of the file at a time, each unmapped before the next (``LocalFile.gather``:
one copy in numpy instead of a system call and a Python step per run). The byte source is a
small protocol, so a ranged reader of an object store can stand in for a file.
``open_source`` finds the files of a Hugging Face directory through its index.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ckpt_cli.core.safetensors.blocks import Block, check_contiguous, contiguous_blocks, flat_offset
from ckpt_cli.core.safetensors.dtypes import itemsize, numpy_dtype, numpy_dtype_name
from ckpt_cli.core.safetensors.header import (
    LENGTH_BYTES,
    Header,
    header_length,
    parse_header,
)
from ckpt_cli.core.safetensors.plan import INDEX_SUFFIX, ShardIndex, parse_index
from ckpt_cli.errors import InvalidSafetensorsError, NotFoundError, StorageError, UnsupportedError

#: A box whose runs are shorter than this is gathered from mappings of a local file.
GATHER_RUN_BYTES = 64 << 10
#: Bytes of the file mapped at once while gathering (what a gather adds to the RSS, beside the
#: box it fills); rows of the first axis larger than this are read run by run.
GATHER_WINDOW_BYTES = 4 << 20


class ByteSource(Protocol):
    """Positioned reads of a fixed-size object."""

    name: str

    @property
    def size(self) -> int: ...
    def read_into(self, offset: int, buf: memoryview) -> int: ...
    def close(self) -> None: ...


class LocalFile:
    """A local file read with ``os.preadv``."""

    def __init__(self, path: str) -> None:
        self.name = path
        try:
            self._fd = os.open(path, os.O_RDONLY)
            self._size = os.fstat(self._fd).st_size
        except FileNotFoundError:
            raise NotFoundError(f"{path} does not exist") from None
        except OSError as e:
            raise StorageError(f"cannot read {path}: {e.strerror or e}") from None

    @property
    def size(self) -> int:
        return self._size

    def read_into(self, offset: int, buf: memoryview) -> int:
        done = 0
        while done < len(buf):
            n = os.preadv(self._fd, [buf[done:]], offset + done)
            if n == 0:
                break
            done += n
        return done

    def gather(
        self, offset: int, shape: tuple[int, ...], region: tuple[slice, ...], out: Any
    ) -> int:
        """Copy box ``region`` of the C-order array ``out.dtype[shape]`` stored at ``offset`` into
        ``out``, from mappings of about ``GATHER_WINDOW_BYTES`` of the file (rows of the first
        axis), each unmapped before the next. Returns the bytes past the end of the file that
        the box needs (0: copied; else nothing is mapped there: the file shrank)."""
        import mmap

        import numpy as np

        width = int(out.dtype.itemsize)
        row = math.prod(shape[1:]) * width
        step = max(1, GATHER_WINDOW_BYTES // max(1, row))
        first, stop = int(region[0].start), int(region[0].stop)
        for i in range(first, stop, step):
            k = min(stop, i + step)
            start, length = offset + i * row, (k - i) * row
            missing = start + length - os.fstat(self._fd).st_size
            if missing > 0:  # a mapping past the end would kill the process (SIGBUS)
                return missing
            aligned = start - start % mmap.ALLOCATIONGRANULARITY
            window = mmap.mmap(
                self._fd, start + length - aligned, offset=aligned, access=mmap.ACCESS_READ
            )
            try:
                rows: Any = np.frombuffer(
                    window, out.dtype, (k - i) * row // width, start - aligned
                )
                box: Any = None
                try:
                    box = rows.reshape((k - i, *shape[1:]))[(slice(None), *region[1:])]
                    out[i - first : k - first] = box
                finally:
                    # The mapping closes only once no array points into it (an interrupt
                    # mid-copy included: a BufferError would hide it).
                    box = rows = None
            finally:
                window.close()
        return 0

    def close(self) -> None:
        os.close(self._fd)


class SafetensorsReader:
    """One safetensors file: its validated header and block reads of its tensors."""

    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self.name = source.name
        size = source.size
        prefix = bytearray(min(size, LENGTH_BYTES))
        self._read_exact(0, memoryview(prefix))
        n = header_length(bytes(prefix), size, self.name)
        raw = bytearray(n)
        self._read_exact(LENGTH_BYTES, memoryview(raw))
        self.header: Header = parse_header(bytes(raw), size, self.name)
        self.tensors = self.header.by_name()

    @classmethod
    def open(cls, path: str) -> SafetensorsReader:
        source = LocalFile(path)
        try:
            return cls(source)
        except BaseException:
            source.close()
            raise

    def __enter__(self) -> SafetensorsReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.source.close()

    def numpy_dtype(self, name: str) -> Any:
        return numpy_dtype(numpy_dtype_name(self.tensors[name].dtype, f"tensor {name!r}"))

    def read_block(self, name: str, start: tuple[int, ...], shape: tuple[int, ...]) -> Any:
        """The C-contiguous block of tensor ``name`` at ``start`` with ``shape``."""
        import numpy as np

        entry = self.tensors[name]
        dtype = self.numpy_dtype(name)
        check_contiguous(entry.shape, start, shape)
        count = int(np.prod(shape, dtype=np.int64))
        out = np.empty(count, dtype=np.uint8 if dtype == np.bool_ else dtype)
        if count:
            first = flat_offset(entry.shape, start) if entry.shape else 0
            offset = self.header.data_start + entry.begin + first * itemsize(entry.dtype)
            self._read_exact(offset, out.view(np.uint8).data)
        if dtype == np.bool_:
            if out.max(initial=0) > 1:
                raise InvalidSafetensorsError(
                    f"{self.name}: tensor {name!r} is BOOL but holds bytes other than 0 and 1"
                )
            out = out.view(np.bool_)
        return out.reshape(shape)

    def read_box(self, name: str, region: tuple[slice, ...]) -> Any:
        """Any box of tensor ``name`` (``region``: one slice per axis, steps of 1): one
        positioned read per C-contiguous run of the box, nothing outside it."""
        import numpy as np

        entry = self.tensors[name]
        shape = entry.shape
        bounds = [
            (s.start or 0, shape[i] if s.stop is None else s.stop) for i, s in enumerate(region)
        ]
        if len(bounds) != len(shape) or any(
            not 0 <= a <= b <= n for (a, b), n in zip(bounds, shape, strict=True)
        ):
            raise ValueError(f"region {region} is outside {list(shape)} of tensor {name!r}")
        box = tuple(b - a for a, b in bounds)
        j = len(shape) - 1
        while j > 0 and bounds[j] == (0, shape[j]):
            j -= 1
        if not shape or all(bounds[i][1] - bounds[i][0] == 1 for i in range(j)):
            start = tuple(a for a, _ in bounds)
            return self.read_block(name, start, box)  # already one run
        dtype = self.numpy_dtype(name)
        out = np.empty(box, dtype=dtype)
        if out.size == 0:
            return out
        step = itemsize(entry.dtype)
        base = self.header.data_start + entry.begin
        if not self._gathered(base, shape, bounds, out, math.prod(box[j:]) * step):
            runs = out.reshape(-1, math.prod(box[j:])).view(np.uint8)
            for i, prefix in enumerate(itertools.product(*(range(a, b) for a, b in bounds[:j]))):
                first = flat_offset(shape, (*prefix, *(a for a, _ in bounds[j:])))
                self._read_exact(base + first * step, runs[i].data)
        if dtype == np.bool_ and out.view(np.uint8).max(initial=0) > 1:
            raise InvalidSafetensorsError(
                f"{self.name}: tensor {name!r} is BOOL but holds bytes other than 0 and 1"
            )
        return out

    def _gathered(
        self, base: int, shape: tuple[int, ...], bounds: list[tuple[int, int]], out: Any, run: int
    ) -> bool:
        """Whether the box was copied from mappings of the file (short runs of a local file
        whose rows fit a window); False: read it run by run."""
        row = math.prod(shape[1:]) * out.dtype.itemsize
        if not isinstance(self.source, LocalFile) or run >= GATHER_RUN_BYTES:
            return False
        if row > GATHER_WINDOW_BYTES or out.size * out.dtype.itemsize <= run:
            return False
        region = tuple(slice(a, b) for a, b in bounds)
        try:
            missing = self.source.gather(base, shape, region, out)
        except OSError as e:
            raise StorageError(f"cannot read {self.name}: {e.strerror or e}") from None
        if missing:
            raise InvalidSafetensorsError(
                f"{self.name}: the file ended {missing:,} bytes before the box read of it ends (it changed while being read?)"
            )
        return True

    def read_rows(self, name: str, start: int, stop: int) -> Any:
        entry = self.tensors[name]
        if not entry.shape:
            return self.read_block(name, (), ())
        return self.read_block(
            name, (start, *(0,) * (len(entry.shape) - 1)), (stop - start, *entry.shape[1:])
        )

    def read_tensor(self, name: str) -> Any:
        entry = self.tensors[name]
        return self.read_block(name, (0,) * len(entry.shape), entry.shape)

    def blocks(self, name: str, max_bytes: int) -> Iterator[tuple[Block, Any]]:
        """``((start, shape), array)`` for every block of at most ``max_bytes``, in file order."""
        entry = self.tensors[name]
        for start, shape in contiguous_blocks(entry.shape, itemsize(entry.dtype), max_bytes):
            yield (start, shape), self.read_block(name, start, shape)

    def _read_exact(self, offset: int, buf: memoryview) -> None:
        try:
            n = self.source.read_into(offset, buf)
        except OSError as e:
            raise StorageError(f"cannot read {self.name}: {e.strerror or e}") from None
        if n != len(buf):
            raise InvalidSafetensorsError(
                f"{self.name}: the file ended at byte {offset + n:,} while reading {len(buf):,} bytes at {offset:,} (it changed while being read?)"
            )


@dataclass(frozen=True)
class SourceFiles:
    """What an import reads: the files (in index order) and which file holds each tensor."""

    directory: str
    files: tuple[str, ...]
    index: ShardIndex | None


def find_files(path: str) -> SourceFiles:
    """A ``.safetensors`` file, an index file, or a directory holding either."""
    if "://" in path and not path.startswith("file://"):
        raise UnsupportedError(
            f"{path}: import reads local safetensors files only",
            hint="copy the files to local disk first (e.g. `aws s3 cp --recursive`, `gcloud storage cp -r`)",
        )
    path = path.removeprefix("file://")
    if os.path.isfile(path):
        if path.endswith(INDEX_SUFFIX):
            return _from_index(path)
        return SourceFiles(os.path.dirname(path) or ".", (os.path.basename(path),), None)
    if not os.path.isdir(path):
        raise NotFoundError(f"{path} does not exist")
    names = sorted(os.listdir(path))
    indexes = [n for n in names if n.endswith(INDEX_SUFFIX)]
    if "model" + INDEX_SUFFIX in indexes:
        indexes = ["model" + INDEX_SUFFIX]
    if len(indexes) == 1:
        return _from_index(os.path.join(path, indexes[0]))
    if len(indexes) > 1:
        raise InvalidSafetensorsError(
            f"{path} holds {len(indexes)} safetensors indexes ({', '.join(indexes[:3])})",
            hint="name the index file to import",
        )
    files = [n for n in names if n.endswith(".safetensors")]
    if "model.safetensors" in files:
        files = ["model.safetensors"]
    if len(files) != 1:
        what = (
            "no .safetensors file" if not files else f"{len(files)} .safetensors files and no index"
        )
        raise InvalidSafetensorsError(
            f"{path} holds {what}", hint="name the .safetensors file or the index to import"
        )
    return SourceFiles(path, (files[0],), None)


def _from_index(index_path: str) -> SourceFiles:
    try:
        with open(index_path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise StorageError(f"cannot read {index_path}: {e.strerror or e}") from None
    index = parse_index(raw, index_path)
    if not index.weight_map:
        raise InvalidSafetensorsError(f"{index_path}: 'weight_map' lists no tensor")
    directory = os.path.dirname(index_path) or "."
    for name in index.files:
        if not os.path.isfile(os.path.join(directory, name)):
            raise InvalidSafetensorsError(
                f"{index_path}: names {name!r}, which is not in {directory}",
                hint="download every shard the index lists",
            )
    return SourceFiles(directory, index.files, index)


def check_against_index(files: SourceFiles, headers: dict[str, Header]) -> dict[str, str]:
    """Tensor -> file over all files; refuses a tensor in two files or an index entry that
    its file does not hold."""
    where: dict[str, str] = {}
    for file in files.files:
        for t in headers[file].tensors:
            if t.name in where:
                raise InvalidSafetensorsError(
                    f"tensor {t.name!r} is in both {where[t.name]} and {file}",
                    hint="the shards do not belong together: download them again",
                )
            where[t.name] = file
    if files.index is not None:
        for tensor, file in files.index.weight_map.items():
            if where.get(tensor) != file:
                found = f"it is in {where[tensor]}" if tensor in where else "no file holds it"
                raise InvalidSafetensorsError(
                    f"the index puts tensor {tensor!r} in {file}, but {found}",
                    hint="the index and its shards do not belong together: download them again",
                )
    return where
