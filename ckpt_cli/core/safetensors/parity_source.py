"""The two sides of a weight-parity ``diff``: tensors by name, each with a dtype and a shape, and
any block of them read without holding the rest.

A side is either safetensors (``SafetensorsSide``: a ``.safetensors`` file, a
``*.safetensors.index.json``, or a Hugging Face folder of shards and index; positioned reads,
one descriptor per file, a few reads in flight on a small thread pool; a box of many short runs,
a column band of a transposed kernel, copied from a few MiB of the file's mapping at a time:
``SafetensorsReader.read_box``) or one Orbax item
(``OrbaxSide``: its leaves through a migrate spec, as ``ckpt export`` maps them, computed
block by block through TensorStore). ``is_safetensors`` says which a path names.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.format.discovery import ItemRef
from ckpt_cli.core.safetensors.plan import INDEX_SUFFIX
from ckpt_cli.core.safetensors.reader import SafetensorsReader, check_against_index, find_files
from ckpt_cli.core.spec import ops
from ckpt_cli.core.spec.language import MigrationSpec
from ckpt_cli.errors import RefusedError, UnsupportedError

#: Reads of a safetensors side in flight at once (positioned reads release the GIL).
READ_THREADS = 4


def block_budget(memory_limit: int) -> tuple[int, int]:
    """Bytes of one block, and of the blocks in flight on each side: a comparison holds a few
    float64 copies of what it compares, so a block is 8 MiB at most."""
    block = max(1 << 20, min(8 << 20, memory_limit // 64))
    return block, max(block, min(16 << 20, memory_limit // 32))


@dataclass(frozen=True)
class Tensor:
    """One tensor of a side: its name, dtype (numpy/ml_dtypes name), shape, and the chunk
    shape its blocks line up with (None: any block is one read)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...] | None = None


def is_safetensors(target: str) -> bool:
    """Whether ``target`` names safetensors, as the read commands decide it
    (``source.is_safetensors_source``: a folder that is also an Orbax root, step or item stays a
    checkpoint); a bucket path named like safetensors is one, refused when opened."""
    from ckpt_cli.core.safetensors.source import is_safetensors_source

    path = target.removeprefix("file://")
    if "://" in path:
        return path.rstrip("/").endswith((".safetensors", INDEX_SUFFIX))
    return is_safetensors_source(target)


class SafetensorsSide:
    """Every tensor of a file, an index or a Hugging Face folder, checked as ``import`` checks
    them (header against the file's size, the index against its shards)."""

    format = "safetensors"

    def __init__(self, target: str) -> None:
        path = target.removeprefix("file://")
        if "://" in path:
            raise UnsupportedError(
                f"{target}: diff reads local safetensors files only",
                hint="copy the files to local disk first (e.g. `aws s3 cp --recursive`, `gcloud storage cp -r`)",
            )
        files = find_files(path)
        if os.path.isfile(path):
            self.label = os.path.basename(path)
        elif files.index is None:
            self.label = files.files[0]
        else:
            self.label = f"index of {len(files.files)} files"
        self.readers: dict[str, SafetensorsReader] = {}
        try:
            for name in files.files:
                self.readers[name] = SafetensorsReader.open(os.path.join(files.directory, name))
            headers = {name: r.header for name, r in self.readers.items()}
            self.where = check_against_index(files, headers)
            self.tensors = {
                e.name: Tensor(e.name, _dtype_name(r, e.name), tuple(e.shape))
                for r in self.readers.values()
                for e in r.header.tensors
            }
        except BaseException:
            self.close()
            raise
        self.path = path
        self.pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="ckpt-diff-st")

    def ref(self) -> ItemRef:
        from ckpt_cli.core.storage import open_location

        return ItemRef(open_location(self.path), self.label, None, None, None)

    def fetch(self, name: str, region: ops.Region) -> Future[Any]:
        return self.pool.submit(self.readers[self.where[name]].read_box, name, region)

    def result(self, name: str, pending: Any) -> Any:
        return pending.result()

    def close(self) -> None:
        if hasattr(self, "pool"):
            self.pool.shutdown(wait=True, cancel_futures=True)
        for r in self.readers.values():
            r.close()
        self.readers.clear()


