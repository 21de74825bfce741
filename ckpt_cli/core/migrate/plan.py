"""Plan a migration: apply a spec's rules, in order, to the leaves of a source item.

``plan_migration`` returns a frozen ``MigrationPlan`` (``to_json`` is what ``--dry-run --json``
prints; ``execute.execute`` writes it): the destination leaves, each with the expression that
computes its values (``ops``), the source leaves it reads and the operations applied, plus the
source leaves that were dropped and the rules that matched nothing. Only metadata is read here,
nothing is written: every impossible request (a collision, an impossible reshape, a float cast to int without rounding)
is a ``RefusedError`` naming the rule, the field and the leaf, before anything is written.

Optimizer state follows parameters (``tree``): a rule that changes a parameter changes
the optimizer leaves that mirror it the same way unless the rule says ``follow_optimizer: false``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypedDict

from ckpt_cli.core.diff import SideJSON, side_json
from ckpt_cli.core.format.discovery import ItemRef, detect
from ckpt_cli.core.format.dtypes import dtype_itemsize
from ckpt_cli.core.format.resolve import resolve_trees
from ckpt_cli.core.format.sharding import Shape, ShardingInfo, ShardingJSON
from ckpt_cli.core.inspect import ItemReport, Leaf
from ckpt_cli.core.inspect.item import inspect_item
from ckpt_cli.core.migrate.placement import Layout, layout_for
from ckpt_cli.core.spec import ops
from ckpt_cli.core.spec.apply import Skip, SkipJSON, apply_rules
from ckpt_cli.core.spec.language import MigrationSpec, load_spec, unused_rules_hint
from ckpt_cli.core.spec.target import (
    Difference,
    DifferenceJSON,
    abstract_state,
    compare_target,
    import_function,
)
from ckpt_cli.core.spec.tree import (
    OperationJSON,
    Step,
    Work,
    check_written_leaves,
    fill_key_types,
    key_types,
)
from ckpt_cli.core.storage import Location, StorageOptions, open_location
from ckpt_cli.core.write.memory import bound_allocator
from ckpt_cli.core.write.rewrite import WrittenJSON, check_new_step
from ckpt_cli.core.write.types import WriteOptions
from ckpt_cli.errors import RefusedError, UsageError


class SpecJSON(TypedDict):
    path: str
    sha256: str
    rules: int


class MigrateLeafJSON(TypedDict):
    name: str
    value_type: str
    dtype: str | None
    shape: Shape | None
    sources: list[str]
    changed: bool
    operations: list[OperationJSON]
    streams: bool
    chunk_shape: Shape | None
    sharding: ShardingJSON | None
    size_bytes: int
    note: str | None


class TargetJSON(TypedDict):
    function: str
    differences: list[DifferenceJSON]


class MigrateItemJSON(TypedDict):
    """One item of the step, migrated (v3)."""

    item: str
    source: SideJSON
    total_bytes: int
    leaves: list[MigrateLeafJSON]
    dropped: list[str]


class MigratePlanJSON(TypedDict):
    """The plan alone, as ``--dry-run`` prints it: ``leaves`` and ``dropped`` of every item
    migrated, and each item's own in ``items``."""

    schema_version: int
    ok: bool
    spec: SpecJSON
    source: SideJSON
    total_bytes: int
    leaves: list[MigrateLeafJSON]
    dropped: list[str]
    skipped: list[SkipJSON]
    unused_rules: list[str]
    target: TargetJSON | None
    items: list[MigrateItemJSON]


class MigrateJSON(MigratePlanJSON, WrittenJSON):
    """``ckpt migrate --json``: the plan per destination leaf, and what was written."""


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

    def to_json(self) -> MigrateLeafJSON:
        expr, layout = self.expr, self.layout
        sharding = layout.sharding if layout is not None else None
        return {
            "name": self.name,
            "value_type": self.value_type,
            "dtype": expr.dtype if expr is not None else None,
            "shape": list(expr.shape) if expr is not None else None,
            "sources": list(self.sources),
            "changed": self.changed,
            "operations": [s.to_json() for s in self.steps],
            "streams": expr.streams if expr is not None else True,
            "chunk_shape": list(layout.chunk_shape) if layout is not None else None,
            "sharding": sharding.to_json() if sharding is not None else None,
            "size_bytes": self.size_bytes,
            "note": layout.note if layout is not None else None,
        }

    @property
    def size_bytes(self) -> int:
        if self.expr is None:
            return 0
        return math.prod(self.expr.shape) * dtype_itemsize(self.expr.dtype)


