"""Plan and run a reshard: rewrite an item so each device of a new mesh reads exactly its shard.

The plan gives every array leaf a target partition spec (from rules, or copied from another
checkpoint), a chunk shape equal to the per-device shard (split further under
``max_chunk_bytes``) and the ``NamedSharding`` to record. Nothing is written until the whole plan
is valid: a mesh axis that does not divide a dimension is reported first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore, cached_context, dtype_itemsize
from ckpt_cli.core.format.names import compile_filter
from ckpt_cli.core.format.sharding import MeshSpec, ShardingInfo, Spec, shard_shape, split_chunk
from ckpt_cli.core.inspect import ItemReport, Leaf
from ckpt_cli.core.write.types import ArrayOut, BlockSource, Compression, LeafOut
from ckpt_cli.errors import UsageError


@dataclass(frozen=True)
class Rule:
    pattern: str
    spec: Spec
    regex: re.Pattern[str]


def parse_spec(value: Any, where: str, mesh: MeshSpec) -> Spec:
    """``[null, model]``, ``[[data, model], null]``, ``[]`` (replicated) or ``null`` (replicated)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise UsageError(
            f"{where}: a partition spec is a list such as [null, model], got {value!r}"
        )
    out: list[Any] = []
    used: list[str] = []
    for dim in value:
        axes = [dim] if isinstance(dim, str) else dim if isinstance(dim, list) else None
        if dim is None:
            out.append(None)
            continue
        if axes is None or not all(isinstance(a, str) for a in axes):
            raise UsageError(f"{where}: {dim!r} is neither null, an axis name nor a list of them")
        for a in axes:
            if a not in mesh.axis_names:
                raise UsageError(
                    f"{where}: unknown mesh axis {a!r} (mesh axes: {', '.join(mesh.axis_names)})"
                )
            if a in used:
                raise UsageError(f"{where}: mesh axis {a!r} is used twice")
            used.append(a)
        out.append(dim if isinstance(dim, str) else tuple(axes))
    return tuple(out)


def parse_rules(doc: Any, mesh: MeshSpec, source: str) -> list[Rule]:
    """Rules from a mapping ``{pattern: spec}`` (YAML/JSON), in file order; first match wins."""
    if doc is None:
        return []
    if not isinstance(doc, dict):
        raise UsageError(f"{source}: expected a mapping of leaf patterns to partition specs")
    rules = []
    for pattern, value in doc.items():
        regex = compile_filter(str(pattern), f"{source}: rule")
        assert regex is not None
        # A rule names whole leaves: anchor it so `kernel` does not match `kernel_scale`.
        anchored = re.compile(f"(?:{regex.pattern})\\Z")
        rules.append(
            Rule(str(pattern), parse_spec(value, f"{source}: rule {pattern!r}", mesh), anchored)
        )
    return rules


@dataclass(frozen=True)
class ReadLeaf:
    """A worker's recipe for a resharded leaf: read the same region of the stored source leaf."""

    source: str
    source_zarr3: bool
    name: str
    info: ArrayInfo
    database: str
    splittable: bool = True

    def build(self, store: ItemStore) -> BlockSource:
        return store.reader(self.name, self.info, self.database).read


@dataclass(frozen=True)
class LeafPlan:
    leaf: Leaf
    spec: Spec | None  # None: not a jax.Array (no sharding recorded)
    sharding: ShardingInfo | None
    chunk_shape: tuple[int, ...]
    write_shape: tuple[int, ...]
    rule: str | None
    problem: str | None = None

    @property
    def nbytes(self) -> int:
        return self.leaf.size_bytes


@dataclass(frozen=True)
class ReshardPlan:
    leaves: tuple[LeafPlan, ...]
    unused_rules: tuple[str, ...]
    mesh: MeshSpec | None

    @property
    def problems(self) -> list[LeafPlan]:
        return [p for p in self.leaves if p.problem]

    @property
    def total_bytes(self) -> int:
        return sum(p.nbytes for p in self.leaves if p.leaf.is_array)


