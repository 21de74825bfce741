"""Lay tensors out into safetensors files under a maximum shard size, and the Hugging Face index.

The sharding is the Hugging Face one (``huggingface_hub.split_state_dict_into_shards_factory``):
tensors in the given order fill a shard until the next one would pass the limit; a tensor larger
than the limit gets a shard of its own. One shard is ``model.safetensors``; more are
``model-00001-of-00003.safetensors`` ... plus ``model.safetensors.index.json`` holding
``metadata.total_size`` (tensor bytes, headers excluded) and ``weight_map`` (tensor -> file).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.safetensors.dtypes import safetensors_dtype
from ckpt_cli.core.safetensors.header import (
    METADATA_KEY,
    Header,
    layout,
    parse_json_int,
    plan_header,
    tensor_bytes,
)
from ckpt_cli.errors import InvalidSafetensorsError, RefusedError

INDEX_SUFFIX = ".safetensors.index.json"


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to write: its name in the file, its numpy dtype name and its shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ShardFile:
    """One file of the plan: its name, its header (offsets fixed), and its encoded header."""

    name: str
    header: Header
    encoded_header: bytes

    @property
    def size(self) -> int:
        return self.header.file_size


@dataclass(frozen=True)
class FilesPlan:
    files: tuple[ShardFile, ...]
    index_name: str | None  # None when everything fits in one file
    total_size: int  # tensor bytes

    @property
    def weight_map(self) -> dict[str, str]:
        return {t.name: f.name for f in self.files for t in f.header.tensors}

    @property
    def file_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def index_json(self) -> bytes:
        """The index as ``transformers``' ``save_pretrained`` writes it (sorted, indent 2)."""
        return encode_index(self.total_size, self.weight_map)


def shard_names(count: int, prefix: str = "model") -> list[str]:
    if count == 1:
        return [f"{prefix}.safetensors"]
    return [f"{prefix}-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def plan_files(
    tensors: Sequence[TensorSpec],
    *,
    max_shard_size: int | None,
    metadata: Mapping[str, str] | None = None,
    prefix: str = "model",
) -> FilesPlan:
    """Assign ``tensors`` (in this order) to shards and fix every offset. ``metadata`` goes into
    every file's ``__metadata__``. Refuses names and dtypes the format cannot hold."""
    if max_shard_size is not None and max_shard_size <= 0:
        raise RefusedError(f"the maximum shard size must be positive, got {max_shard_size}")
    seen: set[str] = set()
    groups: list[list[tuple[str, str, tuple[int, ...]]]] = [[]]
    used = 0
    for t in tensors:
        if t.name == METADATA_KEY:
            raise RefusedError(
                f"a tensor may not be named {METADATA_KEY!r} (the format reserves it)",
                hint="rename it (`op: rename`)",
            )
        if t.name in seen:
            raise RefusedError(f"two tensors would be named {t.name!r}", hint="rename one of them")
        seen.add(t.name)
        st = safetensors_dtype(t.dtype, f"leaf {t.name!r}")
        n = tensor_bytes(st, t.shape)
        if max_shard_size is not None and groups[-1] and used + n > max_shard_size:
            groups.append([])
            used = 0
        groups[-1].append((t.name, st, tuple(t.shape)))
        used += n
    names = shard_names(len(groups), prefix)
    files = []
    total = 0
    for name, group in zip(names, groups, strict=True):
        header, encoded = plan_header(layout(group), metadata)
        files.append(ShardFile(name, header, encoded))
        total += header.data_size
    index = f"{prefix}{INDEX_SUFFIX}" if len(files) > 1 else None
    return FilesPlan(tuple(files), index, total)


def encode_index(total_size: int, weight_map: Mapping[str, str]) -> bytes:
    doc = {"metadata": {"total_size": total_size}, "weight_map": dict(weight_map)}
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


@dataclass(frozen=True)
class ShardIndex:
    """A parsed ``*.safetensors.index.json``: which file holds each tensor."""

    weight_map: Mapping[str, str]
    total_size: int | None
    metadata: Mapping[str, Any]

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.weight_map.values()))


def parse_index(raw: bytes, where: str) -> ShardIndex:
    """Validate an index: a ``weight_map`` of tensor names to plain file names in the same
    directory. ``total_size`` is kept for information: writers disagree on what it counts."""

    def bad(message: str) -> InvalidSafetensorsError:
        return InvalidSafetensorsError(
            f"{where}: {message}", hint="the index is damaged: download or export it again"
        )

    try:
        doc = json.loads(raw.decode("utf-8"), parse_int=parse_json_int)
    except (ValueError, RecursionError) as e:
        raise bad(f"not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise bad("no 'weight_map' object")
    weight_map = doc["weight_map"]
    for tensor, file in weight_map.items():
        if not isinstance(file, str) or not file:
            raise bad(f"weight_map[{tensor!r}] is {file!r}, not a file name")
        if "/" in file or "\\" in file or file in (".", ".."):
            raise bad(f"weight_map[{tensor!r}] = {file!r} is not a file of the index's directory")
    meta = doc.get("metadata") or {}
    if not isinstance(meta, dict):
        raise bad("'metadata' is not an object")
    total = meta.get("total_size")
    # Informative only: any integer, or a float standing for one (NaN, 1e400: none).
    if isinstance(total, float) and total.is_integer():
        total = int(total)
    total_size = total if isinstance(total, int) and not isinstance(total, bool) else None
    return ShardIndex(dict(weight_map), total_size, meta)
