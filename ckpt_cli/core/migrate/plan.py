"""Plan a migration: apply a spec's rules, in order, to the leaves of a source item.

The plan is the list of destination leaves, each with the expression that computes its values
(``migrate_ops``), the source leaves it reads and the operations applied, plus the source leaves
that were dropped and the rules that matched nothing. Nothing is read or written here: every
impossible request (a collision, an impossible reshape, a float cast to int without rounding)
is a ``RefusedError`` naming the rule, the field and the leaf, before anything is written.

Optimizer state follows parameters (``migrate_tree``): a rule that changes a parameter changes
the optimizer leaves that mirror it the same way unless the rule says ``follow_optimizer: false``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.format.arrays import ItemStore, cached_context, dtype_itemsize
from ckpt_cli.core.format.sharding import ShardingInfo
from ckpt_cli.core.inspect import ItemReport, Leaf
from ckpt_cli.core.migrate import ops, rules
from ckpt_cli.core.migrate.layout import Layout, layout_for
from ckpt_cli.core.migrate.spec import MigrationSpec, Rule
from ckpt_cli.core.migrate.tree import Step, Work, fill_key_types, followers, key_types
from ckpt_cli.core.storage import Location
from ckpt_cli.core.write.types import ArrayOut, BlockSource, Compression, LeafOut
from ckpt_cli.errors import CkptError


@dataclass(frozen=True)
class DestLeaf:
    name: str
    keypath: tuple[str, ...]
    key_types: tuple[int, ...]
    value_type: str
    expr: ops.Node | None
    sources: tuple[str, ...]
    steps: tuple[Step, ...]
    layout: Layout | None
    string_value: str | None = None
    random_key_impl: str | None = None

    @property
    def changed(self) -> bool:
        return bool(self.steps)

    @property
    def size_bytes(self) -> int:
        if self.expr is None:
            return 0
        return math.prod(self.expr.shape) * dtype_itemsize(self.expr.dtype)


@dataclass(frozen=True)
class MigrationPlan:
    spec: MigrationSpec
    leaves: tuple[DestLeaf, ...]
    dropped: tuple[str, ...]
    unused_rules: tuple[str, ...]

    @property
    def total_bytes(self) -> int:
        return sum(leaf.size_bytes for leaf in self.leaves)

    @property
    def changed(self) -> list[DestLeaf]:
        return [leaf for leaf in self.leaves if leaf.changed]

    @property
    def untouched(self) -> list[DestLeaf]:
        return [leaf for leaf in self.leaves if not leaf.changed]

    def abstract(self) -> dict[str, tuple[tuple[int, ...] | None, str]]:
        """The destination leaves as --target sees them: name -> (shape, dtype)."""
        out: dict[str, tuple[tuple[int, ...] | None, str]] = {}
        for leaf in self.leaves:
            if leaf.expr is not None:
                out[leaf.name] = (leaf.expr.shape, leaf.expr.dtype)
            elif leaf.value_type == "string":
                out[leaf.name] = (None, "string")
        return out


def plan_migration(report: ItemReport, spec: MigrationSpec, max_chunk_bytes: int) -> MigrationPlan:
    work = [Work.from_leaf(leaf) for leaf in report.leaves]
    unused = []
    for rule in spec.rules:
        work, matched = _apply(rule, work)
        if not matched:
            unused.append(rule.label)
        rules.check_tree(rule, work)
    default = _default_sharding(report.leaves)
    sources = {leaf.name: leaf for leaf in report.leaves}
    kinds = fill_key_types(work)
    leaves = tuple(_freeze(w, kinds, default, sources, max_chunk_bytes) for w in work)
    reached = {s for leaf in leaves for s in leaf.sources}
    dropped = tuple(leaf.name for leaf in report.leaves if leaf.name not in reached)
    return MigrationPlan(spec, leaves, dropped, tuple(unused))


def _apply(rule: Rule, work: list[Work]) -> tuple[list[Work], bool]:
    if rule.op == "add":
        return rules.add(rule, work), True
    if rule.op == "concat":
        return rules.concat(rule, work)
    arrays_only = rule.op not in ("rename", "drop", "keep_only")
    direct = [w for w in work if (w.expr is not None or not arrays_only) and rule.selects(w.name)]
    if rule.op == "keep_only":
        keep = {id(w) for w in direct}
        return [w for w in work if id(w) in keep], bool(direct)
    follow = followers(rule, direct, work) if rule.follow_optimizer else {}
    changes: dict[int, list[Work]] = {}
    for w in direct:
        changes[id(w)] = rules.change(rule, w, None)
        for f in follow.get(id(w), []):
            changes[id(f)] = rules.follow_change(rule, w, f, changes[id(w)])
    out: list[Work] = []
    for w in work:
        out += changes.get(id(w), [w])
    rules.check_unique(rule, out)
    return out, bool(direct)


def _default_sharding(leaves: Iterable[Leaf]) -> ShardingInfo | None:
    """The sharding an added jax.Array records: replicated on the mesh the others use."""
    from dataclasses import replace

    for leaf in leaves:
        if leaf.value_type == "jax.Array" and leaf.sharding is not None:
            s = leaf.sharding
            return replace(s, partition_spec=()) if s.mesh_shape is not None else s
    return None


def _freeze(
    w: Work,
    kinds: dict[tuple[str, ...], int],
    default: ShardingInfo | None,
    sources: dict[str, Leaf],
    max_chunk_bytes: int,
) -> DestLeaf:
    layout = None
    if w.expr is not None:
        layout = layout_for(w.expr, w.value_type, w.leaf, default, sources, max_chunk_bytes)
    return DestLeaf(
        name=w.name,
        keypath=w.keypath,
        key_types=key_types(w, kinds),
        value_type=w.value_type,
        expr=w.expr,
        sources=w.sources,
        steps=tuple(w.steps),
        layout=layout,
        string_value=w.leaf.value if w.leaf is not None and w.value_type == "string" else None,
        random_key_impl=w.leaf.random_key_impl if w.leaf is not None else None,
    )


@dataclass(frozen=True)
class ComputeLeaf:
    """A worker's recipe for a migrated leaf: the expression (frozen dataclasses over source leaf
    names) and the ``module:function`` names its python rules call, imported on the worker."""

    source: str
    source_zarr3: bool
    expr: ops.Node
    functions: tuple[str, ...]

    @property
    def splittable(self) -> bool:
        return self.expr.streams

    def build(self, store: ItemStore) -> BlockSource:
        from ckpt_cli.core.migrate.target import import_function

        functions = {f: import_function(f, "migrate function") for f in self.functions}
        return _source(self.expr, ops.EvalContext(store, functions))


def migrate_leaves(
    report: ItemReport,
    plan: MigrationPlan,
    zarr3: bool,
    compression: Compression,
    memory_limit: int,
    functions: dict[str, Callable[..., Any]] | None = None,
) -> list[LeafOut]:
    """The output leaves of a plan, each array computing its regions from the source item."""
    # Source chunks that straddle output blocks are decoded once, then served from the cache.
    cache = cached_context(memory_limit // 8)
    store = ItemStore(report.ref.location, report.zarr_format == 3, cache)
    ctx = ops.EvalContext(store, functions or {})
    out = []
    for leaf in plan.leaves:
        array = source = recipe = None
        layout = leaf.layout
        if leaf.expr is not None and layout is not None:
            array = ArrayOut(
                leaf.expr.dtype, leaf.expr.shape, layout.chunk_shape, zarr3, compression
            )
            source = _source(leaf.expr, ctx)
            used = tuple(sorted(n.function for n in leaf.expr.walk() if isinstance(n, ops.Python)))
            recipe = ComputeLeaf(str(report.ref.location), report.zarr_format == 3, leaf.expr, used)
        out.append(
            LeafOut(
                keypath=leaf.keypath,
                key_types=leaf.key_types,
                value_type=leaf.value_type,
                array=array,
                source=source,
                sharding=layout.sharding if layout is not None else None,
                write_shape=layout.write_shape if layout is not None else None,
                ext_metadata={"random_key_impl": leaf.random_key_impl}
                if leaf.random_key_impl
                else None,
                string_value=leaf.string_value,
                source_chunks=ops.source_chunks(leaf.expr) if leaf.expr is not None else None,
                plan=recipe,
            )
        )
    return out


def _source(expr: ops.Node, ctx: ops.EvalContext) -> Callable[[ops.Region], Any]:
    whole = frozenset(id(n) for n in expr.walk() if n.whole)

    def read(region: ops.Region) -> Any:
        ctx.begin(whole)
        return expr.fetch(region, ctx)

    return read


def record_step_digests(step: Location) -> tuple[str, ...]:
    """Read the written step back once and record its digests (``ckpt verify --record``): the
    items recorded, none when verification found an error."""
    from ckpt_cli.core.verify.run import verify_path
    from ckpt_cli.core.verify.types import VerifyOptions

    report = verify_path(step, VerifyOptions(record=True))
    return report.recorded


def has_digests(item: Location) -> bool:
    from ckpt_cli.core.format.digests import read_digests

    try:
        return read_digests(item) is not None
    except CkptError:  # a damaged record is verify's business; migrate does not carry it
        return False
