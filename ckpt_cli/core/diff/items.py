"""``diff_paths``: the two sides resolved to items (a root's latest step, a step's items paired by
name), and ``diff_items``: two items compared leaf by leaf, leaves only one side has, items of a
handler ckpt does not read file by file."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

from ckpt_cli.core.diff import (
    DIFF_BLOCK_BYTES,
    DIFF_IN_FLIGHT_BYTES,
    MEMORY_LIMIT,
    DiffReport,
    LeafDiff,
)
from ckpt_cli.core.diff.compare import Compare
from ckpt_cli.core.diff.values import Job, compared, decided, diff_structure, stream_jobs
from ckpt_cli.core.format.arrays import ItemStore, cached_context
from ckpt_cli.core.format.blocks import (
    cache_bytes,
    decoded_chunk_bytes,
)
from ckpt_cli.core.format.discovery import ItemRef
from ckpt_cli.core.format.resolve import resolve_item, resolve_trees
from ckpt_cli.core.format.scan import (
    OPEN_CACHE_BYTES,
)
from ckpt_cli.core.format.tiers import partial_leaf_refusal
from ckpt_cli.core.inspect import ItemReport, Leaf
from ckpt_cli.core.inspect.item import inspect_item
from ckpt_cli.core.progress import ByteProgress, ProgressFn
from ckpt_cli.core.storage import Location, StorageOptions, open_location
from ckpt_cli.core.units import human_bytes
from ckpt_cli.errors import NotFoundError, UsageError


def diff_paths(
    a: str,
    b: str,
    *,
    step: int | None = None,
    step_a: int | None = None,
    step_b: int | None = None,
    item: str | None = None,
    atol: float = 0.0,
    rtol: float = 0.0,
    compare_cast: bool = False,
    name_filter: str | None = None,
    on_progress: ProgressFn | None = None,
    storage: StorageOptions | None = None,
    item_a: str | None = None,
    item_b: str | None = None,
    memory_limit: int = MEMORY_LIMIT,
    structure_only: bool = False,
    ignore: tuple[str, ...] = (),
) -> DiffReport:
    """``ckpt diff A B``: resolve both sides (``step`` for both roots unless ``step_a`` or
    ``step_b``; ``item`` for both unless ``item_a`` or ``item_b``), then compare them; leaves
    a pattern of ``ignore`` finds are left out."""
    _check_tolerance(atol, rtol)
    step_a = step_a if step_a is not None else step
    step_b = step_b if step_b is not None else step
    several = item is None and item_a is None and item_b is None
    side = resolve_side_items if several else resolve_side
    refs_a = side(a, step_a, item_a or item, "--step-a", storage)
    refs_b = side(b, step_b, item_b or item, "--step-b", storage)
    pairs, only_a, only_b = pair_items(
        refs_a if isinstance(refs_a, list) else [refs_a],
        refs_b if isinstance(refs_b, list) else [refs_b],
    )
    reports = [
        diff_items(
            ref_a,
            ref_b,
            atol,
            rtol,
            compare_cast,
            name_filter,
            on_progress,
            memory_limit=memory_limit,
            structure_only=structure_only,
            ignore=ignore,
        )
        for ref_a, ref_b in pairs
    ]
    return replace(reports[0], more=tuple(reports[1:]), items_only_a=only_a, items_only_b=only_b)


def pair_items(
    a: list[ItemRef], b: list[ItemRef]
) -> tuple[list[tuple[ItemRef, ItemRef]], tuple[str, ...], tuple[str, ...]]:
    """The items of two steps to compare: one with one (whatever their names), else those of
    the same name (A's order), and the names only A, only B holds."""
    if len(a) == 1 and len(b) == 1:
        return [(a[0], b[0])], (), ()
    names_b = {r.name: r for r in b}
    pairs = [(r, names_b[r.name]) for r in a if r.name in names_b]
    if not pairs:
        raise UsageError(
            f"A and B hold no item of the same name (A: {', '.join(r.name for r in a)}; "
            f"B: {', '.join(r.name for r in b)})",
            hint="choose one on each side with --item-a NAME --item-b NAME",
        )
    only_a = tuple(r.name for r in a if r.name not in names_b)
    names_a = {r.name for r in a}
    return pairs, only_a, tuple(r.name for r in b if r.name not in names_a)


def _check_tolerance(atol: float, rtol: float) -> None:
    if atol < 0 or rtol < 0:
        raise UsageError("--atol and --rtol must not be negative")


def resolve_side(
    target: str,
    step: int | None = None,
    item: str | None = None,
    flag: str = "--step",
    storage: StorageOptions | None = None,
) -> ItemRef:
    """One side of a diff: a root, step or item path, where ``ROOT@STEP`` picks a step and
    ``ROOT@STEP:ITEM`` an item of it (unless a file or directory of that very name exists)."""
    location, step, item = _side(target, step, item, flag, storage)
    return resolve_item(location, step, item)


def resolve_side_items(
    target: str,
    step: int | None = None,
    item: str | None = None,
    flag: str = "--step",
    storage: StorageOptions | None = None,
) -> list[ItemRef]:
    """``resolve_side``, except that a step of several PyTree items (and no item named)
    resolves to every one of them (``resolve_trees``)."""
    location, step, item = _side(target, step, item, flag, storage)
    return resolve_trees(location, step, item)


def _side(
    target: str, step: int | None, item: str | None, flag: str, storage: StorageOptions | None
) -> tuple[Location, int | None, str | None]:
    """Where a side's item is looked for: its location, step and item, ``@STEP:ITEM`` read."""
    path, at, tail = target.rpartition("@")
    if at and not os.path.exists(target):
        number, colon, name = tail.partition(":")
        if number.isdigit() and (not colon or name):
            if step is not None:
                raise UsageError(f"{target} names a step; do not also pass {flag} or --step")
            if colon and item is not None and item != name:
                raise UsageError(f"{target} names the item {name!r}; --item says {item!r}")
            return open_location(path, storage), int(number), name or item
    return open_location(target, storage), step, item


def diff_items(
    a: ItemRef,
    b: ItemRef,
    atol: float = 0.0,
    rtol: float = 0.0,
    compare_cast: bool = False,
    name_filter: str | None = None,
    on_progress: ProgressFn | None = None,
    *,
    memory_limit: int = MEMORY_LIMIT,
    structure_only: bool = False,
    ignore: tuple[str, ...] = (),
) -> DiffReport:
    """Compare ``a`` with ``b`` leaf by leaf (progress as ``data`` bytes of the arrays in both),
    holding about ``memory_limit`` bytes at most; ``structure_only``: no array data read;
    leaves (or files) a pattern of ``ignore`` finds are left out."""
    _check_tolerance(atol, rtol)
    ignored = ignore_filter(ignore)
    ra, rb = inspect_item(a, name_filter), inspect_item(b, name_filter)
    report = DiffReport(a, b, atol, rtol, compare_cast, (), structure_only, ignore=ignore)
    if "unknown" in (ra.kind, rb.kind):
        files = () if structure_only else _diff_files(a, b, name_filter)
        kept = tuple(d for d in files if not ignored(d.name))
        return replace(report, leaves=kept, ignored=len(files) - len(kept))
    ra, na = _without(ra, ignored)
    rb, nb = _without(rb, ignored)
    leaves = _diff_leaves(
        ra, rb, atol, rtol, compare_cast, on_progress, memory_limit, structure_only
    )
    return replace(report, leaves=leaves, ignored=na + nb)


def ignore_filter(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    """Whether a name is left out: ``--ignore`` patterns (globs or RE2 regexes, searched
    anywhere in the name, as ``--filter``), any one of them."""
    from ckpt_cli.core.format.names import compile_leaf_pattern

    compiled = [compile_leaf_pattern(p, "--ignore") for p in patterns]
    return lambda name: any(r.search(name) for r in compiled)


def _without(report: ItemReport, ignored: Callable[[str], bool]) -> tuple[ItemReport, int]:
    """The report without the leaves ``ignored`` finds, and how many those were."""
    kept = tuple(x for x in report.leaves if not ignored(x.name))
    return replace(report, leaves=kept), len(report.leaves) - len(kept)


def _diff_leaves(
    ra: ItemReport,
    rb: ItemReport,
    atol: float,
    rtol: float,
    compare_cast: bool,
    on_progress: ProgressFn | None,
    memory_limit: int,
    structure_only: bool,
) -> tuple[LeafDiff, ...]:
    """``diff_items`` of two items ckpt reads, leaf by leaf."""
    la = {leaf.name: leaf for leaf in ra.leaves}
    lb = {leaf.name: leaf for leaf in rb.leaves}
    common = [(la[n], lb[n]) for n in sorted(la.keys() & lb.keys())]
    budget = max(1 << 20, min(DIFF_BLOCK_BYTES, memory_limit // 64))
    # Each side's chunk cache holds its largest chunk that does not fit a block (twice: the
    # next one's reads start while the last slabs of one are compared).
    cache_a = cache_bytes((x.array for x, _ in common if x.array), budget)
    cache_b = cache_bytes((y.array for _, y in common if y.array), budget)
    if structure_only:
        sa = sb = None
    else:
        sa, sb = _store(ra, cache_a), _store(rb, cache_b)
    total = 0 if structure_only else sum(x.size_bytes for x, y in common if x.is_array)
    on_bytes = ByteProgress(on_progress, "data", total)

    out: list[LeafDiff | None] = []
    jobs: list[Job] = []
    for name in sorted(la.keys() | lb.keys()):
        x, y = la.get(name), lb.get(name)
        if x is None or y is None:
            out.append(_one_sided(name, x, y))
            continue
        if structure_only:
            out.append(diff_structure(x, y))
            continue
        found = decided(x, y, compare_cast)
        if found is None:
            jobs.append(Job(len(out), x, y, Compare(atol, rtol, exact_ints=x.dtype == y.dtype)))
        out.append(found)
    if jobs:
        assert sa is not None and sb is not None
        held = max(budget, min(DIFF_IN_FLIGHT_BYTES, memory_limit // 16))
        stream_jobs(sa, sb, jobs, on_bytes, budget, held, (cache_a, cache_b))
    for job in jobs:
        if job.error is not None:
            _refuse_local_tier((ra, rb), job.x.name)
        out[job.index] = compared(job)
    both = {} if structure_only else {x.name: x for x, _ in common}
    streamed = {job.x.name for job in jobs if job.streamed}
    return tuple(
        d if d.name in streamed else _floor_note(d, both.get(d.name), memory_limit)
        for d in out
        if d is not None
    )


def _refuse_local_tier(reports: tuple[ItemReport, ItemReport], leaf: str) -> None:
    """A leaf only partly stored on a side that is one host's local tier of Orbax's emergency
    checkpointing: refused as such (not a difference, not damage)."""
    for report in reports:
        if (refusal := partial_leaf_refusal(report.ref.location, leaf)) is not None:
            raise refusal


def _diff_files(a: ItemRef, b: ItemRef, name_filter: str | None) -> tuple[LeafDiff, ...]:
    """Two items of a handler ckpt does not read, file by file, byte for byte (its commit
    marker aside, which names the path it was written to)."""
    from ckpt_cli.core.format.items import BOOKKEEPING
    from ckpt_cli.core.format.names import compile_filter

    pattern = compile_filter(name_filter)

    def files(ref: ItemRef) -> dict[str, int]:
        try:
            walked = ref.location.walk()
        except NotFoundError:
            return {}
        return {
            rel: e.size
            for rel, e in walked
            if not e.is_symlink and rel not in BOOKKEEPING and (not pattern or pattern.search(rel))
        }

    fa, fb = files(a), files(b)
    out = []
    for rel in sorted(fa.keys() | fb.keys()):
        if rel not in fb or rel not in fa:
            out.append(LeafDiff(rel, "only_a" if rel not in fb else "only_b"))
            continue
        same = fa[rel] == fb[rel] and (
            a.location.child(*rel.split("/")).read_bytes()
            == b.location.child(*rel.split("/")).read_bytes()
        )
        message = None if same else f"the file's bytes differ ({fa[rel]} vs {fb[rel]} bytes)"
        out.append(LeafDiff(rel, "equal" if same else "different", message=message))
    return tuple(out)


def _one_sided(name: str, x: Leaf | None, y: Leaf | None) -> LeafDiff:
    """A leaf only one side has."""
    leaf = x or y
    assert leaf is not None
    return LeafDiff(
        name,
        "only_a" if y is None else "only_b",
        *((leaf.dtype, None) if y is None else (None, leaf.dtype)),
        *((leaf.shape, None) if y is None else (None, leaf.shape)),
    )


def _floor_note(d: LeafDiff, x: Leaf | None, memory_limit: int) -> LeafDiff:
    """``d``, saying so when one chunk of the leaf, decoded on both sides, exceeds the limit."""
    if x is None or x.array is None or 2 * decoded_chunk_bytes(x.array) <= memory_limit // 2:
        return d
    note = (
        f"a chunk is {human_bytes(decoded_chunk_bytes(x.array))} decoded, held whole "
        "on each side: the format's floor, above what --memory-limit leaves for it"
    )
    return replace(d, message=f"{d.message}; {note}" if d.message else note)


def _store(report: ItemReport, cache: int = 0) -> ItemStore | None:
    if report.storage == "json":
        return None
    # One context for every leaf: its cache keeps the OCDBT manifest and tree nodes, which a
    # context per open would read again for each of thousands of small leaves; and it holds a
    # chunk larger than a block while that chunk is read in slabs.
    context = cached_context(max(cache, OPEN_CACHE_BYTES))
    return ItemStore(report.ref.location, report.zarr_format == 3, context)
