"""``ckpt digest`` of safetensors: the ``ld1`` digest of every tensor of a file, an index or a
directory of shards, read block by block (the same digest as the Orbax leaf it was exported
from: ``ld1`` depends on dtype, shape and values only)."""

from __future__ import annotations

import os

from ckpt_cli.core.digest import DigestReport, ItemDigests, LeafDigest, block_budget, sorted_leaves
from ckpt_cli.core.digest.ld1 import Partial, finish, merge, partial
from ckpt_cli.core.progress import ByteProgress, ProgressFn
from ckpt_cli.core.safetensors.dtypes import numpy_dtype_name
from ckpt_cli.core.safetensors.reader import SafetensorsReader, find_files
from ckpt_cli.core.storage import StorageOptions
from ckpt_cli.errors import CkptError, UnsupportedError, UsageError


def is_safetensors(path: str) -> bool:
    """Whether ``path`` names safetensors (a file, an index, or a local directory of them, not
    an Orbax root, step or item that also holds one): ``source.is_safetensors_source``, with
    a bucket path never safetensors here."""
    from ckpt_cli.core.safetensors.source import is_safetensors_source

    try:
        return is_safetensors_source(path)
    except UnsupportedError:
        return False


def digest_any(
    path: str,
    step: int | None = None,
    storage: StorageOptions | None = None,
    memory_limit: int = 1 << 30,
    on_progress: ProgressFn | None = None,
) -> DigestReport:
    """``ckpt digest PATH``: a safetensors file, index or directory of shards, else an Orbax
    root, step or item (``step`` applies to Orbax only)."""
    from ckpt_cli.core.digest.items import digest_path
    from ckpt_cli.core.verify.gate import item_locator

    if is_safetensors(path):
        if step is not None:
            raise UsageError("--step does not apply to safetensors files")
        return digest_safetensors_path(path, memory_limit, on_progress)
    return digest_path(path, step, storage, memory_limit, on_progress, item_locator)


def digest_safetensors_path(
    path: str, memory_limit: int = 1 << 30, on_progress: ProgressFn | None = None
) -> DigestReport:
    """The report of ``ckpt digest`` on safetensors: one item, its tensors as leaves."""
    item = digest_safetensors(path, block_budget(memory_limit), on_progress)
    return DigestReport("safetensors", path, None, (item,))


def digest_safetensors(
    path: str, budget: int = 32 << 20, on_progress: ProgressFn | None = None
) -> ItemDigests:
    """Every tensor of a safetensors file, index or directory of shards."""
    files = find_files(path)
    readers = [SafetensorsReader.open(os.path.join(files.directory, f)) for f in files.files]
    try:
        total = sum(e.nbytes for r in readers for e in r.header.tensors)
        on_bytes = ByteProgress(on_progress, "digest", total)
        leaves: dict[str, LeafDigest] = {}
        for reader in readers:
            for entry in reader.header.tensors:
                try:
                    dtype = numpy_dtype_name(entry.dtype, f"tensor {entry.name!r}")
                except CkptError as e:
                    leaves[entry.name] = LeafDigest(
                        entry.name, entry.dtype, entry.shape, None, e.message
                    )
                    continue
                acc = Partial(dtype, entry.shape, entry.nbytes)
                for (start, _), block in reader.blocks(entry.name, budget):
                    acc = merge([acc, partial(start, block, entry.shape, dtype)])
                    on_bytes(int(block.nbytes))
                leaves[entry.name] = LeafDigest(entry.name, dtype, entry.shape, finish(acc))
    finally:
        for reader in readers:
            reader.close()
    return ItemDigests(os.path.basename(path.rstrip("/")) or path, path, sorted_leaves(leaves))
