"""What the writers write: output arrays and leaves, where their values come from, and the
options of a write (limits, storage format, where the work runs).

A ``LeafOut`` is one leaf of an output item; its ``source`` computes any region of the output
array (a TensorStore future or an array), and its ``plan`` is the picklable description a worker
of a scaled-out run rebuilds that source from (``distributed.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ckpt_cli.core.executor import ExecutorSpec
from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore
from ckpt_cli.core.format.dtypes import EXTRA_DTYPES, dtype_itemsize
from ckpt_cli.core.format.metadata import ARRAY_ITEM_LEAF, KEY_TYPE_DICT
from ckpt_cli.core.format.sharding import ShardingInfo
from ckpt_cli.core.storage import Location
from ckpt_cli.core.units import human_bytes
from ckpt_cli.errors import UsageError

#: A block source: given a region of the destination array, a future of its values.
BlockSource = Callable[[tuple[slice, ...]], Any]
Region = tuple[slice, ...]


class SourcePlan(Protocol):
    """A picklable description of a leaf's values, rebuilt into a ``BlockSource`` by a worker of
    a scaled-out run (``distributed.py``): data only (the source item's URL, leaf names, the
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
    #: Bytes of the largest source chunk TensorStore decodes for this leaf (None: values not
    #: read from stored chunks): the pipeline reads a block in slabs only when that chunk fits
    #: the writer's source cache (``pipeline.slab_source``).
    source_chunk_bytes: int | None = None
    #: Bytes per output element that the source's reads hold before they become the output's
    #: values (a cast from float32 to bfloat16: 4; an average of two float32 leaves: 8); None:
    #: the output's own itemsize. The pipeline counts a block in flight at the larger of the two.
    source_itemsize: int | None = None
    #: Whether every block ``source`` hands over is a new array that nothing else refers to or
    #: changes afterwards (a cast's, a stored leaf's read): TensorStore then encodes from it
    #: instead of copying it first.
    fresh_blocks: bool = False
    #: How a worker of a scaled-out run rebuilds ``source`` (None: this process only).
    plan: SourcePlan | None = None

    @property
    def name(self) -> str:
        return ".".join(self.keypath)


def stored_keypath(keypath: tuple[str, ...], item_kind: str) -> tuple[str, ...]:
    """The keypath a leaf is written under: an ArraySave item's one array (keypath ``()``,
    as ``inspect`` shows it) is stored as ``checkpoint``, where ArrayCheckpointHandler looks."""
    return keypath if keypath or item_kind != "array" else (ARRAY_ITEM_LEAF,)


def stored_key_types(key_types: tuple[int, ...], item_kind: str) -> tuple[int, ...]:
    return key_types if key_types or item_kind != "array" else (KEY_TYPE_DICT,)


class ArraySink(Protocol):
    """Where the block pipeline writes: an item directory that opens (creates) output arrays."""

    @property
    def dest(self) -> Location: ...

    @property
    def memory_limit(self) -> int: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def finite_label(self) -> str | None: ...

    @property
    def slab_reads(self) -> bool: ...

    def open_array(self, leaf: LeafOut) -> Any: ...


@dataclass(frozen=True)
class WriteOptions:
    """How a writer (reshard, migrate) writes: limits, storage format, where the work runs.

    ``memory_limit`` bounds the array bytes held at once (blocks in flight plus TensorStore's
    cache); a chunk may take at most a quarter of it. ``zarr3`` None keeps the source's zarr
    version. With an ``executor`` that scales out, arrays are written in units of about
    ``unit_bytes`` by its workers.
    """

    max_chunk_bytes: int = 64 << 20
    memory_limit: int = 1 << 30
    zarr3: bool | None = None
    compression: Compression = field(default_factory=lambda: Compression("zstd"))
    ocdbt: bool = True
    executor: ExecutorSpec = field(default_factory=ExecutorSpec)
    unit_bytes: int = 256 << 20
    #: Write NaN/Inf values as they are (``--allow-nonfinite``); by default a writer refuses
    #: them (``NonFiniteError``, nothing committed).
    allow_nonfinite: bool = False

    def __post_init__(self) -> None:
        if self.max_chunk_bytes * 4 > self.memory_limit:
            raise UsageError(
                f"--max-chunk-bytes ({human_bytes(self.max_chunk_bytes)}) must be at most a "
                f"quarter of --memory-limit ({human_bytes(self.memory_limit)})"
            )
