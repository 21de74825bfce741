"""The values of a migrated leaf: an expression over source leaves, evaluated region by region.

Each node knows its shape and dtype and computes any region of its value from the regions of its
inputs that the region needs, so the writer can ask for output chunks one at a time:

  source, cast, resize, transpose, slice (split), concat, init (add), const (set)
      stream: a region costs the source regions it maps to (a resize reads the overlap with the
      source and fills the rest from the initialiser).
  reshape, python
      whole leaf: the first region materialises the node's whole value, later regions of the same
      destination leaf are served from it; it is dropped when the writer moves on to a leaf that
      does not use it. Memory: the node's input and output, one leaf at a time.

``fetch`` returns a TensorStore future, a numpy array, or a ``Pending`` whose ``result()``
finishes the computation: reads of many regions stay in flight together, as in ``reshard``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore
from ckpt_cli.core.format.dtypes import all_finite
from ckpt_cli.core.spec.initializers import Initializer, generate, numpy_dtype
from ckpt_cli.errors import RefusedError

Region = tuple[slice, ...]


class Pending:
    """Values not computed yet: waits on its inputs, then combines them."""

    def __init__(self, parts: Sequence[Any], combine: Callable[[list[Any]], Any]) -> None:
        self.parts = list(parts)
        self.combine = combine

    def result(self) -> Any:
        return self.combine([p.result() if hasattr(p, "result") else p for p in self.parts])


def then(value: Any, f: Callable[[Any], Any]) -> Any:
    """``f`` of a value, or of a future's value once it lands. A block decoded on the read pool
    (``arrays.LeafReader``) is a ``concurrent.futures.Future``: ``f`` (a cast, a transpose)
    then runs on that pool as soon as the block is there, not on the caller's thread when it
    asks, so the blocks in flight are cast at once."""
    from concurrent.futures import Future

    if isinstance(value, Future):
        return _chained(value, f)
    if hasattr(value, "result"):
        return Pending([value], lambda v: f(v[0]))
    return f(value)


def _chained(value: Any, f: Callable[[Any], Any]) -> Any:
    from concurrent.futures import Future

    from ckpt_cli.core.threads import read_pool

    out: Future[Any] = Future()

    def run(done: Future[Any]) -> None:
        try:
            out.set_result(f(done.result()))
        except BaseException as e:
            out.set_exception(e)

    def schedule(done: Future[Any]) -> None:
        try:
            read_pool().submit(run, done)
        except RuntimeError:  # the interpreter is exiting (Ctrl-C): nobody waits for the block
            out.cancel()

    # Submitted once the read is done: no task of the pool ever waits on another. Neither
    # closure holds ``value``: a reference cycle through its callbacks would keep every block
    # read alive until the garbage collector ran (gigabytes on a large migrate).
    value.add_done_callback(schedule)
    return out


def resolve(value: Any) -> Any:
    import numpy as np

    return np.asarray(value.result() if hasattr(value, "result") else value)


def full_region(shape: tuple[int, ...]) -> Region:
    return tuple(slice(0, n) for n in shape)


class EvalContext:
    """What evaluation needs at write time: the source arrays, the held whole leaves, functions."""

    def __init__(self, store: ItemStore, functions: dict[str, Callable[..., Any]]) -> None:
        self.store = store
        self.functions = functions
        self.readers: dict[str, Any] = {}
        self.held: dict[int, Any] = {}
        self.keep: frozenset[int] = frozenset()

    def reader(self, name: str, info: ArrayInfo, database: str) -> Any:
        if name not in self.readers:
            self.readers[name] = self.store.reader(name, info, database)
        return self.readers[name]

    def begin(self, whole_nodes: frozenset[int]) -> None:
        """The writer is on a leaf that uses ``whole_nodes``: drop every other held value."""
        if whole_nodes != self.keep:
            self.held = {k: v for k, v in self.held.items() if k in whole_nodes}
            self.keep = whole_nodes


@dataclass(frozen=True, eq=False)
class Node:
    shape: tuple[int, ...]
    dtype: str
    #: Whether every block ``fetch`` gives is an array that nothing else holds or changes
    #: afterwards, so a writer may hand it to TensorStore without a copy (``fresh_blocks``);
    #: None: as its inputs' blocks are (it hands them on, or copies them).
    fresh: ClassVar[bool | None] = False

    @property
    def inputs(self) -> tuple[Node, ...]:
        return ()

    @property
    def whole(self) -> bool:
        """Whether computing any region needs this node's whole value."""
        return False

    def fetch(self, region: Region, ctx: EvalContext) -> Any:
        raise NotImplementedError

    def walk(self) -> list[Node]:
        out: list[Node] = [self]
        for node in self.inputs:
            out += node.walk()
        return out

    @property
    def streams(self) -> bool:
        return not any(n.whole for n in self.walk())


