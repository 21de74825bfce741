"""``ckpt reshard``: rewrite a checkpoint's layout for another device mesh, streaming."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ckpt_cli.commands._common import (
    ItemOpt,
    JsonOpt,
    StepOpt,
    emit_json,
    human_bytes,
    shape_str,
    stdout_console,
    warn,
)
from ckpt_cli.commands._scale import (
    ExecutorOpt,
    SchedulerOpt,
    UnitBytesOpt,
    WorkersOpt,
    executor_spec,
)
from ckpt_cli.commands._scale import unit_bytes as parse_unit_bytes
from ckpt_cli.commands._write import (
    CompressionOpt,
    MaxChunkBytesOpt,
    MemoryLimitOpt,
    OcdbtOpt,
    Zarr3Opt,
    write_and_report,
    write_limits,
)
from ckpt_cli.errors import InvalidMetadataError, RefusedError, UsageError


def reshard(
    src: Annotated[
        str, typer.Argument(help="Source: a root, step or item directory.", show_default=False)
    ],
    dst: Annotated[
        str,
        typer.Argument(
            help="Destination root (created if missing; the step keeps its number).",
            show_default=False,
        ),
    ],
    mesh: Annotated[
        str | None,
        typer.Option("--mesh", help="Target mesh, e.g. data=8,model=4.", show_default=False),
    ] = None,
    rules: Annotated[
        str | None,
        typer.Option(
            "--rules",
            help="YAML/JSON file: leaf pattern -> partition "
            "spec, e.g. 'params.*kernel: [null, model]'. First match "
            "wins; unmatched leaves are replicated.",
            show_default=False,
        ),
    ] = None,
    rule: Annotated[
        list[str] | None,
        typer.Option(
            "--rule",
            help="PATTERN=SPEC, e.g. 'params.*kernel=[null, model]' (repeatable; after --rules).",
            show_default=False,
        ),
    ] = None,
    like: Annotated[
        str | None,
        typer.Option(
            "--like",
            help="Copy the chunking and sharding of this "
            "checkpoint (its latest step) instead of --mesh/--rules.",
            show_default=False,
        ),
    ] = None,
    step: StepOpt = None,
    item: ItemOpt = None,
    max_chunk_bytes: MaxChunkBytesOpt = "64MiB",
    memory_limit: MemoryLimitOpt = "1GiB",
    zarr3: Zarr3Opt = None,
    compression: CompressionOpt = "zstd",
    ocdbt: OcdbtOpt = True,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan per leaf; write nothing.")
    ] = False,
    json_out: JsonOpt = False,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = 1,
    scheduler: SchedulerOpt = None,
    unit_bytes: UnitBytesOpt = "256MiB",
) -> None:
    """Rewrite a checkpoint for another device mesh: each device's shard becomes whole chunks.

    The output step is a new CheckpointManager step: chunk shape = the per-device shard (split
    under --max-chunk-bytes), `_sharding` = the target NamedSharding (device ids 0..n-1 in mesh
    order). Streams chunk by chunk under --memory-limit; the source is never modified; the step is
    written under a tmp name and renamed when complete.
    """
    from ckpt_cli.core import reshard as core
    from ckpt_cli.core.format.digests import read_digests
    from ckpt_cli.core.format.resolve import resolve_item
    from ckpt_cli.core.format.sharding import MeshSpec
    from ckpt_cli.core.inspect import inspect_item
    from ckpt_cli.core.storage import open_location
    from ckpt_cli.core.write.memory import bound_allocator
    from ckpt_cli.core.write.rewrite import prepare_destination
    from ckpt_cli.core.write.types import Compression

    if like is not None and (mesh or rules or rule):
        raise UsageError(
            "--like copies another checkpoint's layout; do not combine it with --mesh/--rules/--rule"
        )
    if like is None and mesh is None:
        raise UsageError(
            "say where to reshard to: --mesh NAME=SIZE,... (with --rules/--rule) or --like OTHER"
        )
    chunk_limit, mem_limit = write_limits(max_chunk_bytes, memory_limit)
    scale = executor_spec(executor, workers, scheduler)
    units = parse_unit_bytes(unit_bytes)
    comp = Compression.parse(compression)
    bound_allocator()

    ref = resolve_item(open_location(src), step, item)
    report = inspect_item(ref)
    if like is not None:
        plan = core.plan_like(report, inspect_item(resolve_item(open_location(like))), chunk_limit)
    else:
        assert mesh is not None
        target = MeshSpec.parse(mesh)
        rule_list = core.parse_rules(_load_rules(rules), target, rules) if rules else []
        for text in rule or []:
            rule_list += core.parse_rules(_inline_rule(text), target, f"--rule {text!r}")
        plan = core.plan_from_rules(report, target, rule_list, chunk_limit)
    out_zarr3 = report.zarr_format == 3 if zarr3 is None else zarr3

    if plan.problems:
        if dry_run:
            _print_plan(plan, json_out)
        first = plan.problems[0]
        raise RefusedError(
            f"{len(plan.problems)} leaves cannot take the target layout, nothing written; "
            f"{first.leaf.name}: {first.problem}",
            hint="change their rule or the mesh; --dry-run lists every leaf",
        )
    for pattern in plan.unused_rules:
        warn(f"rule {pattern!r} matched no leaf")
    if dry_run:
        _print_plan(plan, json_out)
        return
    destination = open_location(dst)
    prepare_destination(destination, ref)

    leaves = core.reshard_leaves(report, plan, out_zarr3, comp, mem_limit)
    # Values do not change: recorded digests carry over (and verify proves they still match).
    record = read_digests(ref.location)
    carried = (
        {k: v for k, v in record.leaves.items() if k in {x.name for x in leaves}}
        if record
        else None
    )
    write_and_report(
        "reshard",
        ref,
        destination,
        leaves,
        total=plan.total_bytes,
        json_doc=_plan_json(plan) if json_out else None,
        print_plan=lambda: _print_plan(plan, False),
        use_ocdbt=ocdbt,
        scale=scale,
        unit_bytes=units,
        use_zarr3=out_zarr3,
        memory_limit=mem_limit,
        operation={"operation": "reshard", "mesh": mesh, "like": like, "rules": rules},
        leaf_digests=carried,
    )


def _load_rules(path: str) -> Any:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except FileNotFoundError:
        raise InvalidMetadataError(f"--rules {path} does not exist") from None
    except (OSError, yaml.YAMLError) as e:
        raise InvalidMetadataError(
            f"--rules {path} is not valid YAML/JSON: {str(e).splitlines()[0]}"
        ) from None


def _inline_rule(text: str) -> dict[str, Any]:
    import yaml

    pattern, sep, spec = text.partition("=")
    if not sep or not pattern:
        raise UsageError(
            f"--rule {text!r}: expected PATTERN=SPEC, e.g. 'params.*kernel=[null, model]'"
        )
    try:
        return {pattern.strip(): yaml.safe_load(spec)}
    except yaml.YAMLError:
        raise UsageError(
            f"--rule {text!r}: the spec is not a YAML list such as [null, model]"
        ) from None


def _plan_json(plan: Any) -> dict[str, Any]:
    return {
        "mesh": dict(zip(plan.mesh.axis_names, plan.mesh.shape, strict=True))
        if plan.mesh
        else None,
        "total_bytes": plan.total_bytes,
        "unused_rules": list(plan.unused_rules),
        "leaves": [
            {
                "name": p.leaf.name,
                "dtype": p.leaf.dtype,
                "shape": None if p.leaf.shape is None else list(p.leaf.shape),
                "old_chunk_shape": None if p.leaf.chunk_shape is None else list(p.leaf.chunk_shape),
                "new_chunk_shape": list(p.chunk_shape) if p.leaf.is_array else None,
                "partition_spec": None
                if p.spec is None
                else [list(x) if isinstance(x, tuple) else x for x in p.spec],
                "rule": p.rule,
                "size_bytes": p.leaf.size_bytes,
                "problem": p.problem,
            }
            for p in plan.leaves
        ],
    }


def _print_plan(plan: Any, json_out: bool) -> None:
    if json_out:
        emit_json(_plan_json(plan))
        return
    from ckpt_cli.commands._lines import emit, painter, table_lines, use_color

    color = use_color()
    paint = painter(color)
    with_problems = bool(plan.problems)
    rows = []
    for p in plan.leaves:
        if not p.leaf.is_array:
            continue
        row = [
            (p.leaf.name, ""),
            (f"{p.leaf.dtype}{shape_str(p.leaf.shape)}", "cyan"),
            (shape_str(p.leaf.chunk_shape), ""),
            (shape_str(p.chunk_shape), "green"),
            (p.sharding.short() if p.sharding else "host value", "blue"),
            (human_bytes(p.leaf.size_bytes), ""),
        ]
        if with_problems:
            row.append((p.problem or "", "red"))
        rows.append(row)
    headers = ["leaf", "array", "old chunk", "new chunk", "spec", "bytes"]
    emit(
        table_lines(headers + ["problem"] * with_problems, rows, paint, right=frozenset({5})), color
    )
    if plan.mesh:
        mesh = ",".join(
            f"{n}={s}" for n, s in zip(plan.mesh.axis_names, plan.mesh.shape, strict=True)
        )
        stdout_console().print(
            f"target mesh {mesh} ({plan.mesh.size} devices); {human_bytes(plan.total_bytes)} to write"
        )
