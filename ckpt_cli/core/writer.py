"""Write Orbax-restorable items and steps, streaming block by block with bounded memory.

The output is what Orbax 0.12 itself writes for a single-process save, except that the arrays go
straight into one OCDBT database at the item root (no ``ocdbt.process_N/`` to merge): Orbax reads
an item through ``ocdbt`` over the item directory either way. Metadata files (``_METADATA``,
``_sharding``, ``array_metadatas/process_0``, ``_strings.json``) follow FORMAT.md. A step is
written under ``<name>.orbax-checkpoint-tmp``, committed with ``commit_success.txt`` and renamed,
so a reader never sees a half-written step. Where the location has no rename
(``requires_commit_marker``: object stores), the step is written in place and
``commit_success.txt`` is put last, as Orbax does on GCS: until then it is ``uncommitted``.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ckpt_cli.core.arrays import EXTRA_DTYPES, ArrayInfo, ItemStore, dtype_itemsize
from ckpt_cli.core.layout import (
    COMMIT_MARKER,
    STEP_METADATA,
    TMP_MARKER,
    TREE_METADATA,
    WRITING_MARKER,
)
from ckpt_cli.core.metadata import ShardingInfo
from ckpt_cli.core.stats import block_shape, iter_blocks
from ckpt_cli.core.storage import Location
from ckpt_cli.errors import StorageError

STANDARD_HANDLER = (
    "orbax.checkpoint._src.handlers.standard_checkpoint_handler.StandardCheckpointHandler"
)
JSON_HANDLER = "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler"
# Orbax's own OCDBT settings for checkpoints (tensorstore_utils._add_ocdbt_write_options).
OCDBT_CONFIG = {
    "max_inline_value_bytes": 1024,
    "max_decoded_node_bytes": 100000000,
    "manifest_kind": "single",
}

#: A block source: given a region of the destination array, a future of its values.
BlockSource = Callable[[tuple[slice, ...]], Any]
Region = tuple[slice, ...]


class SourcePlan(Protocol):
    """A picklable description of a leaf's values, rebuilt into a ``BlockSource`` by a worker of
    a scaled-out run (``core/scale.py``): data only (the source item's URL, leaf names, the
    operation), never an open handle."""

    @property
    def source(self) -> str:
        """The URL of the item the values are read from."""

    @property
    def source_zarr3(self) -> bool: ...

    @property
    def splittable(self) -> bool:
        """Whether any region can be computed alone (False: the whole leaf is one unit)."""

    def build(self, store: ItemStore) -> BlockSource: ...


@dataclass(frozen=True)
class Compression:
    name: str | None  # "zstd" or None
    level: int | None = None

    @classmethod
    def parse(cls, text: str) -> Compression:
        """``zstd``, ``zstd:5`` or ``none``."""
        from ckpt_cli.errors import UsageError

        name, _, level = text.partition(":")
        if name == "none" and not level:
            return cls(None)
        if name != "zstd":
            raise UsageError(f"--compression {text!r}: use zstd, zstd:LEVEL (1-22) or none")
        if not level:
            return cls("zstd")
        if not level.isdigit() or not 1 <= int(level) <= 22:
            raise UsageError(f"--compression {text!r}: the zstd level must be 1..22")
        return cls("zstd", int(level))


@dataclass(frozen=True)
class ArrayOut:
    """The storage of one output array."""

    dtype: str
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    zarr3: bool
    compression: Compression = field(default_factory=lambda: Compression("zstd"))

    def metadata(self) -> dict[str, Any]:
        """Zarr metadata as Orbax builds it (zstd 1 for zarr2, 3 inside sharding_indexed for zarr3)."""
        if self.zarr3:
            inner: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}]
            if self.compression.name:
                inner.append(
                    {"name": "zstd", "configuration": {"level": self.compression.level or 3}}
                )
            return {
                "zarr_format": 3,
                "data_type": self.dtype,
                "shape": list(self.shape),
                "chunk_grid": {
                    "name": "regular",
                    "configuration": {"chunk_shape": list(self.chunk_shape)},
                },
                "codecs": [
                    {
                        "name": "sharding_indexed",
                        "configuration": {
                            "chunk_shape": list(self.chunk_shape),
                            "codecs": inner,
                            "index_codecs": [
                                {"name": "bytes", "configuration": {"endian": "little"}},
                                {"name": "crc32c"},
                            ],
                            "index_location": "end",
                        },
                    }
                ],
            }
        return {
            "zarr_format": 2,
            "dtype": _zarr2_dtype(self.dtype),
            "shape": list(self.shape),
            "chunks": list(self.chunk_shape),
            "compressor": {"id": "zstd", "level": self.compression.level or 1}
            if self.compression.name
            else None,
        }

    @property
    def info(self) -> ArrayInfo:
        comp = (
            f"{self.compression.name}:{self.compression.level}" if self.compression.name else None
        )
        return ArrayInfo(self.dtype, self.shape, self.chunk_shape, 3 if self.zarr3 else 2, comp)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtype_itemsize(self.dtype)


def _zarr2_dtype(name: str) -> str:
    """numpy names as zarr2 type strings ('<f4', '|b1'); ml_dtypes names stay spelled out."""
    if name in EXTRA_DTYPES:
        return name  # np.dtype('bfloat16').str would be '<V2' once ml_dtypes is loaded
    import numpy as np

    return str(np.dtype(name).str)


@dataclass(frozen=True)
class LeafOut:
    """One leaf of an output item: tree position, value type, storage and where values come from."""

    keypath: tuple[str, ...]
    key_types: tuple[int, ...]
    value_type: str
    array: ArrayOut | None = None
    source: BlockSource | None = None
    sharding: ShardingInfo | None = None
    write_shape: tuple[int, ...] | None = None
    ext_metadata: dict[str, Any] | None = None
    string_value: str | None = None
    #: The source's chunking, when values are copied from stored chunks: blocks then follow
    #: both chunkings so every source chunk is decoded once.
    source_chunks: tuple[int, ...] | None = None
    #: How a worker of a scaled-out run rebuilds ``source`` (None: this process only).
    plan: SourcePlan | None = None

    @property
    def name(self) -> str:
        return ".".join(self.keypath)


def sharding_json(s: ShardingInfo) -> dict[str, Any]:
    """A ``_sharding`` entry for a NamedSharding (device ids in mesh order), as Orbax writes it."""
    if s.mesh_shape is None or s.axis_names is None:
        return {"sharding_type": "SingleDeviceSharding", "device_str": s.device_str or "cpu:0"}
    ids = list(s.device_ids or range(math.prod(s.mesh_shape)))

    def nest(flat: list[int], dims: Sequence[int]) -> Any:
        if len(dims) == 1:
            return [{"id": i} for i in flat]
        step = len(flat) // dims[0]
        return [nest(flat[k * step : (k + 1) * step], dims[1:]) for k in range(dims[0])]

    return {
        "sharding_type": "NamedSharding",
        "shape": list(s.mesh_shape),
        "axis_names": list(s.axis_names),
        "axis_types": ["AxisType.Auto"] * len(s.axis_names),
        "partition_spec": [list(p) if isinstance(p, tuple) else p for p in s.partition_spec or ()],
        "device_mesh": {"mesh": nest(ids, s.mesh_shape)},
    }


def _context(memory_limit: int) -> Any:
    import tensorstore as ts

    return ts.Context(
        {
            "file_io_concurrency": {"limit": 32},
            # Source chunks that straddle destination blocks are decoded once, then served from here.
            "cache_pool": {"total_bytes_limit": 0},
        }
    )


class ItemWriter:
    """Writes one item directory: arrays streamed under a memory budget, then its metadata."""

    def __init__(
        self,
        dest: Location,
        *,
        use_ocdbt: bool,
        use_zarr3: bool,
        memory_limit: int,
        in_flight: int = 8,
        database: str | None = None,
        assume_metadata: bool = False,
        context: Any = None,
    ) -> None:
        self.dest = dest
        #: A sub-database (``ocdbt.process_<id>``) to write chunks into, merged later; its
        #: arrays are opened with the metadata the driver already stored (``assume_metadata``).
        self.database = database
        self.assume_metadata = assume_metadata
        self.use_ocdbt = use_ocdbt
        self.use_zarr3 = use_zarr3
        self.memory_limit = memory_limit
        self.in_flight = in_flight
        self.context = context if context is not None else _context(memory_limit)

    def _kvstore(self, name: str) -> dict[str, Any]:
        base = (self.dest.child(self.database) if self.database else self.dest).kvstore_spec()
        if self.use_ocdbt:
            return {"driver": "ocdbt", "base": base, "config": OCDBT_CONFIG, "path": f"{name}/"}
        return {**base, "path": base["path"] + f"{name}/"}

    def open_array(self, leaf: LeafOut) -> Any:
        import tensorstore as ts

        assert leaf.array is not None
        spec = {
            "driver": "zarr3" if leaf.array.zarr3 else "zarr",
            "kvstore": self._kvstore(leaf.name),
            "metadata": leaf.array.metadata(),
            # As Orbax: every chunk is stored, so a missing chunk always means damage.
            "store_data_equal_to_fill_value": True,
        }
        if self.assume_metadata:
            return ts.open(spec, open=True, assume_metadata=True, context=self.context)
        return ts.open(spec, create=True, open=False, context=self.context)

    def write_arrays(
        self, leaves: Sequence[LeafOut], on_bytes: Callable[[int], None] | None = None
    ) -> None:
        """Create every array leaf and fill it from its source, all leaves in one pipeline.

        Blocks are chunk-aligned in the output (whole chunks, several when small). Reads of
        upcoming blocks and writes of finished ones overlap as TensorStore futures; the bytes of
        blocks held at once stay under half the memory limit (TensorStore's cache gets a quarter).
        """
        arrays = [leaf for leaf in leaves if leaf.array is not None and leaf.source is not None]
        budget = block_budget(self.memory_limit, self.in_flight)
        self.write_regions([(leaf, leaf_regions(leaf, budget)) for leaf in arrays], on_bytes)

    def write_regions(
        self,
        jobs: Sequence[tuple[LeafOut, Iterable[Region]]],
        on_bytes: Callable[[int], None] | None = None,
    ) -> None:
        """Fill the given chunk-aligned regions of each leaf from its source (the arrays exist,
        or are created here unless ``assume_metadata``), all in one pipeline."""
        pipe = _Pipeline(self, list(jobs), on_bytes)
        try:
            pipe.run()
        except BaseException:
            pipe.drain_quietly()
            raise
        finally:
            self.dest.refresh()  # TensorStore wrote objects that a cached listing does not know

    def write_metadata(self, leaves: Sequence[LeafOut], custom_metadata: Any = None) -> None:
        tree: dict[str, Any] = {}
        shardings: dict[str, str] = {}
        array_metas = []
        strings: dict[str, str] = {}
        for leaf in leaves:
            value: dict[str, Any] = {
                "value_type": leaf.value_type,
                "skip_deserialize": leaf.array is None and leaf.string_value is None,
            }
            if leaf.value_type == "jax.Array" and leaf.write_shape is not None:
                value["write_shape"] = list(leaf.write_shape)
            tree[str(tuple(leaf.keypath))] = {
                "key_metadata": [
                    {"key": k, "key_type": t}
                    for k, t in zip(leaf.keypath, leaf.key_types, strict=True)
                ],
                "value_metadata": value,
            }
            if leaf.string_value is not None:
                strings[leaf.name] = leaf.string_value
            if leaf.value_type == "jax.Array" and leaf.array is not None:
                if leaf.sharding is not None:
                    key = base64.urlsafe_b64encode(leaf.name.encode()).decode()
                    shardings[key] = json.dumps(sharding_json(leaf.sharding))
                array_metas.append(
                    {
                        "array_metadata": {
                            "param_name": leaf.name,
                            "write_shape": list(leaf.write_shape or leaf.array.chunk_shape),
                            "chunk_shape": list(leaf.array.chunk_shape),
                            "ext_metadata": leaf.ext_metadata,
                        }
                    }
                )
        self.dest.child(TREE_METADATA).write_bytes(
            json.dumps(
                {
                    "tree_metadata": tree,
                    "use_ocdbt": self.use_ocdbt,
                    "use_zarr3": self.use_zarr3,
                    "store_array_data_equal_to_fill_value": True,
                    "custom_metadata": custom_metadata,
                }
            ).encode()
        )
        if shardings:
            self.dest.child("_sharding").write_bytes(json.dumps(shardings).encode())
        if array_metas:
            self.dest.child("array_metadatas", "process_0").write_bytes(
                json.dumps({"array_metadatas": array_metas}).encode()
            )
        if strings:
            self.dest.child("_strings.json").write_bytes(json.dumps(strings).encode())
        self.dest.child(COMMIT_MARKER).write_bytes(
            f"Checkpoint commit was successful to {self.dest}".encode()
        )


def _first(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


class StepWriter:
    """A step written so that no reader ever takes it for a finished one before it is.

    Locally (rename): under its tmp name, committed with ``commit_success.txt``, then renamed, as
    Orbax does. Object stores (no rename, ``requires_commit_marker``): in place under its final
    name with a ``.ckpt-writing`` object first, ``commit_success.txt`` put last, as Orbax does
    on GCS; until the marker lands the step is ``uncommitted``.
    """

    def __init__(self, root: Location, step_name: str) -> None:
        self.root = root
        self.final = root.child(step_name)
        self.in_place = root.requires_commit_marker
        self.tmp = self.final if self.in_place else root.child(step_name + TMP_MARKER)
        self.init_ns = time.time_ns()
        self.handlers: dict[str, str] = {}
        self._started = False

    def begin(self) -> None:
        from ckpt_cli.errors import NotACheckpointError

        if self.in_place and self._left_by_ckpt():
            self.final.delete_tree()  # an earlier ckpt write of ours that died: never committed
        if self.final.exists():
            raise NotACheckpointError(
                f"{self.final} already exists",
                hint="choose another destination; ckpt never overwrites a step",
            )
        if not self.in_place and self.tmp.exists():
            self.tmp.delete_tree()  # an earlier ckpt run of ours that died: never a valid step
        self.tmp.make_dirs()
        self._started = True
        if self.in_place:
            self.tmp.child(WRITING_MARKER).write_bytes(b"ckpt is writing this step")

    def _left_by_ckpt(self) -> bool:
        return self.final.child(WRITING_MARKER).is_file() and not (
            self.final.child(COMMIT_MARKER).is_file()
        )

    def item(self, name: str, handler: str = STANDARD_HANDLER) -> Location:
        self.handlers[name] = handler
        loc = self.tmp.child(name)
        loc.make_dirs()
        return loc

    def commit(
        self, custom_metadata: dict[str, Any] | None = None, metrics: dict[str, Any] | None = None
    ) -> Location:
        self.tmp.child(STEP_METADATA).write_bytes(
            json.dumps(
                {
                    "item_handlers": self.handlers,
                    "metrics": metrics or {},
                    "performance_metrics": {},
                    "init_timestamp_nsecs": self.init_ns,
                    "commit_timestamp_nsecs": time.time_ns(),
                    "custom_metadata": custom_metadata or {},
                }
            ).encode()
        )
        if self.in_place:
            self.tmp.child(WRITING_MARKER).delete_file()
        self.tmp.child(COMMIT_MARKER).write_bytes(
            f"Checkpoint commit was successful to {self.final}".encode()
        )
        if not self.in_place:
            self.tmp.rename(self.final.name)
        return self.final

    def abort(self) -> None:
        if self._started and self.tmp.exists():
            self.tmp.delete_tree()


def block_budget(memory_limit: int, in_flight: int = 8) -> int:
    """Bytes of one block in flight: a block costs about three times its size (TensorStore's
    decoded source chunks, the values, the encoded output), so blocks get a quarter of the
    limit and the chunk cache an eighth; the rest is headroom for encoders and the allocator."""
    return max(1 << 20, memory_limit // (4 * in_flight))


def leaf_regions(leaf: LeafOut, budget: int) -> Iterator[Region]:
    """The output blocks of one array leaf, in order: whole output chunks (several when small),
    lined up with the source chunks when that fits (``aligned_block``)."""
    assert leaf.array is not None
    block = aligned_block(leaf.array.info, leaf.source_chunks, budget)
    return iter_blocks(leaf.array.info, block)


def aligned_block(
    info: ArrayInfo, source_chunks: tuple[int, ...] | None, budget: int
) -> tuple[int, ...]:
    """Output blocks made of whole output chunks; when a block of whole source chunks too (the
    per-dimension least common multiple) fits twice the budget, blocks are made of those."""
    if source_chunks is not None and len(source_chunks) == len(info.shape):
        unit = tuple(
            min(n, math.lcm(c, s)) if c and s else n
            for n, c, s in zip(info.shape, info.chunk_shape, source_chunks, strict=True)
        )
        if math.prod(unit) * info.itemsize <= 2 * budget:
            return block_shape(dataclasses.replace(info, chunk_shape=unit), budget)
    return block_shape(info, budget)


class _Pipeline:
    """Blocks of many leaves in flight: source reads, then writes, under a byte budget."""

    def __init__(
        self,
        writer: ItemWriter,
        jobs: list[tuple[LeafOut, Iterable[Region]]],
        on_bytes: Callable[[int], None] | None,
    ) -> None:
        self.writer = writer
        self.jobs = jobs
        self.arrays = [leaf for leaf, _ in jobs]
        self.on_bytes = on_bytes
        self.depth = max(1, writer.in_flight // 2)
        self.budget = block_budget(writer.memory_limit, writer.in_flight)
        self.limit = max(self.budget, writer.memory_limit // 4)
        self.opens: dict[int, Any] = {}
        self.reads: deque[tuple[Any, Any, LeafOut, tuple[slice, ...], int]] = deque()
        self.writes: deque[tuple[Any, LeafOut, int]] = deque()
        self.held = 0

    def run(self) -> None:
        for i, (leaf, regions) in enumerate(self.jobs):
            assert leaf.array is not None and leaf.source is not None
            arr = self._opened(i)
            itemsize = dtype_itemsize(leaf.array.dtype)
            for region in regions:
                nbytes = math.prod(s.stop - s.start for s in region) * itemsize
                self.reads.append((leaf.source(region), arr, leaf, region, nbytes))
                self.held += nbytes
                while self.reads and (len(self.reads) > self.depth or self.held > self.limit):
                    self._start_write()
                while self.writes and (len(self.writes) > self.depth or self.held > self.limit):
                    self._finish_write()
        while self.reads:
            self._start_write()
        while self.writes:
            self._finish_write()

    def _opened(self, i: int) -> Any:
        # Create the next few arrays ahead: each create is a round trip of its own.
        for j in range(i, min(i + 32, len(self.arrays))):
            if j not in self.opens:
                self.opens[j] = self.writer.open_array(self.arrays[j])
        try:
            return self.opens.pop(i).result()
        except Exception as e:
            raise StorageError(
                f"cannot create leaf {self.arrays[i].name!r} in {self.writer.dest}: "
                f"{self.writer.dest.describe_error(e)}"
            ) from None

    def _start_write(self) -> None:
        import numpy as np

        fut, arr, leaf, region, nbytes = self.reads.popleft()
        try:
            values = fut.result() if hasattr(fut, "result") else fut
        except StorageError:
            raise
        except Exception as e:
            raise StorageError(
                f"cannot read the source of leaf {leaf.name!r}: {_first(e)}"
            ) from None
        values = np.asarray(values)
        if values.dtype.name != arr.dtype.name:
            values = values.astype(arr.dtype.numpy_dtype)
        self.writes.append((arr[region].write(values).commit, leaf, nbytes))

    def _finish_write(self) -> None:
        fut, leaf, nbytes = self.writes.popleft()
        try:
            fut.result()
        except Exception as e:
            dest = self.writer.dest
            raise StorageError(
                f"cannot write leaf {leaf.name!r} to {dest}: {dest.describe_error(e)}"
            ) from None
        self.held -= nbytes
        if self.on_bytes:
            self.on_bytes(nbytes)

    def drain_quietly(self) -> None:
        """Let TensorStore finish what it started before the caller deletes the tmp step: a
        write landing after the deletion would re-create the directory."""
        pending = (
            [f[0] for f in self.reads] + [f[0] for f in self.writes] + list(self.opens.values())
        )
        for fut in pending:
            if hasattr(fut, "result"):
                with contextlib.suppress(Exception):
                    fut.result()