@dataclass(frozen=True, eq=False)
class Source(Node):
    fresh = True  # decoded into a new array, or TensorStore's own result
    name: str
    info: ArrayInfo
    database: str

    def fetch(self, region: Region, ctx: EvalContext) -> Any:
        return ctx.reader(self.name, self.info, self.database).read(region)


def source_reads(exprs: Mapping[str, Node | None]) -> dict[str, Source]:
    """Output name -> the source leaf it reads unchanged (a plain read: no cast, slice, ...)."""
    return {name: e for name, e in exprs.items() if isinstance(e, Source)}


@dataclass(frozen=True, eq=False)
class Init(Node):
    fresh = True
    init: Initializer
    key_name: str  # the leaf name that keys the random values

    def fetch(self, region: Region, ctx: EvalContext) -> Any:
        return generate(self.init, self.key_name, self.shape, self.dtype, region)


@dataclass(frozen=True, eq=False)
class Const(Node):
    fresh = True
    value: float | int | bool

    def fetch(self, region: Region, ctx: EvalContext) -> Any:
        import numpy as np

        return np.full([s.stop - s.start for s in region], self.value, numpy_dtype(self.dtype))


@dataclass(frozen=True, eq=False)
class Unary(Node):
    inner: Node

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.inner,)


@dataclass(frozen=True, eq=False)
class Cast(Unary):
    fresh = True  # ``astype`` copies
    rounding: str | None
    label: str  # "rule 3 (cast)", for errors found in the data
    leaf: str

    def fetch(self, region: Region, ctx: EvalContext) -> Any:
        return then(self.inner.fetch(region, ctx), self._cast)

    def _cast(self, values: Any) -> Any:
        import numpy as np

        x = np.asarray(values)
        target = numpy_dtype(self.dtype)
        if is_integer(self.dtype) and is_float(self.inner.dtype):
            if not np.isfinite(x).all():
                raise self._refuse("NaN or infinite values cannot become integers")
            x = {"nearest": np.rint, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc}[
                self.rounding or "nearest"
            ](x.astype(np.float64))
        if is_integer(self.dtype) and x.size:
            info = np.iinfo(target)
            lo, hi = x.min(), x.max()
            if lo < info.min or hi > info.max:
                raise self._refuse(f"values {lo}..{hi} do not fit {self.dtype}")
        with np.errstate(over="ignore", invalid="ignore"):
            out = x.astype(target)
        if is_float(self.dtype) and is_float(self.inner.dtype) and not all_finite(out):
            overflow = ~np.isfinite(out) & np.isfinite(x)  # NaN/Inf carried over are no overflow
            if overflow.any():
                worst = float(np.abs(x[overflow].astype(np.float64)).max())
                raise self._refuse(f"{worst:g} is beyond the range of {self.dtype}")
        return out

    def _refuse(self, why: str) -> RefusedError:
        return RefusedError(
            f"{self.label}: cannot cast leaf {self.leaf!r} to {self.dtype}: {why}; nothing written",
            hint="exclude the leaf from the cast or choose a wider dtype",
        )


@dataclass(frozen=True, eq=False)
class Resize(Unary):
    fresh = None
    init: Initializer | None
    key_name: str

    def fetch(self, region: Region, ctx: EvalContext) -> Any:
        import numpy as np

        src = self.inner.shape
        overlap = tuple(slice(s.start, min(s.stop, n)) for s, n in zip(region, src, strict=True))
        inside = all(o.stop > o.start for o in overlap)
        if inside and overlap == region:
            return self.inner.fetch(region, ctx)
        assert self.init is not None  # the plan refuses a growing resize without init
        out = np.empty([s.stop - s.start for s in region], numpy_dtype(self.dtype))
        # Only the new elements are generated: the slabs of the region beyond the source.
        for box in outside(region, src):
            values = generate(self.init, self.key_name, self.shape, self.dtype, box)
            out[_local(box, region)] = values
        if not inside:
            return out

        def place(values: list[Any]) -> Any:
            out[_local(overlap, region)] = np.asarray(values[0])
            return out

        return Pending([self.inner.fetch(overlap, ctx)], place)


def outside(region: Region, shape: tuple[int, ...]) -> list[Region]:
    """Disjoint boxes covering the part of ``region`` outside the box ``[0, shape)``."""
    boxes, inner = [], list(region)
    for d, n in enumerate(shape):
        s = inner[d]
        if s.stop > n:
            box = list(inner)
            box[d] = slice(max(s.start, n), s.stop)
            boxes.append(tuple(box))
            inner[d] = slice(s.start, min(s.stop, n))
            if inner[d].start >= inner[d].stop:
                break
    return boxes


