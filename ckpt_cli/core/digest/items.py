"""``ckpt digest`` of Orbax: the ``ld1`` digest of every leaf of an item or step.

Reads are ``verify --deep``'s (``format.scan.scan_leaves``): every stored chunk decoded once, on
``--threads`` threads, a chunk larger than a slab streamed slab by slab; blocks come in any order,
since the digest of each merges into its leaf's whatever the order. Memory: two slabs a thread.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ckpt_cli.core.digest import DigestReport, ItemDigests, LeafDigest, sorted_leaves
from ckpt_cli.core.progress import ByteProgress, ProgressFn
from ckpt_cli.core.storage import StorageOptions, open_location
from ckpt_cli.core.threads import threads

#: An item's chunk places (``verify.gate.item_locator``): ``format.scan.Locate`` or None.
Locator = Callable[[Any], Any]


def digest_path(
    path: str,
    step: int | None = None,
    storage: StorageOptions | None = None,
    memory_limit: int = 1 << 30,
    on_progress: ProgressFn | None = None,
    locator: Locator | None = None,
) -> DigestReport:
    """The digests of an Orbax item (every leaf) or a step (every item); safetensors:
    ``digest/safetensors.py``. ``locator(item)``: where its chunks lie in local files
    (``verify.gate.item_locator``), read from there rather than through TensorStore."""
    from ckpt_cli.core.format.resolve import resolve_items

    refs = resolve_items(open_location(path, storage), step)
    items = digest_items([(ref, None) for ref in refs], memory_limit, on_progress, locator)
    return DigestReport("orbax", path, refs[0].step if refs else None, tuple(items))


def digest_items(
    wanted: Sequence[tuple[Any, Collection[str] | None]],
    memory_limit: int = 1 << 30,
    on_progress: ProgressFn | None = None,
    locator: Locator | None = None,
) -> list[ItemDigests]:
    """The digests of items (``ItemRef``), one after another under ``memory_limit``, each
    of every leaf or of the leaves named (one progress for all)."""
    from dataclasses import replace

    from ckpt_cli.core.inspect.item import inspect_item

    reports = []
    for ref, names in wanted:
        report = inspect_item(ref)
        if names is not None:
            report = replace(report, leaves=tuple(x for x in report.leaves if x.name in names))
        reports.append(report)
    total = sum(leaf.array.nbytes for r in reports for leaf in r.leaves if leaf.array)
    on_bytes = ByteProgress(on_progress, "digest", total)
    return [_digest_item(r, memory_limit, on_bytes, locator) for r in reports]


def _digest_item(
    report: Any, memory_limit: int, on_bytes: ByteProgress, locator: Locator | None = None
) -> ItemDigests:
    """Every leaf's digest through ``scan_leaves``, as ``verify --deep`` reads: a chunk larger
    than a slab is decoded by ``chunkstream`` on the scan's threads into slabs hashed there (no
    whole chunk in memory, no TensorStore copy of it; read from its data file where
    ``locator`` places it); smaller chunks through TensorStore."""
    from ckpt_cli.core.format.arrays import ItemStore, cached_context
    from ckpt_cli.core.format.blocks import cache_bytes, streams
    from ckpt_cli.core.format.scan import OPEN_CACHE_BYTES, SCAN_BLOCK_BYTES, ld1_of, scan_leaves
    from ckpt_cli.core.format.scan_acc import ScanTask

    leaves: dict[str, LeafDigest] = {}
    for leaf in report.leaves:
        found = _value_digest(leaf) if leaf.array is None else None
        if found is not None:
            leaves[leaf.name] = found
    infos = {x.name: x.array for x in report.leaves if x.array is not None}
    tasks = [
        ScanTask(x.name, x.array, x.database, ld1=True) for x in report.leaves if x.name in infos
    ]
    # Two slabs a thread in flight, each with its stored-bytes ranges (``chunk_slabs``: a range
    # is at most a slab, held up to three times): a quarter of the limit at most.
    slab = max(1 << 20, min(SCAN_BLOCK_BYTES, memory_limit // (8 * threads())))
    if tasks:
        # The places cost a structure pass (0.5 s for 10,000 leaves): only where a chunk streams.
        streamed = locator is not None and any(streams(t.info, slab) for t in tasks)
        locate = locator(report.ref) if locator is not None and streamed else None
        cache = cache_bytes((t.info for t in tasks), slab)
        store = ItemStore(
            report.ref.location,
            report.zarr_format == 3,
            cached_context(max(cache, OPEN_CACHE_BYTES)),
        )
        for scan in scan_leaves(store, tasks, slab, on_bytes, locate=locate):
            info = infos[scan.name]
            digest = ld1_of(scan)
            if digest is None and scan.error is not None:
                _refuse_local_tier(report.ref.location, scan.name)
            problem = None if digest else _problem(scan.error)
            leaves[scan.name] = LeafDigest(scan.name, info.dtype, info.shape, digest, problem)
    return ItemDigests(report.ref.name, str(report.ref.location), sorted_leaves(leaves))


def _refuse_local_tier(item: Any, leaf: str) -> None:
    """A leaf only partly stored in one host's local tier of Orbax's emergency checkpointing:
    refused as such (not damage to restore from a copy)."""
    from ckpt_cli.core.format.tiers import partial_leaf_refusal

    if (refusal := partial_leaf_refusal(item, leaf)) is not None:
        raise refusal


def _problem(error: str | None) -> str:
    if error is not None and error.startswith("cannot open leaf"):
        return error
    why = error or "not every chunk was read"
    return f"a chunk cannot be read or decoded ({why}); restore this step from a copy"


def _value_digest(leaf: Any) -> LeafDigest | None:
    """A leaf stored as a value rather than an array: a string, or a JSON item's value (None
    for an empty container or a None: no values, nothing to digest)."""
    from ckpt_cli.core.digest.ld1 import digest_text

    if leaf.problem:
        return LeafDigest(leaf.name, leaf.dtype or leaf.value_type, (), None, leaf.problem)
    if leaf.value is None or leaf.value_type not in ("string", "json"):
        return None
    if leaf.value_type == "json":
        text = json.dumps(json.loads(leaf.value), sort_keys=True, separators=(",", ":"))
        return LeafDigest(leaf.name, "json", (), digest_text(text, "json"))
    return LeafDigest(leaf.name, "string", (), digest_text(leaf.value))
