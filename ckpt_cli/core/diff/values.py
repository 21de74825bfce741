"""Two leaves compared: names, kinds, dtypes, shapes and layouts (``diff_structure``,
``sharding_changes``), then values, block pairs of both sides read in flight together and compared
(``Compare``: max absolute and relative difference, elements outside the tolerance, NaN equal at
the same place)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ckpt_cli.core.diff import (
    DIFF_BLOCK_BYTES,
    DIFF_IN_FLIGHT,
    DIFF_IN_FLIGHT_BYTES,
    LeafDiff,
    Status,
)
from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore, LeafReader
from ckpt_cli.core.format.blocks import (
    block_shape,
    is_large,
    iter_blocks,
    region_slabs,
    stream_blocks,
)
from ckpt_cli.core.format.scan import open_readers, read_block, streamed_slabs
from ckpt_cli.core.format.scan_acc import ScanTask
from ckpt_cli.core.inspect import Leaf
from ckpt_cli.errors import CkptError, first_line


def diff_structure(x: Leaf, y: Leaf) -> LeafDiff:
    """What the metadata alone says: kind, dtype, shape and sharding (no array data read)."""
    if x.problem or y.problem:
        return _result(x, y, "error", message=x.problem or y.problem)
    if x.is_array != y.is_array or (x.value_type != y.value_type and not x.is_array):
        return _result(x, y, "kind_changed", message=f"{x.value_type} vs {y.value_type}")
    if x.shape != y.shape:
        return _result(x, y, "shape_changed")
    if x.dtype != y.dtype:
        return _result(x, y, "dtype_changed")
    changes = sharding_changes(x, y)
    if changes:
        return _result(x, y, "sharding_changed", message="; ".join(changes))
    if not x.is_array and x.value != y.value:
        return _result(x, y, "different", message=_both_values(x, y))
    return _result(x, y, "equal", elements=x.elements)


def sharding_changes(x: Leaf, y: Leaf) -> list[str]:
    """How the layout of a leaf differs from A to B, one phrase per aspect: the device mesh
    (axis names and sizes), the partition spec (or the device of a single-device leaf), the
    chunk grid (chunks per dimension, and the chunk shape). Empty when laid out alike."""
    sx, sy = x.sharding, y.sharding
    out = []
    mesh_a, mesh_b = (s.mesh_str() if s else None for s in (sx, sy))
    if mesh_a != mesh_b:
        out.append(f"mesh {mesh_a or 'none'} -> {mesh_b or 'none'}")
    spec_a, spec_b = (s.short() if s else None for s in (sx, sy))
    if spec_a != spec_b:
        # A single-device leaf has no spec: its device is what changed.
        label = "spec" if mesh_a and mesh_b else "sharding"
        out.append(f"{label} {spec_a or 'none'} -> {spec_b or 'none'}")
    # A reshard for another mesh rechunks even where mesh and spec print alike (a replicated
    # leaf): the chunk grid is what readers of each device see.
    ca, cb = x.chunk_shape, y.chunk_shape
    if ca is not None and cb is not None and ca != cb and x.shape is not None:
        out.append(f"chunks {_grid(x.shape, ca)} -> {_grid(x.shape, cb)}")
    return out


def _grid(shape: tuple[int, ...], chunk: tuple[int, ...]) -> str:
    """``4x2 of [2,2]``: chunks per dimension, then the chunk shape."""
    grid = "x".join(str(-(-s // c) if c else 0) for s, c in zip(shape, chunk, strict=False))
    return f"{grid or '1'} of [{','.join(map(str, chunk))}]"


def _both_values(x: Leaf, y: Leaf) -> str:
    """The two sides of a differing JSON leaf (their JSON text), so a metric's change reads
    at a glance."""
    return f"{x.value} vs {y.value}"


def _result(x: Leaf, y: Leaf, status: Status, **extra: Any) -> LeafDiff:
    return LeafDiff(x.name, status, x.dtype, y.dtype, x.shape, y.shape, **extra)


def decided(x: Leaf, y: Leaf, compare_cast: bool) -> LeafDiff | None:
    """The result of a pair whose values need not be read; None when they must be compared."""
    if x.problem or y.problem:
        return _result(x, y, "error", message=x.problem or y.problem)
    if x.is_array != y.is_array or (not x.is_array and x.value_type != y.value_type):
        return _result(x, y, "kind_changed", message=f"{x.value_type} vs {y.value_type}")
    if not x.is_array:
        if x.value == y.value:
            return _result(x, y, "equal")
        return _result(x, y, "different", message=_both_values(x, y))
    if x.shape != y.shape:
        return _result(x, y, "shape_changed")
    if x.dtype != y.dtype and not compare_cast:
        return _result(
            x,
            y,
            "dtype_changed",
            message="values not compared (pass --compare-cast to compare them as float64)",
        )
    return None


@dataclass
class Job:
    """A pair of arrays whose values are compared: where its result goes, and how far it got."""

    index: int
    x: Leaf
    y: Leaf
    acc: Compare
    error: str | None = None
    streamed: bool = False  # compared slab by slab from streamed chunks (no whole decode)


def compared(job: Job) -> LeafDiff:
    x, y, acc = job.x, job.y, job.acc
    assert x.array is not None
    if job.error is not None:
        return _result(x, y, "error", message=job.error)
    status = "equal" if acc.mismatched == 0 else "different"
    note = f"compared as float64 ({x.dtype} vs {y.dtype})" if x.dtype != y.dtype else None
    return _result(
        x,
        y,
        status,
        elements=x.array.size,
        mismatched=acc.mismatched,
        max_abs=acc.max_abs,
        max_rel=acc.max_rel,
        message=note,
    )


def stream_jobs(
    sa: ItemStore,
    sb: ItemStore,
    jobs: list[Job],
    on_bytes: Callable[[int], None],
    budget: int = DIFF_BLOCK_BYTES,
    held_bytes: int = DIFF_IN_FLIGHT_BYTES,
    caches: tuple[int, int] = (0, 0),
) -> None:
    """Every pair's blocks in one pipeline: leaves opened ahead on both sides (one TensorStore
    context each, so an OCDBT tree is read once; its chunk cache holds the large chunks read in
    slabs), block reads of many leaves in flight (``DIFF_IN_FLIGHT`` pairs, ``held_bytes`` a
    side), compared in order as they arrive."""
    tasks_a = [ScanTask(j.x.name, j.x.array, j.x.database) for j in jobs if j.x.array]
    tasks_b = [ScanTask(j.y.name, j.y.array, j.y.database) for j in jobs if j.y.array]
    pending: deque[tuple[Job, Any, Any, int]] = deque()
    held = [0]

    def consume() -> None:
        job, fa, fb, n = pending.popleft()
        held[0] -= n
        if job.error is None:
            try:
                job.acc.add(fa.result(), fb.result())
            except Exception as e:
                job.error = first_line(e)
        on_bytes(n)

    pairs = zip(
        open_readers(sa, tasks_a, caches[0]), open_readers(sb, tasks_b, caches[1]), strict=True
    )
    for job, ((_, ra), (_, rb)) in zip(jobs, pairs, strict=True):
        x, y = job.x.array, job.y.array
        assert x is not None and y is not None
        if isinstance(ra, CkptError) or isinstance(rb, CkptError):
            job.error = (ra if isinstance(ra, CkptError) else rb).message  # type: ignore[union-attr]
            continue
        if _compare_streamed(job, ra, rb, budget, on_bytes):
            continue
        for sl in pair_blocks(x, y, budget):
            nbytes = math.prod(s.stop - s.start for s in sl) * x.itemsize
            try:
                pending.append((job, read_block(ra, sl), read_block(rb, sl), nbytes))
            except Exception as e:
                job.error = first_line(e)
                break
            held[0] += nbytes
            while pending and (len(pending) >= DIFF_IN_FLIGHT or held[0] > held_bytes):
                consume()
    while pending:
        consume()


def _compare_streamed(
    job: Job, ra: LeafReader, rb: LeafReader, budget: int, on_bytes: Callable[[int], None]
) -> bool:
    """Compare a pair whose chunks exceed the budget slab by slab, both sides streamed
    (``format.chunkstream``: memory does not follow the chunk size); False when either side
    cannot be streamed or the two are chunked differently (then TensorStore reads them)."""
    x, y = job.x.array, job.y.array
    assert x is not None and y is not None
    if (x.shape, x.chunk_shape, x.itemsize) != (y.shape, y.chunk_shape, y.itemsize):
        return False
    slabs_a = streamed_slabs(x, ra, budget)
    slabs_b = streamed_slabs(y, rb, budget) if slabs_a is not None else None
    if slabs_a is None or slabs_b is None:
        return False
    job.streamed = True
    try:
        for (_, a), (_, b) in zip(slabs_a, slabs_b, strict=True):
            job.acc.add(a, b)
            on_bytes(a.nbytes)
    except Exception as e:
        job.error = first_line(e)
    return True


# The blocks read of a pair of arrays, and the element-wise comparison applied to each pair.


def pair_blocks(a: ArrayInfo, b: ArrayInfo, budget: int) -> Any:
    """Blocks of at most ``budget`` bytes: slabs of A's chunks when one exceeds the budget,
    else whole chunks aligned to both chunkings when their common multiple stays small, else
    to A's."""
    if is_large(a, budget):
        return stream_blocks(a, budget)
    lcm = tuple(
        min(s, math.lcm(ca or 1, cb or 1))
        for s, ca, cb in zip(a.shape, a.chunk_shape, b.chunk_shape, strict=True)
    )
    if math.prod(lcm) * max(a.itemsize, b.itemsize) <= 4 * budget:
        return iter_blocks(a, block_shape(replace(a, chunk_shape=lcm), budget))
    return iter_blocks(a, block_shape(a, budget))