@dataclass(frozen=True)
class MigrateItem:
    """One item of the step migrated: its source, what inspect read, its destination leaves
    and the source leaves dropped."""

    source: ItemRef
    report: ItemReport
    leaves: tuple[DestLeaf, ...]
    dropped: tuple[str, ...]

    def to_json(self) -> MigrateItemJSON:
        return {
            "item": self.source.name,
            "source": side_json(self.source),
            "total_bytes": sum(leaf.size_bytes for leaf in self.leaves),
            "leaves": [leaf.to_json() for leaf in self.leaves],
            "dropped": list(self.dropped),
        }


@dataclass(frozen=True)
class MigrationPlan:
    """A migration to carry out (``execute``): the spec applied to the source item, the
    destination leaves, and where and how the new step is written; ``more``: the step's other
    items migrated with it (no ``--item`` on a step of several PyTree items), their optimizer
    leaves following the parameters of any item. Nothing is written yet."""

    spec: MigrationSpec
    leaves: tuple[DestLeaf, ...]
    dropped: tuple[str, ...]
    unused_rules: tuple[str, ...]
    source: ItemRef
    report: ItemReport
    destination: Location
    step_out: int | None  # None: the source's step number
    write: WriteOptions
    zarr3: bool  # the output zarr version (``write.zarr3``, else the source's)
    target: str | None = None  # --target MODULE:FUNCTION
    differences: tuple[Difference, ...] | None = None  # from the target; None without one
    allow_unused: bool = False
    allow_mismatch: bool = False
    #: Record the new step's digests (None: when the source has a record).
    record_digests: bool | None = None
    #: The functions of ``op: python`` rules, imported (only with allow_python).
    functions: dict[str, Callable[..., Any]] = field(default_factory=dict, compare=False)
    #: PRNG key data (and nnx RNG counters) rules matched by pattern and left unchanged.
    skipped: tuple[Skip, ...] = ()
    more: tuple[MigrateItem, ...] = ()

    kind = "migrate"
    #: 2: ``skipped``, the PRNG state rules matched by pattern and left alone.
    #: 3: ``items``, every item of the step migrated (``written_items`` written).
    #: 4: ``scale.split`` and ``scale.reason`` (a scaled-out run that stays in one process).
    #: 5: ``unchecked_digests``, leaves whose version-1 digest was carried unchecked.
    SCHEMA_VERSION: ClassVar[int] = 5

    @property
    def items(self) -> tuple[MigrateItem, ...]:
        return (MigrateItem(self.source, self.report, self.leaves, self.dropped), *self.more)

    @property
    def total_bytes(self) -> int:
        return sum(leaf.size_bytes for item in self.items for leaf in item.leaves)

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

    @property
    def refusal(self) -> RefusedError | None:
        """Why this plan must not be written (unused rules, a mismatched target), or None;
        ``plan_migration`` has refused names and shapes no writer can write."""
        if self.unused_rules and not self.allow_unused:
            return RefusedError(
                f"{', '.join(self.unused_rules)} matched no leaf; nothing written",
                hint=unused_rules_hint(self.source.location),
            )
        diffs = self.differences
        if diffs and not self.allow_mismatch:
            return RefusedError(
                f"the result differs from --target {self.target} in {len(diffs)} leaves, "
                f"nothing written; {diffs[0].text()}",
                hint="--dry-run lists every difference; --allow-mismatch writes anyway",
            )
        return None

    @property
    def warnings(self) -> tuple[str, ...]:
        """What goes on although it was allowed: rules that matched nothing, target mismatches."""
        return tuple(f"{label} matched no leaf" for label in self.unused_rules) + tuple(
            f"differs from --target: {d.text()}" for d in self.differences or ()
        )

    @property
    def operation(self) -> dict[str, Any]:
        """What the new step records in its ckpt_history."""
        return {
            "operation": "migrate",
            "spec_file": self.spec.path,
            "spec_sha256": self.spec.sha256,
            "spec": self.spec.document,
            "target": self.target,
        }

    def to_json(self) -> MigratePlanJSON:
        """The plan per destination leaf, as ``ckpt migrate --dry-run --json`` prints it."""
        return {
            "schema_version": self.SCHEMA_VERSION,
            "ok": True,
            "spec": {
                "path": self.spec.path,
                "sha256": self.spec.sha256,
                "rules": len(self.spec.rules),
            },
            "source": side_json(self.source),
            "total_bytes": self.total_bytes,
            "leaves": [leaf.to_json() for item in self.items for leaf in item.leaves],
            "dropped": [name for item in self.items for name in item.dropped],
            "skipped": [k.to_json() for k in self.skipped],
            "unused_rules": list(self.unused_rules),
            "target": None
            if self.target is None
            else {
                "function": self.target,
                "differences": [d.to_json() for d in self.differences or ()],
            },
            "items": [item.to_json() for item in self.items],
        }

    def written_json(self, written: WrittenJSON) -> MigrateJSON:
        return {**self.to_json(), **written}


