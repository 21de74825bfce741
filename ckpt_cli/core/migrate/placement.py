"""Where a migrated leaf's bytes go: its chunk shape, write shape and recorded sharding.

An untouched leaf keeps its source chunking and sharding. A changed ``jax.Array`` keeps the
partition spec of the leaf it comes from (permuted by a transpose; dropped by a reshape, an added
leaf or a set) when the spec still divides the new shape, and is recorded replicated on the same
mesh otherwise. Chunks are the per-device shard, split into equal chunks no larger than
``--max-chunk-bytes`` as ``reshard`` does, so the writer never holds a block larger than that.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ckpt_cli.core.format.dtypes import dtype_itemsize
from ckpt_cli.core.format.sharding import MeshSpec, ShardingInfo, Spec, shard_shape, split_chunk
from ckpt_cli.core.inspect import Leaf
from ckpt_cli.core.spec import ops


@dataclass(frozen=True)
class Layout:
    chunk_shape: tuple[int, ...]
    write_shape: tuple[int, ...]
    sharding: ShardingInfo | None
    note: str | None = None


def layout_for(
    expr: ops.Node,
    value_type: str,
    leaf: Leaf | None,
    default: ShardingInfo | None,
    sources: dict[str, Leaf],
    max_chunk_bytes: int,
) -> Layout:
    itemsize = dtype_itemsize(expr.dtype)
    shape = expr.shape
    if value_type != "jax.Array":
        return Layout(split_chunk(shape, itemsize, max_chunk_bytes), shape, None)
    if (
        isinstance(expr, ops.Source)
        and leaf is not None
        and leaf.shape == shape
        and leaf.chunk_shape is not None
    ):
        chunk = split_chunk(leaf.chunk_shape, itemsize, max_chunk_bytes)
        return Layout(chunk, leaf.write_shape or leaf.chunk_shape, leaf.sharding)
    base = leaf.sharding if leaf is not None and leaf.sharding is not None else default
    if base is None or base.mesh_shape is None or base.axis_names is None:
        return Layout(split_chunk(shape, itemsize, max_chunk_bytes), shape, base)
    mesh = MeshSpec(base.axis_names, base.mesh_shape)
    spec = derive_spec(expr, sources) or ()
    shard, problem = shard_shape(shape, spec, mesh)
    note = None
    if problem:
        note = f"partition spec {_spec_text(spec)} no longer divides the shape ({problem}): recorded replicated"
        spec, shard = (), shape
    sharding = replace(base, partition_spec=spec)
    return Layout(split_chunk(shard, itemsize, max_chunk_bytes), shard, sharding, note)


def derive_spec(expr: ops.Node, sources: dict[str, Leaf]) -> Spec | None:
    """The partition spec a computed value inherits from the source it comes from."""
    if isinstance(expr, ops.Source):
        leaf = sources.get(expr.name)
        s = leaf.sharding if leaf is not None else None
        return s.partition_spec if s is not None and s.mesh_shape is not None else None
    if isinstance(expr, ops.Transpose):
        inner = derive_spec(expr.inner, sources)
        if inner is None:
            return None
        padded = tuple(inner) + (None,) * (len(expr.axes) - len(inner))
        return tuple(padded[a] for a in expr.axes)
    if isinstance(expr, ops.Concat):
        return derive_spec(expr.parts[0], sources)
    if isinstance(expr, (ops.Cast, ops.Resize, ops.Slice)):
        return derive_spec(expr.inner, sources)
    if isinstance(expr, ops.Python) and len(expr.shape) == len(expr.inner.shape):
        return derive_spec(expr.inner, sources)
    return None  # reshape, init, const: nothing to inherit


def _spec_text(spec: Spec) -> str:
    return "P(" + ", ".join(str(p) for p in spec) + ")"
