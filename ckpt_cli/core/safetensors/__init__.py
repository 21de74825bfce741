"""The safetensors format (Hugging Face, PyTorch): header model, strict parser, shard planner,
streaming writer and reader. Pure Python over numpy and ml_dtypes: no JAX (but for a
``--target``, in ``tree``), no Typer, no Rich.

Modules: ``dtypes`` (the dtype table), ``header`` (encode and parse a header), ``blocks`` (the
contiguous pieces tensors stream in), ``plan`` (tensors -> shard files, the HF index),
``writer`` (one file, block by block, renamed when complete), ``reader`` (blocks by positioned
reads; a Hugging Face directory through its index), ``tree`` (the tree's containers, recorded as
``ckpt.tree``), ``export``/``import_`` (plans) and ``export_run``/``import_run``; as a source
for the read commands: ``source`` (the files of a file, index or Hugging Face folder, damage kept
as messages), ``contents`` (``ckpt inspect``) and ``checks`` (``ckpt verify``).
"""

from __future__ import annotations

from ckpt_cli.core.safetensors.header import Header, TensorEntry, encode_header, parse_header
from ckpt_cli.core.safetensors.plan import (
    FilesPlan,
    ShardFile,
    ShardIndex,
    TensorSpec,
    parse_index,
    plan_files,
)
from ckpt_cli.core.safetensors.reader import SafetensorsReader, find_files
from ckpt_cli.core.safetensors.writer import SafetensorsWriter

__all__ = [
    "FilesPlan",
    "Header",
    "SafetensorsReader",
    "SafetensorsWriter",
    "ShardFile",
    "ShardIndex",
    "TensorEntry",
    "TensorSpec",
    "encode_header",
    "find_files",
    "parse_header",
    "parse_index",
    "plan_files",
]
