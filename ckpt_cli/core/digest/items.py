"""``ckpt digest`` of Orbax: the ``ld1`` digest of every leaf of an item or step.

Reads are chunk-aligned (``stream_blocks``: every stored chunk decoded once, a large one in
slabs from TensorStore's cache) in any order, since the digest of each block merges into its
leaf's whatever the order; memory stays under ``memory_limit``.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ckpt_cli.core.digest import DigestReport, ItemDigests, LeafDigest, block_budget, sorted_leaves
from ckpt_cli.core.digest.ld1 import Partial, finish, merge
from ckpt_cli.core.progress import ByteProgress, ProgressFn
from ckpt_cli.core.storage import StorageOptions, open_location
from ckpt_cli.core.threads import threads
from ckpt_cli.errors import CkptError, first_line

DIGEST_IN_FLIGHT = 8


def digest_path(
    path: str,
    step: int | None = None,
    storage: StorageOptions | None = None,
    memory_limit: int = 1 << 30,
    on_progress: ProgressFn | None = None,
) -> DigestReport:
    """The digests of an Orbax item (every leaf) or a step (every item); safetensors:
    ``digest/safetensors.py``."""
    from ckpt_cli.core.format.resolve import resolve_items

    refs = resolve_items(open_location(path, storage), step)
    items = digest_items([(ref, None) for ref in refs], memory_limit, on_progress)
    return DigestReport("orbax", path, refs[0].step if refs else None, tuple(items))


def digest_items(
    wanted: Sequence[tuple[Any, Collection[str] | None]],
    memory_limit: int = 1 << 30,
    on_progress: ProgressFn | None = None,
) -> list[ItemDigests]:
    """The digests of items (``ItemRef``), one after another under ``memory_limit``, each
    of every leaf or of the leaves named (one progress for all)."""
    from dataclasses import replace

    from ckpt_cli.core.inspect.item import inspect_item

    budget = block_budget(memory_limit)
    reports = []
    for ref, names in wanted:
        report = inspect_item(ref)
        if names is not None:
            report = replace(report, leaves=tuple(x for x in report.leaves if x.name in names))
        reports.append(report)
    total = sum(leaf.array.nbytes for r in reports for leaf in r.leaves if leaf.array)
    on_bytes = ByteProgress(on_progress, "digest", total)
    return [_digest_item(r, budget, memory_limit, on_bytes) for r in reports]


def _digest_item(
    report: Any, budget: int, memory_limit: int, on_bytes: ByteProgress
) -> ItemDigests:
    from ckpt_cli.core.format.arrays import ItemStore, cached_context
    from ckpt_cli.core.format.blocks import cache_bytes
    from ckpt_cli.core.format.scan import OPEN_CACHE_BYTES, ScanTask, open_readers

    leaves: dict[str, LeafDigest] = {}
    for leaf in report.leaves:
        found = _value_digest(leaf) if leaf.array is None else None
        if found is not None:
            leaves[leaf.name] = found
    tasks = [ScanTask(x.name, x.array, x.database) for x in report.leaves if x.array is not None]
    if tasks:
        cache = cache_bytes((t.info for t in tasks), budget)
        store = ItemStore(
            report.ref.location,
            report.zarr_format == 3,
            cached_context(max(cache, OPEN_CACHE_BYTES)),
        )
        flight = _Flight(max(budget, memory_limit // 4 - cache), on_bytes)
        for task, reader in open_readers(store, tasks, cache):
            acc = flight.start(task.name, task.info)
            if isinstance(reader, CkptError):
                acc.problem = reader.message
                continue
            _submit_leaf(task.info, reader, budget, acc, flight)
        flight.drain(0)
        for acc in flight.leaves:
            leaves[acc.name] = acc.result()
    return ItemDigests(report.ref.name, str(report.ref.location), sorted_leaves(leaves))


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


class _Leaf:
    """A leaf being digested: the merge of the partials of the blocks read so far."""

    def __init__(self, name: str, info: Any) -> None:
        self.name = name
        self.info = info
        self.partial = Partial(info.dtype, info.shape, info.nbytes)
        self.problem: str | None = None

    def add(self, origin: tuple[int, ...], block: Any) -> None:
        from ckpt_cli.core.digest.ld1_threads import partial_threaded

        p = partial_threaded(origin, block, self.info.shape, self.info.dtype)
        self.partial = merge([self.partial, p])

    def result(self) -> LeafDigest:
        info = self.info
        if self.problem is not None:
            return LeafDigest(self.name, info.dtype, info.shape, None, self.problem)
        return LeafDigest(self.name, info.dtype, info.shape, finish(self.partial))


class _Flight:
    """Block reads in flight, at most ``DIGEST_IN_FLIGHT`` and ``limit`` bytes."""

    def __init__(self, limit: int, on_bytes: Callable[[int], None]) -> None:
        self.limit = limit
        self.on_bytes = on_bytes
        self.pending: deque[tuple[_Leaf, tuple[int, ...], Any, int]] = deque()
        self.bytes = 0
        self.leaves: list[_Leaf] = []

    def start(self, name: str, info: Any) -> _Leaf:
        self.leaves.append(_Leaf(name, info))
        return self.leaves[-1]

    def submit(self, acc: _Leaf, origin: tuple[int, ...], fut: Any, nbytes: int) -> None:
        self.pending.append((acc, origin, fut, nbytes))
        self.bytes += nbytes
        self.drain(max(DIGEST_IN_FLIGHT, 2 * threads()))

    def drain(self, count: int) -> None:
        while self.pending and (len(self.pending) > count or self.bytes > self.limit):
            acc, origin, fut, nbytes = self.pending.popleft()
            self.bytes -= nbytes
            if acc.problem is None:
                try:
                    acc.add(origin, fut.result())
                except Exception as e:
                    acc.problem = f"a chunk cannot be read or decoded ({first_line(e)}); restore this step from a copy"
            self.on_bytes(nbytes)


def _submit_leaf(info: Any, reader: Any, budget: int, acc: _Leaf, flight: _Flight) -> None:
    from ckpt_cli.core.format.blocks import stream_blocks
    from ckpt_cli.core.format.scan import read_block

    for sl in stream_blocks(info, budget):
        if acc.problem is not None:
            return
        nbytes = math.prod(s.stop - s.start for s in sl) * info.itemsize
        try:
            fut = read_block(reader, sl)
        except Exception as e:
            acc.problem = f"a chunk cannot be read ({first_line(e)})"
            return
        flight.submit(acc, tuple(s.start for s in sl), fut, nbytes)