def _dtype_name(reader: SafetensorsReader, name: str) -> str:
    from ckpt_cli.core.safetensors.dtypes import numpy_dtype_name

    return numpy_dtype_name(reader.tensors[name].dtype, f"{reader.name}: tensor {name!r}")


class OrbaxSide:
    """One Orbax item's array leaves under a migrate spec's names, shapes and dtypes (none: the
    leaves as they are, named as ``ckpt export`` names them); leaves without array data (a
    ``None``, an empty optimizer state) are not tensors."""

    format = "orbax"

    def __init__(self, item: ItemRef, spec: MigrationSpec | None, memory_limit: int) -> None:
        from ckpt_cli.core.inspect.item import inspect_item
        from ckpt_cli.core.migrate.plan import apply_spec
        from ckpt_cli.core.spec.language import unused_rules_hint

        self.item = item
        report = inspect_item(item)
        rules = spec or MigrationSpec(path="", sha256="", rules=())
        leaves, _dropped, unused = apply_spec(report, rules, max_chunk_bytes=1 << 62)
        if unused:
            raise RefusedError(
                f"{', '.join(unused)} matched no leaf of {item.location}",
                hint=unused_rules_hint(item.location),
            )
        self.exprs = {x.name: x.expr for x in leaves if x.expr is not None}
        self.tensors = {
            name: Tensor(name, e.dtype, tuple(e.shape), ops.source_chunks(e))
            for name, e in self.exprs.items()
        }
        self.whole = {
            name: frozenset(id(n) for n in e.walk() if n.whole) for name, e in self.exprs.items()
        }
        self.ctx = ops.EvalContext(self._store(report, memory_limit), {})

    def _store(self, report: Any, memory_limit: int) -> Any:
        """The item's arrays, with a chunk cache for the tensors read in blocks that cut their
        source's chunks (a split, a concat, a chunk larger than a block): two of the largest
        such chunks, so each is decoded once."""
        from ckpt_cli.core.format.arrays import ItemStore, cached_context
        from ckpt_cli.core.format.blocks import decoded_chunk_bytes
        from ckpt_cli.core.format.scan import OPEN_CACHE_BYTES

        block, _ = block_budget(memory_limit)
        cut = [
            decoded_chunk_bytes(n.info)
            for e in self.exprs.values()
            for n in e.walk()
            if isinstance(n, ops.Source)
            and (ops.source_chunks(e) is None or decoded_chunk_bytes(n.info) > block)
        ]
        context = cached_context(OPEN_CACHE_BYTES + 2 * max(cut, default=0))
        return ItemStore(report.ref.location, report.zarr_format == 3, context)

    def ref(self) -> ItemRef:
        return self.item

    def fetch(self, name: str, region: ops.Region) -> Any:
        self.ctx.begin(self.whole[name])
        e = self.exprs[name]
        if isinstance(e, ops.Transpose):
            # A comparison reads a transposed view as well as a copy: no contiguous copy of
            # every block (export's writer needs one; most of a transposing diff's CPU).
            inner = [slice(0, 0)] * len(e.axes)
            for i, axis in enumerate(e.axes):
                inner[axis] = region[i]
            return e.axes, e.inner.fetch(tuple(inner), self.ctx)
        return None, e.fetch(region, self.ctx)

    def result(self, name: str, pending: Any) -> Any:
        import numpy as np

        from ckpt_cli.core.safetensors.dtypes import numpy_dtype

        axes, fetched = pending
        values = ops.resolve(fetched)
        if axes is not None:
            values = np.transpose(values, axes)
        want = numpy_dtype(self.tensors[name].dtype)
        return values if values.dtype == want else values.astype(want)

    def close(self) -> None:
        self.ctx.readers.clear()
        self.ctx.held.clear()


Side = SafetensorsSide | OrbaxSide
