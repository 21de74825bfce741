"""Plan and run ``ckpt export``: one Orbax item into safetensors files Hugging Face loads.

``plan_export`` decides everything before a byte is written: which leaves go (``params_only``
keeps the leaves ``inspect`` calls parameters), their names and shapes (a migrate spec, applied
by the rule language of ``core/spec/``), their dtype (``dtype`` casts floating leaves), the files and
every offset in them. A leaf safetensors cannot hold (strings, typed PRNG keys, int4, complex)
is refused there, with a hint. ``export_run.execute`` streams the plan into the files.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from ckpt_cli.core.digest.carried import carried, recorded_leaves
from ckpt_cli.core.format.discovery import ItemRef
from ckpt_cli.core.format.sharding import Shape
from ckpt_cli.core.inspect import ItemReport
from ckpt_cli.core.migrate.plan import DestLeaf, apply_spec
from ckpt_cli.core.safetensors.dtypes import safetensors_dtype
from ckpt_cli.core.safetensors.ld1 import LD1_KEY, planned
from ckpt_cli.core.safetensors.plan import FilesPlan, TensorSpec, plan_files
from ckpt_cli.core.safetensors.tree import (
    EMPTY_TYPES,
    ITEM_KEY,
    STEP_KEY,
    STEP_NAME_KEY,
    TREE_KEY,
    Node,
    encode_tree,
)
from ckpt_cli.core.schema import SCHEMA_VERSION
from ckpt_cli.core.spec import ops
from ckpt_cli.core.spec.language import MigrationSpec, unused_rules_hint
from ckpt_cli.core.spec.tree import OperationJSON, Step
from ckpt_cli.core.storage import StorageOptions
from ckpt_cli.errors import RefusedError

FRAMEWORKS = ("pt", "np", "flax", "tf", "mlx")
CAST_DTYPES = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")
#: transformers' default for ``save_pretrained(max_shard_size=...)``: 5 GB (decimal).
DEFAULT_MAX_SHARD = 5 * 10**9


class ExportSourceJSON(TypedDict):
    path: str
    item: str
    step: int | None
    orbax_format: str


class ExportFileJSON(TypedDict):
    name: str
    bytes: int
    tensors: int


# "from" is a keyword: the functional form.
ExportTensorJSON = TypedDict(
    "ExportTensorJSON",
    {
        "name": str,
        "dtype": str,
        "shape": Shape,
        "bytes": int,
        "file": str,
        "from": list[str],
        "operations": list[OperationJSON],
    },
)


class SkippedJSON(TypedDict):
    name: str
    reason: str


class ExportPlanJSON(TypedDict):
    """The plan alone, as ``--dry-run`` prints it; ``ExportJSON`` adds what was written."""

    schema_version: int
    ok: bool
    source: ExportSourceJSON
    out: str
    format: Literal["safetensors"]
    spec: str | None
    metadata: dict[str, str]
    total_bytes: int
    index: str | None
    files: list[ExportFileJSON]
    tensors: list[ExportTensorJSON]
    skipped: list[SkippedJSON]
    unused_rules: list[str]


@dataclass(frozen=True)
class ExportTensor:
    """One tensor of the output: its name, dtype and shape, and how its values are computed."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    expr: ops.Node
    sources: tuple[str, ...]
    steps: tuple[Step, ...]
    file: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.expr_itemsize

    @property
    def expr_itemsize(self) -> int:
        from ckpt_cli.core.format.dtypes import dtype_itemsize

        return dtype_itemsize(self.dtype)

    def to_json(self) -> ExportTensorJSON:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "bytes": self.nbytes,
            "file": self.file,
            "from": list(self.sources),
            "operations": [s.to_json() for s in self.steps],
        }


@dataclass(frozen=True)
class Skipped:
    """A source leaf that is not exported, and why."""

    name: str
    reason: str

    def to_json(self) -> SkippedJSON:
        return {"name": self.name, "reason": self.reason}


@dataclass(frozen=True)
class ExportPlan:
    source: str
    item: str
    step: int | None
    orbax_format: str
    out: str
    files: FilesPlan
    tensors: tuple[ExportTensor, ...]
    skipped: tuple[Skipped, ...]
    metadata: dict[str, str]
    spec: str | None
    unused_rules: tuple[str, ...]
    memory_limit: int = 256 << 20
    #: Write NaN/Inf as they are (``--allow-nonfinite``); else a tensor holding any is refused.
    allow_nonfinite: bool = False
    #: The source item as inspected (its arrays are opened when the plan is executed).
    report: ItemReport | None = field(default=None, compare=False, repr=False)

    kind = "export"

    @property
    def total_bytes(self) -> int:
        return self.files.total_size

    def to_json(self) -> ExportPlanJSON:
        return {
            "schema_version": SCHEMA_VERSION,
            "ok": True,
            "source": {
                "path": self.source,
                "item": self.item,
                "step": self.step,
                "orbax_format": self.orbax_format,
            },
            "out": self.out,
            "format": "safetensors",
            "spec": self.spec,
            "metadata": self.metadata,
            "total_bytes": self.total_bytes,
            "index": self.files.index_name,
            "files": [
                {"name": f.name, "bytes": f.size, "tensors": len(f.header.tensors)}
                for f in self.files.files
            ],
            "tensors": [t.to_json() for t in self.tensors],
            "skipped": [s.to_json() for s in self.skipped],
            "unused_rules": list(self.unused_rules),
        }