def _local(box: Region, region: Region) -> Region:
    return tuple(
        slice(b.start - r.start, b.stop - r.start) for b, r in zip(box, region, strict=True)
    )


@dataclass(frozen=True, eq=False)
class Transpose(Unary):
    fresh = None
    axes: tuple[int, ...]

    def fetch(self, region: Region, ctx: EvalContext) -> Any:
        import numpy as np

        # Output axis i is input axis axes[i]: the input region is the output region permuted.
        src_region = [slice(0, 0)] * len(self.axes)
        for i, a in enumerate(self.axes):
            src_region[a] = region[i]
        return then(
            self.inner.fetch(tuple(src_region), ctx),
            lambda v: np.ascontiguousarray(np.transpose(np.asarray(v), self.axes)),
        )


@dataclass(frozen=True, eq=False)
class Slice(Unary):
    fresh = None
    axis: int
    start: int

    def fetch(self, region: Region, ctx: EvalContext) -> Any:
        s = region[self.axis]
        moved = list(region)
        moved[self.axis] = slice(s.start + self.start, s.stop + self.start)
        return self.inner.fetch(tuple(moved), ctx)


@dataclass(frozen=True, eq=False)
class Concat(Node):
    fresh = None
    parts: tuple[Node, ...]
    axis: int

    @property
    def inputs(self) -> tuple[Node, ...]:
        return self.parts

    def fetch(self, region: Region, ctx: EvalContext) -> Any:
        import numpy as np

        s = region[self.axis]
        pieces = []
        offset = 0
        for part in self.parts:
            n = part.shape[self.axis]
            lo, hi = max(s.start, offset), min(s.stop, offset + n)
            if lo < hi:
                sub = list(region)
                sub[self.axis] = slice(lo - offset, hi - offset)
                pieces.append(then(part.fetch(tuple(sub), ctx), _as_dtype(self.dtype)))
            offset += n
        if len(pieces) == 1:
            return pieces[0]
        return Pending(pieces, lambda vs: np.concatenate(vs, axis=self.axis))


def _as_dtype(dtype: str) -> Callable[[Any], Any]:
    import numpy as np

    target = numpy_dtype(dtype)
    return lambda v: np.asarray(v).astype(target, copy=False)


@dataclass(frozen=True, eq=False)
class Whole(Unary):
    """Base of the nodes that compute their whole value at once (held while the leaf is written)."""

    fresh = True  # each block a copy out of the held value

    @property
    def whole(self) -> bool:
        return True

    def compute(self, values: Any, ctx: EvalContext) -> Any:
        raise NotImplementedError

    def fetch(self, region: Region, ctx: EvalContext) -> Any:
        import numpy as np

        key = id(self)
        if key not in ctx.held:
            values = resolve(self.inner.fetch(full_region(self.inner.shape), ctx))
            ctx.held[key] = self.compute(values, ctx)
        # A copy: a view would keep the whole value alive while its block waits to be written.
        return np.array(ctx.held[key][region], copy=True)


@dataclass(frozen=True, eq=False)
class Reshape(Whole):
    def compute(self, values: Any, ctx: EvalContext) -> Any:
        return values.reshape(self.shape)


@dataclass(frozen=True, eq=False)
class Python(Whole):
    function: str
    label: str
    leaf: str

    def compute(self, values: Any, ctx: EvalContext) -> Any:
        import numpy as np

        fn = ctx.functions[self.function]
        try:
            out = np.asarray(fn(values, self.leaf))
        except Exception as e:
            raise RefusedError(
                f"{self.label}: {self.function} failed on leaf {self.leaf!r}: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; nothing written"
            ) from None
        if out.shape != self.shape:
            raise RefusedError(
                f"{self.label}: {self.function} returned shape {list(out.shape)} for leaf "
                f"{self.leaf!r}, the rule declares {list(self.shape)}; nothing written",
                hint="declare the output with the rule's shape field",
            )
        return out.astype(numpy_dtype(self.dtype), copy=False)


def fresh_blocks(expr: Node) -> bool:
    """Whether every block ``expr.fetch`` gives is its own (``Node.fresh``, through the nodes
    that hand their inputs' blocks on): TensorStore may then encode from it without a copy."""
    if expr.fresh is None:
        return all(fresh_blocks(n) for n in expr.inputs)
    return expr.fresh


def source_chunks(expr: Node) -> tuple[int, ...] | None:
    """The source chunking a node's regions line up with (for blocks that decode each stored
    chunk once), when its values come from one source leaf without an offset."""
    if isinstance(expr, Source):
        return expr.info.chunk_shape
    if isinstance(expr, (Cast, Resize)):
        return source_chunks(expr.inner)
    if isinstance(expr, Transpose):
        inner = source_chunks(expr.inner)
        return None if inner is None else tuple(inner[a] for a in expr.axes)
    return None


def is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def is_integer(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))
