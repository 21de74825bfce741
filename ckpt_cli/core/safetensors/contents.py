"""``ckpt inspect`` of safetensors: a file, an index, or a Hugging Face folder of shards.

Every tensor (name, dtype, shape, bytes, the file holding it and where: ``data_offsets`` as the
header writes them, relative to the byte buffer, and ``file_offset``, absolute), every file's
``__metadata__``, the index and the folder's ``config.json`` (model type, architectures,
dtype). Headers are read and validated (``SafetensorsReader``); tensor data only with
``stats``. Damage is refused with one line (``ckpt verify`` names every problem).

The JSON is its own document, told apart from an Orbax item's by ``source: "safetensors"``;
it carries inspect's ``schema_version``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypedDict

from ckpt_cli.core.format.names import compile_filter
from ckpt_cli.core.inspect import ItemReport
from ckpt_cli.core.progress import ByteProgress, ProgressFn
from ckpt_cli.core.safetensors.dtypes import TO_NUMPY
from ckpt_cli.core.safetensors.header import TensorEntry
from ckpt_cli.core.safetensors.reader import SafetensorsReader, SourceFiles, check_against_index
from ckpt_cli.core.safetensors.source import Located, locate, strict
from ckpt_cli.core.schema import JSONValue
from ckpt_cli.core.stats import LeafStats, StatsJSON, blocks_stats
from ckpt_cli.errors import UsageError

#: The keys of config.json worth a line: what model the folder holds.
CONFIG_KEYS = ("model_type", "architectures", "torch_dtype", "dtype", "transformers_version")
_BLOCK = 32 << 20


class SafetensorsTensorJSON(TypedDict):
    name: str
    dtype: str  # the safetensors name: F32, BF16, ...
    shape: list[int]
    elements: int
    bytes: int
    file: str
    #: [begin, end) relative to the file's byte buffer, as the header writes them.
    data_offsets: list[int]
    #: Where the tensor's first byte is in the file.
    file_offset: int
    stats: StatsJSON | None


class SafetensorsFileJSON(TypedDict):
    name: str
    bytes: int
    header_bytes: int  # the 8-byte length and the JSON, padding included
    tensors: int
    metadata: dict[str, str] | None


class SafetensorsIndexJSON(TypedDict):
    name: str
    total_size: int | None
    metadata: dict[str, JSONValue]


class SafetensorsTotalsJSON(TypedDict):
    files: int
    tensors: int
    elements: int
    bytes: int


class SafetensorsInspectJSON(TypedDict):
    """``ckpt inspect --json`` of safetensors (``source`` tells it from an Orbax item's)."""

    schema_version: int
    source: Literal["safetensors"]
    ok: bool
    path: str
    index: SafetensorsIndexJSON | None
    #: The folder's config.json, its keys in ``CONFIG_KEYS`` only; None without one.
    config: dict[str, JSONValue] | None
    files: list[SafetensorsFileJSON]
    totals: SafetensorsTotalsJSON
    tensors: list[SafetensorsTensorJSON]


@dataclass(frozen=True)
class StTensor:
    entry: TensorEntry
    file: str
    data_start: int  # where the file's byte buffer starts
    stats: LeafStats | None = None

    def to_json(self) -> SafetensorsTensorJSON:
        e = self.entry
        return {
            "name": e.name,
            "dtype": e.dtype,
            "shape": list(e.shape),
            "elements": math.prod(e.shape),
            "bytes": e.nbytes,
            "file": self.file,
            "data_offsets": [e.begin, e.end],
            "file_offset": self.data_start + e.begin,
            "stats": self.stats.to_json() if self.stats else None,
        }


@dataclass(frozen=True)
class StFile:
    name: str
    size: int
    header_bytes: int
    tensors: int
    metadata: dict[str, str] | None

    def to_json(self) -> SafetensorsFileJSON:
        return {
            "name": self.name,
            "bytes": self.size,
            "header_bytes": self.header_bytes,
            "tensors": self.tensors,
            "metadata": self.metadata,
        }


@dataclass(frozen=True)
class SafetensorsInspection:
    """What ``ckpt inspect`` shows of safetensors (``to_json``: its ``--json``)."""

    SCHEMA_VERSION: ClassVar[int] = ItemReport.SCHEMA_VERSION
    path: str
    located: Located
    files: tuple[StFile, ...]
    tensors: tuple[StTensor, ...]  # in name order, those the filter kept
    all_tensors: int

    @property
    def total_bytes(self) -> int:
        return sum(t.entry.nbytes for t in self.tensors)

    @property
    def config(self) -> dict[str, JSONValue] | None:
        config = self.located.config
        return None if config is None else {k: config[k] for k in CONFIG_KEYS if k in config}

    def to_json(self) -> SafetensorsInspectJSON:
        index = self.located.index
        return {
            "schema_version": self.SCHEMA_VERSION,
            "source": "safetensors",
            "ok": True,
            "path": self.path,
            "index": None
            if index is None or self.located.index_name is None
            else {
                "name": self.located.index_name,
                "total_size": index.total_size,
                "metadata": dict(index.metadata),
            },
            "config": self.config,
            "files": [f.to_json() for f in self.files],
            "totals": {
                "files": len(self.files),
                "tensors": len(self.tensors),
                "elements": sum(math.prod(t.entry.shape) for t in self.tensors),
                "bytes": self.total_bytes,
            },
            "tensors": [t.to_json() for t in self.tensors],
        }


def inspect_safetensors(
    path: str,
    *,
    name_filter: str | None = None,
    stats: bool = False,
    on_progress: ProgressFn | None = None,
) -> SafetensorsInspection:
    """The tensors, files, index and config of a safetensors file, index or folder; ``stats``
    reads every kept tensor block by block (progress as ``stats`` bytes)."""
    located = strict(locate(path))
    pattern = compile_filter(name_filter)
    readers = [SafetensorsReader.open(located.file_path(f)) for f in located.files]
    try:
        headers = {f: r.header for f, r in zip(located.files, readers, strict=True)}
        files = SourceFiles(located.directory, located.files, located.index)
        check_against_index(files, headers)
        kept = [
            (reader, name, t)
            for name, reader in zip(located.files, readers, strict=True)
            for t in reader.header.tensors
            if pattern is None or pattern.search(t.name)
        ]
        if name_filter is not None and not kept:
            raise UsageError(f"--filter {name_filter!r} matches no tensor of {path}")
        tensors = _tensors(kept, stats, on_progress)
    finally:
        for reader in readers:
            reader.close()
    st_files = tuple(
        StFile(f, r.source.size, r.header.data_start, len(r.header.tensors), _meta(r))
        for f, r in zip(located.files, readers, strict=True)
    )
    return SafetensorsInspection(
        path, located, st_files, tensors, sum(len(h.tensors) for h in headers.values())
    )


def _meta(reader: SafetensorsReader) -> dict[str, str] | None:
    metadata = reader.header.metadata
    return None if metadata is None else dict(metadata)


def _tensors(
    kept: list[tuple[SafetensorsReader, str, TensorEntry]],
    stats: bool,
    on_progress: ProgressFn | None,
) -> tuple[StTensor, ...]:
    on_bytes = ByteProgress(on_progress, "stats", sum(t.nbytes for _, _, t in kept))
    out = []
    for reader, file, entry in sorted(kept, key=lambda k: k[2].name):
        values = None
        if stats and entry.dtype in TO_NUMPY:  # other dtypes (F4, C64, ...) are not decoded
            values = blocks_stats(_blocks(reader, entry, on_bytes))
        out.append(StTensor(entry, os.path.basename(file), reader.header.data_start, values))
    return tuple(out)


def _blocks(reader: SafetensorsReader, entry: TensorEntry, on_bytes: ByteProgress) -> Any:
    for _, block in reader.blocks(entry.name, _BLOCK):
        on_bytes(int(block.nbytes))
        yield block