class Compare:
    """Running totals of one pair of arrays compared block by block: elements outside the
    tolerance, the largest absolute and relative difference."""

    def __init__(self, atol: float, rtol: float, exact_ints: bool) -> None:
        self.atol = atol
        self.rtol = rtol
        self.exact_ints = exact_ints
        self.mismatched = 0
        self.max_abs = 0.0
        self.max_rel = 0.0

    def add(self, a: Any, b: Any) -> None:
        import numpy as np

        a, b = np.asarray(a), np.asarray(b)
        if a.ndim == 0 and b.ndim == 0:
            a, b = a.reshape(1), b.reshape(1)  # so that a tile of them is an array too
        if a.shape != b.shape or not a.size:
            self._values(a, b)
            return
        # Equal bits are equal values (the same NaN too): most blocks of most diffs are
        # unchanged, and one integer comparison costs far less than the float64 pass.
        same = a.dtype == b.dtype and a.dtype.itemsize in (1, 2, 4, 8)
        bits = f"u{a.dtype.itemsize}" if same else None
        for tile in layout_tiles(a, b):
            x, y = a[tile], b[tile]
            if bits is not None and np.array_equal(x.view(bits), y.view(bits)):
                continue
            # The float64 temporaries of the value pass stay small whatever the block.
            for part in value_parts(x.shape):
                self._values(x[part], y[part])

    def _values(self, a: Any, b: Any) -> None:
        """Fold in one pair of (small) blocks whose bits differ: the float64 pass."""
        import numpy as np

        exact = self.exact_ints and a.dtype.kind in "iub" and not (self.atol or self.rtol)
        if exact:
            # Integers compare in their own dtype: float64 would round int64 beyond 2**53.
            neq = a != b
            self.mismatched += int(np.count_nonzero(neq))
            a, b = a[neq], b[neq]
        if a.dtype.kind == "c" or b.dtype.kind == "c":
            # Complex values differ in their imaginary parts too: compared as complex128, the
            # distance is |a - b|; NaN equals NaN part by part.
            af, bf = a.astype(np.complex128), b.astype(np.complex128)
            same = _same(af.real, bf.real) & _same(af.imag, bf.imag)
        else:
            af, bf = a.astype(np.float64), b.astype(np.float64)
            same = _same(af, bf)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            diff = np.where(same, 0.0, np.abs(af - bf))
            if not exact:
                ok = same | (diff <= self.atol + self.rtol * np.abs(bf))
                self.mismatched += int(np.count_nonzero(~ok))
            if not diff.size:
                return
            bad = ~np.isfinite(diff)  # NaN against a number, Inf against a finite value
            self.max_abs = max(self.max_abs, math.inf if bad.any() else float(diff.max()))
            # Equal values have no relative difference: a NaN or Inf on both sides would make
            # 0 / |b| NaN and hide the block's largest relative difference.
            rel = ~bad & ~same & (bf != 0)
            if rel.any():
                self.max_rel = max(self.max_rel, float((diff[rel] / np.abs(bf[rel])).max()))