def plan_migration(
    source: str | os.PathLike[str] | Location,
    destination: str | os.PathLike[str] | Location,
    spec: str | MigrationSpec,
    *,
    target: str | None = None,
    allow_python: bool = False,
    allow_unused: bool = False,
    allow_mismatch: bool = False,
    step: int | None = None,
    item: str | None = None,
    step_out: int | None = None,
    write: WriteOptions | None = None,
    record_digests: bool | None = None,
    storage: StorageOptions | None = None,
) -> MigrationPlan:
    """Plan applying ``spec`` (a YAML/TOML file, or a parsed spec) to ``source`` (a root, step or
    item), written into the root ``destination`` (``ROOT/N`` inside an existing root names the
    step). ``op: python`` rules run only with ``allow_python``; with ``target`` the result is
    compared to that function's abstract state (imports jax). Reads metadata only."""
    write = write or WriteOptions()
    bound_allocator()
    dest, out_step = resolve_destination(_open(destination, storage), step_out)
    parsed = spec if isinstance(spec, MigrationSpec) else load_spec(spec)
    functions = _python_functions(parsed, allow_python)
    refs = resolve_trees(_open(source, storage), step, item)
    check_new_step(dest, refs[0], out_step)  # refused before any plan is shown
    _check_one_item_for_target(target, refs)
    reports = [inspect_item(ref) for ref in refs]
    skipped: list[Skip] = []
    items, unused = apply_spec_items(
        reports, parsed, write.max_chunk_bytes, skipped, ocdbt=write.ocdbt
    )
    first = items[0]
    plan = MigrationPlan(
        parsed,
        first.leaves,
        first.dropped,
        unused,
        source=first.source,
        report=first.report,
        destination=dest,
        step_out=out_step,
        write=write,
        zarr3=first.report.zarr_format == 3 if write.zarr3 is None else write.zarr3,
        target=target,
        allow_unused=allow_unused,
        allow_mismatch=allow_mismatch,
        record_digests=record_digests,
        functions=functions,
        skipped=tuple(skipped),
        more=tuple(items[1:]),
    )
    if target is None:
        return plan
    return replace(plan, differences=compare_target(plan.abstract(), abstract_state(target)))


def _check_one_item_for_target(target: str | None, refs: list[ItemRef]) -> None:
    """``--target`` describes one item: a step of several is a usage error naming them."""
    if target is not None and len(refs) > 1:
        raise UsageError(
            f"--target compares one item; {refs[0].step_location} holds "
            f"{', '.join(r.name for r in refs)}",
            hint="choose the item to compare with --item NAME",
        )


