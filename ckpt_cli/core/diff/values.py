"""Two leaves compared: names, kinds, dtypes, shapes and layouts (``diff_structure``,
``sharding_changes``), then values, block pairs of both sides read in flight together and compared
(``compare.Compare``: max absolute and relative difference, elements outside the tolerance, the
NaN and Inf of each side, NaN equal at the same place)."""

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
    NonFiniteCounts,
    Status,
)
from ckpt_cli.core.diff.compare import Compare as Compare  # safetensors.parity imports it here
from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore, LeafReader
from ckpt_cli.core.format.blocks import block_shape, is_large, iter_blocks, stream_blocks
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
        counts = _json_counts(x, y)
        if x.value == y.value:
            return _result(x, y, "equal", nonfinite=counts, message=counts and counts.phrase())
        return _result(x, y, "different", message=_both_values(x, y), nonfinite=counts)
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


#: A JSON value's text (``Leaf.value``) that is NaN or Inf: what Python's ``json`` writes, as
#: Orbax's JsonCheckpointHandler does for a NaN metric (``{"loss": NaN}``).
_JSON_NONFINITE = {"NaN": "nan", "Infinity": "inf", "-Infinity": "inf"}


def _json_counts(x: Leaf, y: Leaf) -> NonFiniteCounts | None:
    """A JSON leaf's NaN or Inf on each side (a diverged run's metric); None for other
    leaves that are not arrays."""
    if x.value_type != "json":
        return None
    a, b = (_JSON_NONFINITE.get(v.value or "") for v in (x, y))
    flags = (a == "nan", a == "inf", b == "nan", b == "inf", a == b == "nan")
    return NonFiniteCounts(*(int(f) for f in flags))


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
    return _result(x, y, **value_fields(acc, x.array.size, x.dtype, y.dtype))


def value_fields(
    acc: Compare, elements: int, dtype_a: str | None, dtype_b: str | None
) -> dict[str, Any]:
    """What a pair of arrays whose values were compared says (``LeafDiff``'s fields but its
    name, dtypes and shapes): the status, the figures, the NaN and Inf, and the note."""
    counts = acc.counts()
    notes = [f"compared as float64 ({dtype_a} vs {dtype_b})"] if dtype_a != dtype_b else []
    notes += [p for p in (counts.phrase(),) if p]
    return {
        "status": "equal" if acc.mismatched == 0 else "different",
        "elements": elements,
        "mismatched": acc.mismatched,
        "max_abs": acc.max_abs,
        "max_rel": acc.max_rel,
        "nonfinite": counts,
        "message": "; ".join(notes) or None,
    }


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


# The blocks read of a pair of arrays (``compare.Compare`` compares each pair).


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