#: Elements of one tile when the two blocks' layouts differ (a transposed view against a C-order
#: block), and its extent along A's contiguous axis: both sides' tiles stay in the CPU's caches.
#: One comparison over a whole 8 MiB float32 block took 7-8 ms, tiles of 512 x 64 2.8-3.0 ms
#: (a [4096, 512] band; tiles of 32 x 1024 or 256 x 128 took 4-10 ms).
LAYOUT_TILE_ELEMENTS = 1 << 15
LAYOUT_TILE_RUN = 512
#: Elements compared at once in the float64 pass (its temporaries: a few MiB at most).
VALUE_PART_ELEMENTS = 1 << 18


def _fast_axis(x: Any) -> int | None:
    """The axis along which ``x``'s elements are adjacent in memory (smallest stride among the
    axes longer than 1); None for fewer than two such axes."""
    axes = [d for d in range(x.ndim) if x.shape[d] > 1]
    if len(axes) < 2:
        return None
    return min(axes, key=lambda d: abs(x.strides[d]))


def layout_tiles(a: Any, b: Any) -> list[tuple[slice, ...]]:
    """Boxes covering two blocks of one shape: the whole block when their elements lie in the
    same order, else tiles of ``LAYOUT_TILE_RUN`` along A's contiguous axis by what fits
    ``LAYOUT_TILE_ELEMENTS`` along B's, so neither side is read a cache line per element."""
    import itertools

    whole = tuple(slice(0, n) for n in a.shape)
    p, q = _fast_axis(a), _fast_axis(b)
    if p is None or q is None or p == q:
        return [whole]
    rest = math.prod(n for d, n in enumerate(a.shape) if d not in (p, q))
    rows = LAYOUT_TILE_RUN
    cols = max(1, LAYOUT_TILE_ELEMENTS // (rows * rest))
    tiles = []
    for i, j in itertools.product(range(0, a.shape[p], rows), range(0, a.shape[q], cols)):
        box = list(whole)
        box[p], box[q] = slice(i, min(i + rows, a.shape[p])), slice(j, min(j + cols, a.shape[q]))
        tiles.append(tuple(box))
    return tiles


def value_parts(shape: tuple[int, ...]) -> list[tuple[slice, ...]]:
    """C-order slabs of ``shape`` of ``VALUE_PART_ELEMENTS`` elements at most (one row of the
    cut axis at least)."""
    if math.prod(shape) <= VALUE_PART_ELEMENTS:
        return [tuple(slice(0, n) for n in shape)]
    return region_slabs(tuple(slice(0, n) for n in shape), 1, VALUE_PART_ELEMENTS)


def _same(a: Any, b: Any) -> Any:
    import numpy as np

    return (a == b) | (np.isnan(a) & np.isnan(b))
