"""Plan and run a reshard: rewrite an item so each device of a new mesh reads exactly its shard.

``plan_reshard`` returns a frozen ``ReshardPlan`` (``to_json`` is what ``--dry-run --json``
prints); ``execute`` writes it.

The plan gives every array leaf a target partition spec (from rules, or copied from another
checkpoint), a chunk shape equal to the per-device shard (split further under
``max_chunk_bytes``) and the ``NamedSharding`` to record. Nothing is written until the whole plan
is valid: a mesh axis that does not divide a dimension is reported first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypedDict

from ckpt_cli.core.format.discovery import ItemRef
from ckpt_cli.core.format.dtypes import dtype_itemsize
from ckpt_cli.core.format.names import unsafe_as_path
from ckpt_cli.core.format.resolve import resolve_item, resolve_trees
from ckpt_cli.core.format.sharding import (
    MeshSpec,
    PartitionSpecJSON,
    Shape,
    ShardingInfo,
    Spec,
    shard_shape,
    split_chunk,
)
from ckpt_cli.core.inspect import ItemReport, Leaf
from ckpt_cli.core.inspect.item import inspect_item
from ckpt_cli.core.reshard.rules import Rule, inline_rule, load_rules, parse_rules
from ckpt_cli.core.state import item_keypath, mirrored, parameter_index
from ckpt_cli.core.storage import Location, StorageOptions, open_location
from ckpt_cli.core.write.memory import bound_allocator
from ckpt_cli.core.write.rewrite import WrittenJSON, check_new_step
from ckpt_cli.core.write.types import WriteOptions
from ckpt_cli.errors import NotFoundError, RefusedError, UsageError


class ReshardLeafJSON(TypedDict):
    name: str
    dtype: str | None
    shape: Shape | None
    old_chunk_shape: Shape | None
    new_chunk_shape: Shape | None
    partition_spec: PartitionSpecJSON | None
    rule: str | None
    follows: str | None  # the parameter an optimizer moment takes its sharding from (v2)
    size_bytes: int
    problem: str | None


class ReshardItemJSON(TypedDict):
    """One item of the step, resharded (v3)."""

    item: str
    total_bytes: int
    leaves: list[ReshardLeafJSON]


class ReshardPlanJSON(TypedDict):
    """The plan alone, as ``--dry-run`` prints it: ``leaves`` of every item resharded, and
    each item's own in ``items``."""

    schema_version: int
    ok: bool
    mesh: dict[str, int] | None
    total_bytes: int
    unused_rules: list[str]
    leaves: list[ReshardLeafJSON]
    items: list[ReshardItemJSON]


class ReshardJSON(ReshardPlanJSON, WrittenJSON):
    """``ckpt reshard --json``: the plan per leaf, and what was written (not with --dry-run)."""