def orbax_format(report: ItemReport) -> str:
    return f"{report.storage} zarr{report.zarr_format}"


def plan_export(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    spec: str | MigrationSpec | None = None,
    params_only: bool = False,
    dtype: str | None = None,
    max_shard_size: int | None = DEFAULT_MAX_SHARD,
    framework: str = "pt",
    provenance: bool = True,
    allow_unused: bool = False,
    step: int | None = None,
    item: str | None = None,
    memory_limit: int = 256 << 20,
    storage: StorageOptions | None = None,
    allow_nonfinite: bool = False,
) -> ExportPlan:
    """Plan exporting one item of ``source`` (a root, step or item; local or a bucket) to the
    new local directory ``out``: ``spec`` (a file or a parsed migrate spec) maps names and
    shapes first, ``params_only`` keeps the parameters, ``dtype`` casts floating leaves. Reads
    metadata only; ``execute`` writes."""
    from ckpt_cli.core.format.resolve import resolve_item
    from ckpt_cli.core.inspect.item import inspect_item
    from ckpt_cli.core.spec.language import load_spec
    from ckpt_cli.core.storage import open_location

    ref = resolve_item(open_location(os.fspath(source), storage), step, item)
    report = inspect_item(ref)
    parsed = load_spec(spec) if isinstance(spec, str) else spec
    plan = plan_export_item(
        ref,
        report,
        os.fspath(out),
        spec=parsed,
        params_only=params_only,
        dtype=dtype,
        max_shard_size=max_shard_size,
        framework=framework,
        provenance=provenance,
        allow_unused=allow_unused,
    )
    return dataclasses.replace(
        plan, memory_limit=memory_limit, report=report, allow_nonfinite=allow_nonfinite
    )


def plan_export_item(
    ref: ItemRef,
    report: ItemReport,
    out: str,
    *,
    spec: MigrationSpec | None = None,
    params_only: bool = False,
    dtype: str | None = None,
    max_shard_size: int | None = DEFAULT_MAX_SHARD,
    framework: str = "pt",
    provenance: bool = True,
    allow_unused: bool = False,
) -> ExportPlan:
    """Everything an export writes, decided and checked; nothing is read or written."""
    _check_options(framework, dtype)
    skipped: list[Skipped] = []
    if params_only:
        report = _params_only(ref, report, skipped)
    rules = spec or MigrationSpec(path="", sha256="", rules=())
    dest_leaves, dropped, unused = apply_spec(report, rules, max_chunk_bytes=1 << 62)
    if unused and not allow_unused:
        raise RefusedError(
            f"{', '.join(unused)} matched no leaf; nothing written",
            hint=unused_rules_hint(ref.location),
        )
    skipped += [Skipped(name, "dropped by the spec") for name in dropped]
    exported = _arrays(dest_leaves, skipped)
    exprs = {leaf.name: _cast(leaf, dtype) for leaf in exported}
    specs = [TensorSpec(name, e.dtype, e.shape) for name, e in exprs.items()]
    for s in specs:
        safetensors_dtype(s.dtype, f"leaf {s.name!r}")
    source = str(ref.root or ref.step_location or ref.location)
    metadata = {"format": framework, TREE_KEY: encode_tree(_tree_nodes(dest_leaves, exported))}
    # The item's name is structure, like the tree: `ckpt import` writes the item under it, the
    # name the source's loader asks for (Keras `pytree`, MaxText `items`, Orbax v1 `pytree`).
    metadata[ITEM_KEY] = ref.name
    if provenance:
        metadata.update(_provenance(ref, report, source, spec))
    metadata[LD1_KEY] = planned(
        exprs, carried(recorded_leaves(ref.location), ops.source_reads(exprs))
    )
    files = plan_files(specs, max_shard_size=max_shard_size, metadata=metadata)
    where = files.weight_map
    tensors = tuple(_tensor(leaf, exprs[leaf.name], where[leaf.name]) for leaf in exported)
    return ExportPlan(
        source=source,
        item=ref.name,
        step=ref.step,
        orbax_format=orbax_format(report),
        out=os.path.abspath(out) if "://" not in out else out,
        files=files,
        tensors=tensors,
        skipped=tuple(skipped),
        metadata=metadata,
        spec=spec.path if spec is not None else None,
        unused_rules=unused,
        report=report,
    )


