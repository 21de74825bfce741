"""Weight parity: ``ckpt diff A B`` where a side is safetensors (a file, an index, a Hugging Face
folder), or where ``--spec`` maps A's leaves first (the migrate spec ``ckpt export`` takes: its
renames, transposes, splits and concats of fused q/k/v, casts, applied as export applies them,
so an Orbax step and its export with the same spec compare equal).

Tensors are paired by name; each pair of the same dtype and shape (or any dtypes, as float64,
with ``compare_cast``) is compared block by block: C-contiguous blocks along the first axes
(``blocks.contiguous_blocks``, lined up with A's chunks), both sides read ahead under a byte
budget and compared in order by ``diff.values.Compare`` (max absolute and relative difference,
elements outside ``|a - b| <= atol + rtol * |b|``, NaN equal to NaN). Memory follows the block
size and the reads in flight, never a tensor or the model.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.diff import MEMORY_LIMIT, DiffReport, LeafDiff
from ckpt_cli.core.diff.values import Compare
from ckpt_cli.core.progress import ByteProgress, ProgressFn
from ckpt_cli.core.safetensors.blocks import contiguous_blocks
from ckpt_cli.core.safetensors.parity_source import (
    OrbaxSide,
    SafetensorsSide,
    Side,
    Tensor,
    block_budget,
    is_safetensors,
)
from ckpt_cli.core.spec import ops
from ckpt_cli.core.storage import StorageOptions
from ckpt_cli.errors import CkptError, UsageError, first_line

#: Block pairs read ahead at most.
IN_FLIGHT = 16


@dataclass(frozen=True)
class ParityOptions:
    """What a parity diff compares and how: the spec for A, tolerances, names left out."""

    spec: str | None = None
    atol: float = 0.0
    rtol: float = 0.0
    compare_cast: bool = False
    name_filter: str | None = None
    ignore: tuple[str, ...] = ()
    memory_limit: int = MEMORY_LIMIT
    #: ``--structure``: names, dtypes and shapes compared; no values read.
    structure_only: bool = False


def needs_parity(a: str, b: str, spec: str | None) -> bool:
    """Whether ``diff A B`` is a parity diff: a side is safetensors, or a spec maps A."""
    return spec is not None or is_safetensors(a) or is_safetensors(b)


def diff_parity(
    a: str,
    b: str,
    options: ParityOptions,
    *,
    steps: tuple[int | None, int | None] = (None, None),
    items: tuple[str | None, str | None] = (None, None),
    on_progress: ProgressFn | None = None,
    storage: StorageOptions | None = None,
) -> DiffReport:
    """Compare ``a`` with ``b`` tensor by tensor (each an Orbax root, step or item, or
    safetensors), ``options.spec`` applied to A first; ``steps`` and ``items`` choose in the
    Orbax sides."""
    from ckpt_cli.core.diff.items import ignore_filter

    if options.atol < 0 or options.rtol < 0:
        raise UsageError("--atol and --rtol must not be negative")
    ignored = ignore_filter(options.ignore)
    kept = _name_filter(options.name_filter)
    side_a = _open(a, steps[0], items[0], "--step-a", storage, options, spec_side=True)
    try:
        side_b = _open(b, steps[1], items[1], "--step-b", storage, options, spec_side=False)
        try:
            names = sorted(n for n in side_a.tensors.keys() | side_b.tensors.keys() if kept(n))
            compared = [n for n in names if not ignored(n)]
            leaves = _compare(side_a, side_b, compared, options, on_progress)
        finally:
            side_b.close()
    finally:
        side_a.close()
    return DiffReport(
        side_a.ref(),
        side_b.ref(),
        options.atol,
        options.rtol,
        options.compare_cast,
        leaves,
        options.structure_only,
        formats=(side_a.format, side_b.format),
        spec=options.spec,
        ignore=options.ignore,
        ignored=sum((n in side_a.tensors) + (n in side_b.tensors) for n in names if ignored(n)),
    )


def _name_filter(pattern: str | None) -> Callable[[str], bool]:
    from ckpt_cli.core.format.names import compile_filter

    compiled = compile_filter(pattern)
    return lambda name: compiled is None or compiled.search(name) is not None


def _open(
    target: str,
    step: int | None,
    item: str | None,
    flag: str,
    storage: StorageOptions | None,
    options: ParityOptions,
    *,
    spec_side: bool,
) -> Side:
    """One side: safetensors, or an Orbax item (through the spec on A)."""
    if is_safetensors(target):
        if spec_side and options.spec is not None:
            raise UsageError(
                f"--spec maps the leaves of an Orbax checkpoint, and A ({target}) is safetensors",
                hint="put the Orbax side first: ckpt diff ORBAX SAFETENSORS --spec FILE",
            )
        if step is not None or item is not None:
            raise UsageError(f"{target} is safetensors: it has no steps or items to choose")
        return SafetensorsSide(target)
    from ckpt_cli.core.diff.items import resolve_side
    from ckpt_cli.core.spec.language import load_spec

    ref = resolve_side(target, step, item, flag, storage)
    spec = load_spec(options.spec) if spec_side and options.spec is not None else None
    return OrbaxSide(ref, spec, options.memory_limit)


@dataclass
class _Job:
    """A pair of tensors whose values are compared, and how far it got."""

    index: int
    a: Tensor
    b: Tensor
    acc: Compare
    error: str | None = None


def _compare(
    sa: Side,
    sb: Side,
    names: list[str],
    options: ParityOptions,
    on_progress: ProgressFn | None,
) -> tuple[LeafDiff, ...]:
    """Every name: only on one side, a dtype or shape that differs, or the values compared."""
    out: list[LeafDiff] = []
    jobs: list[_Job] = []
    for name in names:
        x, y = sa.tensors.get(name), sb.tensors.get(name)
        if x is None or y is None:
            t = x or y
            assert t is not None
            status = "only_a" if y is None else "only_b"
            dtypes = (t.dtype, None) if y is None else (None, t.dtype)
            shapes = (t.shape, None) if y is None else (None, t.shape)
            out.append(LeafDiff(name, status, *dtypes, *shapes))
            continue
        found = _decided(x, y, options.compare_cast)
        if found is None:
            exact = x.dtype == y.dtype
            jobs.append(_Job(len(out), x, y, Compare(options.atol, options.rtol, exact)))
        out.append(found or LeafDiff(name, "equal"))
    if options.structure_only:
        for job in jobs:
            x, y = job.a, job.b
            out[job.index] = LeafDiff(x.name, "equal", x.dtype, y.dtype, x.shape, y.shape)
        return tuple(out)
    total = sum(math.prod(j.a.shape) * _itemsize(j.a, j.b) for j in jobs)
    _stream(sa, sb, jobs, options.memory_limit, ByteProgress(on_progress, "data", total))
    for job in jobs:
        out[job.index] = _result(job)
    return tuple(out)


def _decided(x: Tensor, y: Tensor, compare_cast: bool) -> LeafDiff | None:
    """The result of a pair whose values need not be read; None when they must be."""
    if x.shape != y.shape:
        return LeafDiff(x.name, "shape_changed", x.dtype, y.dtype, x.shape, y.shape)
    if x.dtype != y.dtype and not compare_cast:
        return LeafDiff(
            x.name,
            "dtype_changed",
            x.dtype,
            y.dtype,
            x.shape,
            y.shape,
            message="values not compared (pass --compare-cast to compare them as float64)",
        )
    return None


def _result(job: _Job) -> LeafDiff:
    x, y, acc = job.a, job.b, job.acc
    common = (x.name, x.dtype, y.dtype, x.shape, y.shape)
    if job.error is not None:
        return LeafDiff(common[0], "error", *common[1:], message=job.error)
    return LeafDiff(
        common[0],
        "equal" if acc.mismatched == 0 else "different",
        *common[1:],
        elements=math.prod(x.shape),
        mismatched=acc.mismatched,
        max_abs=acc.max_abs,
        max_rel=acc.max_rel,
        message=f"compared as float64 ({x.dtype} vs {y.dtype})" if x.dtype != y.dtype else None,
    )


def _itemsize(x: Tensor, y: Tensor) -> int:
    from ckpt_cli.core.safetensors.dtypes import numpy_dtype

    return int(max(numpy_dtype(x.dtype).itemsize, numpy_dtype(y.dtype).itemsize))


def regions(t: Tensor, itemsize: int, block: int) -> Iterator[ops.Region]:
    """The boxes ``t`` is read and compared in, each about ``block`` bytes at most: whole
    chunks of A's source (in A's layout: a transposed leaf's chunks transposed), merged while
    they fit and a chunk larger than a block cut in slabs (``format.blocks.stream_blocks``),
    so each source chunk is decoded once; C-contiguous runs when A's values do not come from
    one chunked leaf (a split, a concat: the chunk cache holds what blocks share)."""
    from ckpt_cli.core.format.arrays import ArrayInfo
    from ckpt_cli.core.format.blocks import stream_blocks

    if t.shape and t.chunks is not None and len(t.chunks) == len(t.shape):
        yield from stream_blocks(ArrayInfo(t.dtype, t.shape, t.chunks, 3, None), block)
        return
    for start, shape in contiguous_blocks(t.shape, itemsize, block):
        yield tuple(slice(s, s + n) for s, n in zip(start, shape, strict=True))


def _stream(sa: Side, sb: Side, jobs: list[_Job], memory_limit: int, on_bytes: Any) -> None:
    """Block pairs of every job read ahead on both sides (``IN_FLIGHT`` pairs, ``held`` bytes a
    side), compared in order as they arrive."""
    block, held_limit = block_budget(memory_limit)
    pending: deque[tuple[_Job, Any, Any, int]] = deque()
    held = 0

    def consume() -> None:
        nonlocal held
        job, fa, fb, n = pending.popleft()
        held -= n
        if job.error is None:
            try:
                _add(job, sa.result(job.a.name, fa), sb.result(job.b.name, fb), block)
            except CkptError as e:
                job.error = e.message
            except Exception as e:
                job.error = first_line(e)
        on_bytes(n)

    for job in jobs:
        itemsize = _itemsize(job.a, job.b)
        for region in regions(job.a, itemsize, block):
            nbytes = math.prod(r.stop - r.start for r in region) * itemsize
            try:
                pending.append((job, sa.fetch(job.a.name, region), sb.fetch(job.b.name, region), nbytes))  # fmt: skip
            except CkptError as e:
                job.error = e.message
                break
            except Exception as e:
                job.error = first_line(e)
                break
            held += nbytes
            while pending and (len(pending) >= IN_FLIGHT or held > held_limit):
                consume()
    while pending:
        consume()


def _add(job: _Job, a: Any, b: Any, block: int) -> None:
    """Compare a pair of blocks ``block`` bytes at a time along the first axis (the float64
    temporaries of a comparison are a few times what it compares)."""
    if a.ndim == 0 or a.shape[0] <= 1 or a.nbytes <= block:
        job.acc.add(a, b)
        return
    rows = max(1, block // max(1, a.nbytes // a.shape[0]))
    for i in range(0, a.shape[0], rows):
        job.acc.add(a[i : i + rows], b[i : i + rows])