@dataclass(frozen=True)
class LeafPlan:
    leaf: Leaf
    spec: Spec | None  # None: not a jax.Array (no sharding recorded)
    sharding: ShardingInfo | None
    chunk_shape: tuple[int, ...]
    write_shape: tuple[int, ...]
    rule: str | None
    problem: str | None = None
    #: The parameter an optimizer leaf (Adam ``mu``/``nu``) took its sharding from, no rule
    #: naming it.
    follows: str | None = None

    @property
    def nbytes(self) -> int:
        return self.leaf.size_bytes

    def to_json(self) -> ReshardLeafJSON:
        leaf = self.leaf
        return {
            "name": leaf.name,
            "dtype": leaf.dtype,
            "shape": None if leaf.shape is None else list(leaf.shape),
            "old_chunk_shape": None if leaf.chunk_shape is None else list(leaf.chunk_shape),
            "new_chunk_shape": list(self.chunk_shape) if leaf.is_array else None,
            "partition_spec": None
            if self.spec is None
            else [list(x) if isinstance(x, tuple) else x for x in self.spec],
            "rule": self.rule,
            "follows": self.follows,
            "size_bytes": leaf.size_bytes,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class ReshardLayout:
    """The target layout of every leaf, and the rules that matched none."""

    leaves: tuple[LeafPlan, ...]
    unused_rules: tuple[str, ...]
    mesh: MeshSpec | None

    @property
    def problems(self) -> list[LeafPlan]:
        return [p for p in self.leaves if p.problem]

    @property
    def total_bytes(self) -> int:
        return sum(p.nbytes for p in self.leaves if p.leaf.is_array)


@dataclass(frozen=True)
class ReshardItem:
    """One item of the step to reshard: its source, what inspect read, its target layout."""

    source: ItemRef
    report: ItemReport
    layout: ReshardLayout

    def to_json(self) -> ReshardItemJSON:
        return {
            "item": self.source.name,
            "total_bytes": self.layout.total_bytes,
            "leaves": [p.to_json() for p in self.layout.leaves],
        }


@dataclass(frozen=True)
class ReshardPlan:
    """A reshard to carry out (``execute``): the source item, its target layout, where the new
    step goes and how it is written; ``more``: the step's other items resharded with it (no
    ``--item`` on a step of several PyTree items). Nothing has been written when a plan
    exists."""

    source: ItemRef
    report: ItemReport
    layout: ReshardLayout
    destination: Location
    write: WriteOptions
    zarr3: bool  # the output zarr version (``write.zarr3``, else the source's)
    operation: dict[str, Any]  # recorded in the new step's ckpt_history
    more: tuple[ReshardItem, ...] = ()

    kind = "reshard"
    #: 2: ``follows`` per leaf (optimizer moments that take their parameter's sharding).
    #: 3: ``items``, every item of the step resharded (``items`` written).
    #: 4: ``scale.split`` and ``scale.reason`` (a scaled-out run that stays in one process).
    #: 5: ``unchecked_digests``, leaves whose version-1 digest was carried unchecked.
    SCHEMA_VERSION: ClassVar[int] = 5

    @property
    def items(self) -> tuple[ReshardItem, ...]:
        return (ReshardItem(self.source, self.report, self.layout), *self.more)

    @property
    def leaves(self) -> tuple[LeafPlan, ...]:
        return tuple(p for item in self.items for p in item.layout.leaves)

    @property
    def total_bytes(self) -> int:
        return sum(item.layout.total_bytes for item in self.items)

    @property
    def refusal(self) -> RefusedError | None:
        """Why this plan cannot be written (leaves the target layout does not fit), or None."""
        several = len(self.items) > 1
        problems = [(item.source.name, p) for item in self.items for p in item.layout.problems]
        if not problems:
            return None
        item, first = problems[0]
        where = f"item {item}: " if several else ""
        return RefusedError(
            f"{len(problems)} leaves cannot take the target layout, nothing written; "
            f"{where}{first.leaf.name}: {first.problem}",
            hint="change their rule or the mesh; --dry-run lists every leaf",
        )

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(f"rule {pattern!r} matched no leaf" for pattern in self.layout.unused_rules)

    def to_json(self) -> ReshardPlanJSON:
        """The plan per leaf, as ``ckpt reshard --dry-run --json`` prints it."""
        mesh = self.layout.mesh
        return {
            "schema_version": self.SCHEMA_VERSION,
            "ok": True,
            "mesh": dict(zip(mesh.axis_names, mesh.shape, strict=True)) if mesh else None,
            "total_bytes": self.total_bytes,
            "unused_rules": list(self.layout.unused_rules),
            "leaves": [p.to_json() for p in self.leaves],
            "items": [item.to_json() for item in self.items],
        }

    def written_json(self, written: WrittenJSON) -> ReshardJSON:
        return {**self.to_json(), **written}


def plan_reshard(
    source: str | os.PathLike[str] | Location,
    destination: str | os.PathLike[str] | Location,
    *,
    mesh: str | MeshSpec | None = None,
    rules_file: str | None = None,
    rules: Sequence[str] | Mapping[str, Any] = (),
    like: str | os.PathLike[str] | Location | None = None,
    step: int | None = None,
    item: str | None = None,
    write: WriteOptions | None = None,
    storage: StorageOptions | None = None,
) -> ReshardPlan:
    """Plan rewriting ``source`` (a root, step or item) into the root ``destination`` for a new
    mesh: partition specs from ``rules_file`` (YAML/JSON mapping of leaf patterns to specs) then
    ``rules`` (``"PATTERN=SPEC"`` strings or a mapping), first match wins and unmatched leaves
    are replicated, optimizer moments following their parameter unless a rule names them; or the
    layout of the checkpoint ``like``. Reads metadata only."""
    if like is not None and (mesh or rules_file or rules):
        raise UsageError(
            "--like copies another checkpoint's layout; do not combine it with --mesh/--rules/--rule"
        )
    if like is None and mesh is None:
        raise UsageError(
            "say where to reshard to: --mesh NAME=SIZE,... (with --rules/--rule) or --like OTHER"
        )
    write = write or WriteOptions()
    bound_allocator()
    refs = resolve_trees(_open(source, storage), step, item)
    dest = _open(destination, storage)
    check_new_step(dest, refs[0])  # refused before any plan is shown
    items = _plan_items(
        refs,
        mesh,
        rules_file,
        rules,
        None if like is None else _open(like, storage),
        write,
    )
    ref, report, layout = items[0].source, items[0].report, items[0].layout
    mesh_text = (
        ",".join(f"{n}={k}" for n, k in zip(mesh.axis_names, mesh.shape, strict=True))
        if isinstance(mesh, MeshSpec)
        else mesh
    )
    return ReshardPlan(
        source=ref,
        report=report,
        layout=layout,
        destination=dest,
        write=write,
        zarr3=report.zarr_format == 3 if write.zarr3 is None else write.zarr3,
        operation={
            "operation": "reshard",
            "mesh": mesh_text,
            "like": _text(like),
            "rules": rules_file,
        },
        more=tuple(items[1:]),
    )


def _plan_items(
    refs: list[ItemRef],
    mesh: str | MeshSpec | None,
    rules_file: str | None,
    rules: Sequence[str] | Mapping[str, Any],
    like: Location | None,
    write: WriteOptions,
) -> list[ReshardItem]:
    """Each item's target layout: from the mesh and rules (the same for every item, a moment
    following its parameter across items), or from the same-named item of ``like``."""
    reports = [(ref, inspect_item(ref)) for ref in refs]
    if like is not None:
        layouts = [
            plan_like(report, inspect_item(_like_item(like, ref.name)), write.max_chunk_bytes)
            for ref, report in reports
        ]
    else:
        assert mesh is not None
        target = mesh if isinstance(mesh, MeshSpec) else MeshSpec.parse(mesh)
        rule_list = _rules(target, rules_file, rules)
        named = [(ref.name if len(reports) > 1 else None, r) for ref, r in reports]
        layouts = plan_items_from_rules(named, target, rule_list, write.max_chunk_bytes)
    if not write.ocdbt:
        layouts = [_without_unsafe_paths(layout) for layout in layouts]
    return [ReshardItem(ref, r, lay) for (ref, r), lay in zip(reports, layouts, strict=True)]


def _rules(
    target: MeshSpec, rules_file: str | None, rules: Sequence[str] | Mapping[str, Any]
) -> list[Rule]:
    """The partition rules in the order they are tried: the file's, then the given ones."""
    rule_list = parse_rules(load_rules(rules_file), target, rules_file) if rules_file else []
    if isinstance(rules, Mapping):
        rule_list += parse_rules(dict(rules), target, "rules")
    else:
        for text in rules:
            rule_list += parse_rules(inline_rule(text), target, f"--rule {text!r}")
    return rule_list


def _like_item(like: Location, name: str) -> ItemRef:
    """The item of ``--like`` to copy the layout of: the one named as the source item (``-i
    state`` picks ``state`` on both sides), else its own state item."""
    try:
        return resolve_item(like, None, name)
    except (NotFoundError, UsageError):
        return resolve_item(like)


def _without_unsafe_paths(layout: ReshardLayout) -> ReshardLayout:
    """Without OCDBT every array is a directory named after its leaf: refuse the leaves whose
    dict keys cannot be one (``..``), as Orbax does, instead of writing outside the item."""
    leaves = []
    for p in layout.leaves:
        why = unsafe_as_path(p.leaf.name) if p.leaf.is_array else None
        if why and p.problem is None:
            p = replace(p, problem=f"cannot be stored without OCDBT ({why}); drop --no-ocdbt")
        leaves.append(p)
    return replace(layout, leaves=tuple(leaves))


def _open(target: str | os.PathLike[str] | Location, storage: StorageOptions | None) -> Location:
    return target if isinstance(target, Location) else open_location(target, storage)


def _text(target: str | os.PathLike[str] | Location | None) -> str | None:
    return None if target is None else str(target)


def plan_from_rules(
    report: ItemReport, mesh: MeshSpec, rules: list[Rule], max_chunk_bytes: int
) -> ReshardLayout:
    """Each array leaf gets the spec of the first rule that names it; an optimizer leaf that
    mirrors a parameter (Adam ``mu``/``nu``: same relative path and shape) and that no rule
    names gets its parameter's, as migrate moves moments with their parameter; the rest is
    replicated."""
    return plan_items_from_rules([(None, report)], mesh, rules, max_chunk_bytes)[0]


def plan_items_from_rules(
    reports: Sequence[tuple[str | None, ItemReport]],
    mesh: MeshSpec,
    rules: list[Rule],
    max_chunk_bytes: int,
) -> list[ReshardLayout]:
    """``plan_from_rules`` of the items of one step (name, report) by the same rules, a moment
    following its parameter across items too (the nnx ``optimizer`` item's ``mu`` mirrors the
    ``model`` item's parameter, ``item_keypath``); a rule is unused when no item used it."""
    used: set[str] = set()
    chosen: dict[tuple[str | None, str], tuple[Rule, Spec]] = {}
    for item, report in reports:
        for leaf in report.leaves:
            if leaf.is_array and leaf.shape is not None:
                rule = next((r for r in rules if r.regex.match(leaf.name)), None)
                if rule is not None:
                    used.add(rule.pattern)
                    chosen[item, leaf.name] = (rule, rule.spec)
    index = parameter_index(
        (
            (item, lf)
            for item, report in reports
            for lf in report.leaves
            if (item, lf.name) in chosen
        ),
        lambda x: item_keypath(x[0], x[1].keypath),
    )
    unused = tuple(r.pattern for r in rules if r.pattern not in used)
    layouts = []
    for item, report in reports:
        plans = []
        for leaf in report.leaves:
            if not leaf.is_array or leaf.shape is None:
                plans.append(LeafPlan(leaf, None, None, (), (), None))
                continue
            if (item, leaf.name) in chosen:
                rule, spec = chosen[item, leaf.name]
                plans.append(_plan_leaf(leaf, spec, mesh, rule.pattern, max_chunk_bytes))
                continue
            key = item_keypath(item, leaf.keypath)
            found = mirrored(key, leaf.shape, index, lambda p: p[1].shape)
            if found is not None and len(found[0]) == 1:
                where, param = found[0][0]
                plan = _plan_leaf(leaf, chosen[where, param.name][1], mesh, None, max_chunk_bytes)
                name = param.name if where == item else f"{where}/{param.name}"
                plans.append(replace(plan, follows=name))
                continue
            plans.append(_plan_leaf(leaf, (), mesh, None, max_chunk_bytes))
        layouts.append(ReshardLayout(tuple(plans), unused, mesh))
    return layouts


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


def plan_like(report: ItemReport, other: ItemReport, max_chunk_bytes: int) -> ReshardLayout:
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
    return ReshardLayout(tuple(plans), (), mesh)