def plan_from_rules(
    report: ItemReport, mesh: MeshSpec, rules: list[Rule], max_chunk_bytes: int
) -> ReshardPlan:
    used: set[str] = set()
    plans = []
    for leaf in report.leaves:
        if not leaf.is_array or leaf.shape is None:
            plans.append(LeafPlan(leaf, None, None, (), (), None))
            continue
        rule = next((r for r in rules if r.regex.match(leaf.name)), None)
        spec: Spec = rule.spec if rule else ()
        if rule:
            used.add(rule.pattern)
        plans.append(_plan_leaf(leaf, spec, mesh, rule.pattern if rule else None, max_chunk_bytes))
    unused = tuple(r.pattern for r in rules if r.pattern not in used)
    return ReshardPlan(tuple(plans), unused, mesh)


def _plan_leaf(
    leaf: Leaf, spec: Spec, mesh: MeshSpec, rule: str | None, max_chunk_bytes: int
) -> LeafPlan:
    assert leaf.shape is not None and leaf.dtype is not None
    jax_array = leaf.value_type == "jax.Array"
    if not jax_array:
        # np.ndarray and scalars restore to host memory: no sharding, one chunk up to the limit.
        chunk = split_chunk(leaf.shape, dtype_itemsize(leaf.dtype), max_chunk_bytes)
        return LeafPlan(leaf, None, None, chunk, leaf.shape, rule)
    shard, problem = shard_shape(leaf.shape, spec, mesh)
    chunk = split_chunk(shard, dtype_itemsize(leaf.dtype), max_chunk_bytes)
    return LeafPlan(leaf, spec, mesh.sharding(spec), chunk, shard, rule, problem)


def plan_like(report: ItemReport, other: ItemReport, max_chunk_bytes: int) -> ReshardPlan:
    """Copy the chunking and sharding of ``other``'s leaves of the same name and shape."""
    theirs = {leaf.name: leaf for leaf in other.leaves}
    plans = []
    mesh: MeshSpec | None = None
    for leaf in report.leaves:
        if not leaf.is_array or leaf.shape is None:
            plans.append(LeafPlan(leaf, None, None, (), (), None))
            continue
        ref = theirs.get(leaf.name)
        if ref is None or ref.shape != leaf.shape or ref.chunk_shape is None:
            why = (
                "not in the --like checkpoint"
                if ref is None
                else f"has shape {list(ref.shape or ())} there"
            )
            plans.append(LeafPlan(leaf, None, None, leaf.chunk_shape or (), leaf.shape, None, why))
            continue
        s = ref.sharding
        if s is not None and s.mesh_shape is not None and s.axis_names is not None:
            mesh = mesh or MeshSpec(s.axis_names, s.mesh_shape)
        chunk = split_chunk(ref.chunk_shape, dtype_itemsize(leaf.dtype or "uint8"), max_chunk_bytes)
        plans.append(
            LeafPlan(
                leaf,
                s.partition_spec if s else None,
                s,
                chunk,
                ref.write_shape or ref.chunk_shape,
                "--like",
            )
        )
    return ReshardPlan(tuple(plans), (), mesh)


def reshard_leaves(
    report: ItemReport, plan: ReshardPlan, zarr3: bool, compression: Compression, memory_limit: int
) -> list[LeafOut]:
    """The output leaves of a plan, each array reading its values from the source item."""
    # Source chunks that straddle output blocks are decoded once, then served from the cache.
    store = ItemStore(
        report.ref.location, report.zarr_format == 3, cached_context(memory_limit // 8)
    )
    out = []
    for p in plan.leaves:
        leaf = p.leaf
        array = source = source_chunks = recipe = None
        if leaf.array is not None and leaf.dtype is not None and leaf.shape is not None:
            array = ArrayOut(leaf.dtype, leaf.shape, p.chunk_shape, zarr3, compression)
            source = store.reader(leaf.name, leaf.array, leaf.database).read
            source_chunks = leaf.array.chunk_shape
            recipe = ReadLeaf(
                str(report.ref.location),
                report.zarr_format == 3,
                leaf.name,
                leaf.array,
                leaf.database,
            )
        out.append(
            LeafOut(
                keypath=leaf.keypath,
                key_types=leaf.key_types,
                value_type=leaf.value_type,
                array=array,
                source=source,
                sharding=p.sharding,
                write_shape=p.write_shape if array is not None else None,
                ext_metadata={"random_key_impl": leaf.random_key_impl}
                if leaf.random_key_impl
                else None,
                string_value=leaf.value if leaf.value_type == "string" else None,
                source_chunks=source_chunks,
                plan=recipe,
            )
        )
    return out