def _check_options(framework: str, dtype: str | None) -> None:
    if framework not in FRAMEWORKS:
        raise RefusedError(f"unknown framework {framework!r} (use one of {', '.join(FRAMEWORKS)})")
    if dtype is not None and dtype not in CAST_DTYPES:
        raise RefusedError(
            f"--dtype {dtype}: exports cast floating leaves to one of {', '.join(CAST_DTYPES)}"
        )


def _tensor(leaf: DestLeaf, expr: ops.Node, file: str) -> ExportTensor:
    """One leaf as the tensor written to ``file``: its expression, cast by ``--dtype``."""
    return ExportTensor(
        leaf.name,
        expr.dtype,
        expr.shape,
        expr,
        leaf.sources,
        leaf.steps + _cast_step(leaf, expr),
        file,
    )


def _params_only(ref: ItemRef, report: ItemReport, skipped: list[Skipped]) -> ItemReport:
    """The report narrowed to the model parameters (the others go to ``skipped``); refused
    when there are none."""
    leaves = list(report.leaves)
    kept = [leaf for leaf in leaves if leaf.part == "params"]
    if not kept:
        raise RefusedError(
            f"{ref.location} has no leaf `inspect` calls a model parameter; nothing to export",
            hint="run `ckpt inspect` to see the tree, and export without --params-only or with a spec",
        )
    skipped += [
        Skipped(x.name, f"--params-only ({x.part or 'not a parameter'})")
        for x in leaves
        if x.part != "params"
    ]
    return dataclasses.replace(report, leaves=tuple(kept))


def _arrays(dest_leaves: tuple[DestLeaf, ...], skipped: list[Skipped]) -> list[DestLeaf]:
    """The leaves that become tensors; leaves without array data go to ``skipped``, strings and
    typed PRNG keys (safetensors has no type for them) are refused."""
    exported: list[DestLeaf] = []
    for leaf in dest_leaves:
        if leaf.expr is None:
            if leaf.value_type == "string":
                raise _refuse(leaf.name, "is a string: safetensors holds arrays only")
            skipped.append(Skipped(leaf.name, f"no array data ({leaf.value_type})"))
            continue
        if leaf.random_key_impl:
            raise _refuse(
                leaf.name,
                f"is a typed PRNG key ({leaf.random_key_impl}): safetensors has no key dtype",
            )
        exported.append(leaf)
    return exported


def _tree_nodes(dest_leaves: tuple[DestLeaf, ...], exported: list[DestLeaf]) -> list[Node]:
    """What ``ckpt.tree`` records: the exported tensors and the empty nodes (``None``,
    ``optax.EmptyState()``, ``{}``) the import writes back, with their container kinds."""
    empties = [x for x in dest_leaves if x.expr is None and x.value_type in EMPTY_TYPES]
    return [Node(x.keypath, x.key_types, x.value_type) for x in [*exported, *empties]]


def _provenance(
    ref: ItemRef, report: ItemReport, source: str, spec: MigrationSpec | None
) -> dict[str, str]:
    """Where the tensors came from, in the files' metadata (``--no-provenance`` leaves it out)."""
    metadata = {
        "ckpt.source": source,
        "ckpt.orbax_format": orbax_format(report),
    }
    if ref.step is not None:
        metadata[STEP_KEY] = str(ref.step)
        if ref.step_location is not None:  # its naming (Kauldron's ckpt_4): import keeps it
            metadata[STEP_NAME_KEY] = ref.step_location.name
    if spec is not None:
        metadata["ckpt.spec_sha256"] = spec.sha256
    return metadata


def _refuse(name: str, why: str) -> RefusedError:
    return RefusedError(
        f"leaf {name!r} {why}; nothing written",
        hint="drop it with a spec rule `op: drop`, or export the parameters only with --params-only",
    )


def _cast(leaf: DestLeaf, dtype: str | None) -> ops.Node:
    expr = leaf.expr
    assert expr is not None
    if dtype is None or not ops.is_float(expr.dtype) or expr.dtype == dtype:
        return expr
    return ops.Cast(
        shape=expr.shape, dtype=dtype, inner=expr, rounding=None, label="--dtype", leaf=leaf.name
    )


def _cast_step(leaf: DestLeaf, expr: ops.Node) -> tuple[Step, ...]:
    assert leaf.expr is not None
    if expr is leaf.expr:
        return ()
    return (Step(0, "cast", f"{leaf.expr.dtype} -> {expr.dtype} (--dtype)"),)