def _python_functions(spec: MigrationSpec, allow_python: bool) -> dict[str, Callable[..., Any]]:
    """The functions the spec's ``op: python`` rules call, imported; refused without
    ``allow_python``."""
    functions = {}
    for rule in spec.python_rules:
        if not allow_python:
            raise RefusedError(
                f"spec {spec.path}: {rule.label} runs {rule.function}: custom Python runs only "
                "with --allow-python; nothing written",
                hint="read the function, then rerun with --allow-python",
            )
        assert rule.function is not None
        where = f"spec {spec.path}: {rule.label}"
        functions[rule.function] = import_function(rule.function, where)
    return functions


def resolve_destination(location: Location, step_out: int | None) -> tuple[Location, int | None]:
    """DST is a root; ``ROOT/N`` inside an existing CheckpointManager root names the step."""
    parent = location.parent
    if not location.name.isdigit() or not parent.is_dir() or detect(parent).kind != "root":
        return location, step_out
    if step_out is not None and step_out != int(location.name):
        raise UsageError(
            f"{location} names step {int(location.name)}; --step-out {step_out} contradicts it"
        )
    return parent, int(location.name)


def _open(target: str | os.PathLike[str] | Location, storage: StorageOptions | None) -> Location:
    return target if isinstance(target, Location) else open_location(target, storage)


def apply_spec(
    report: ItemReport,
    spec: MigrationSpec,
    max_chunk_bytes: int,
    skipped: list[Skip] | None = None,
    *,
    ocdbt: bool | None = None,
) -> tuple[tuple[DestLeaf, ...], tuple[str, ...], tuple[str, ...]]:
    """The spec's rules applied in order: (destination leaves, dropped source leaves, labels
    of the rules that matched nothing); ``skipped`` collects the PRNG state rules left alone.
    With ``ocdbt`` (a checkpoint is written, with or without OCDBT) the leaves are checked
    (``check_written_leaves``) before any layout is computed."""
    work, unused = apply_rules([Work.from_leaf(leaf) for leaf in report.leaves], spec, skipped)
    leaves, dropped = _freeze_item(report, work, max_chunk_bytes, ocdbt)
    return leaves, dropped, unused


def apply_spec_items(
    reports: Sequence[ItemReport],
    spec: MigrationSpec,
    max_chunk_bytes: int,
    skipped: list[Skip] | None = None,
    *,
    ocdbt: bool | None = None,
) -> tuple[list[MigrateItem], tuple[str, ...]]:
    """``apply_spec`` over the items of one step at once: a rule applies to every item, by
    the names its leaves have in their item, and an optimizer leaf of one item follows the
    parameter of another that it mirrors (``Work.mirror_path``); then split by item. A rule
    unused in every item is unused. One item plans as ``apply_spec``."""
    several = len(reports) > 1
    work = [
        Work.from_leaf(leaf, report.ref.name if several else None)
        for report in reports
        for leaf in report.leaves
    ]
    work, unused = apply_rules(work, spec, skipped)
    if several and (new := next((w for w in work if w.item is None), None)):
        raise UsageError(
            f"{new.origin} adds {new.name!r} to a step of several items "
            f"({', '.join(r.ref.name for r in reports)}): say which item holds it",
            hint="run migrate once per item with --item NAME",
        )
    items = []
    for report in reports:
        mine = [w for w in work if w.item == (report.ref.name if several else None)]
        leaves, dropped = _freeze_item(report, mine, max_chunk_bytes, ocdbt)
        items.append(MigrateItem(report.ref, report, leaves, dropped))
    return items, unused


def _freeze_item(
    report: ItemReport, work: list[Work], max_chunk_bytes: int, ocdbt: bool | None
) -> tuple[tuple[DestLeaf, ...], tuple[str, ...]]:
    """An item's planned leaves, checked (with ``ocdbt``) and frozen, and its source leaves
    that none of them reads."""
    if ocdbt is not None:
        check_written_leaves(work, ocdbt=ocdbt)
    default = _default_sharding(report.leaves)
    sources = {leaf.name: leaf for leaf in report.leaves}
    kinds = fill_key_types(work)
    leaves = tuple(_freeze(w, kinds, default, sources, max_chunk_bytes) for w in work)
    reached = {s for leaf in leaves for s in leaf.sources}
    dropped = tuple(leaf.name for leaf in report.leaves if leaf.name not in reached)
    return leaves, dropped


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
