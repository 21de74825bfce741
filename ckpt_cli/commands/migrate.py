"""``ckpt migrate``: apply a reviewed spec of rules to a checkpoint, streaming, into a new step."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ckpt_cli.commands._common import ItemOpt, JsonOpt, StepOpt, emit_json, warn
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
from ckpt_cli.errors import RefusedError, UsageError


def migrate(
    src: Annotated[
        str, typer.Argument(help="Source: a root, step or item directory.", show_default=False)
    ],
    dst: Annotated[
        str,
        typer.Argument(
            help="Destination root (created if missing), or ROOT/N to name the step.",
            show_default=False,
        ),
    ],
    spec: Annotated[
        str,
        typer.Option("--spec", help="YAML (or .toml) file of ordered rules.", show_default=False),
    ],
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="MODULE:FUNCTION returning the new model's abstract state; the result is "
            "checked against it (names, shapes, dtypes). Imports jax.",
            show_default=False,
        ),
    ] = None,
    allow_mismatch: Annotated[
        bool,
        typer.Option("--allow-mismatch", help="Write even if the result differs from --target."),
    ] = False,
    allow_unused: Annotated[
        bool, typer.Option("--allow-unused", help="Warn, not fail, when a rule matches no leaf.")
    ] = False,
    allow_python: Annotated[
        bool,
        typer.Option(
            "--allow-python", help="Let `op: python` rules import and run their function."
        ),
    ] = False,
    step: StepOpt = None,
    item: ItemOpt = None,
    step_out: Annotated[
        int | None,
        typer.Option(
            "--step-out", help="Step number to write (default: the source's).", show_default=False
        ),
    ] = None,
    max_chunk_bytes: MaxChunkBytesOpt = "64MiB",
    memory_limit: MemoryLimitOpt = "1GiB",
    zarr3: Zarr3Opt = None,
    compression: CompressionOpt = "zstd",
    ocdbt: OcdbtOpt = True,
    record_digests: Annotated[
        bool | None,
        typer.Option(
            "--record-digests/--no-record-digests",
            help="Read the new step back and record its digests, as `ckpt verify --record` "
            "(default: when the source has a record).",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan per leaf; write nothing.")
    ] = False,
    json_out: JsonOpt = False,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = 1,
    scheduler: SchedulerOpt = None,
    unit_bytes: UnitBytesOpt = "256MiB",
) -> None:
    """Migrate a checkpoint to a changed model with a spec of rules: rename, drop, keep_only, cast,
    resize, reshape, transpose, split, concat, add, set (and python, behind --allow-python).

    Optimizer state follows the parameters a rule changes. The plan is checked before anything is
    written (collisions, rules that match nothing, --target). The new step streams chunk by chunk
    under --memory-limit (reshape and python hold one leaf); the source is never modified; the step
    is written under a tmp name and renamed when complete, recording the spec it applied.
    """
    from ckpt_cli.commands import _render_migrate as render
    from ckpt_cli.core.format.resolve import resolve_item
    from ckpt_cli.core.inspect import inspect_item
    from ckpt_cli.core.migrate.plan import has_digests, migrate_leaves, plan_migration
    from ckpt_cli.core.migrate.spec import load_spec
    from ckpt_cli.core.migrate.target import abstract_state, compare_target, import_function
    from ckpt_cli.core.storage import open_location
    from ckpt_cli.core.write.memory import bound_allocator
    from ckpt_cli.core.write.rewrite import prepare_destination
    from ckpt_cli.core.write.types import Compression

    chunk_limit, mem_limit = write_limits(max_chunk_bytes, memory_limit)
    scale = executor_spec(executor, workers, scheduler)
    units = parse_unit_bytes(unit_bytes)
    comp = Compression.parse(compression)
    bound_allocator()
    destination, out_step = _destination(dst, step_out)
    parsed = load_spec(spec)
    functions = {}
    for rule in parsed.python_rules:
        if not allow_python:
            raise RefusedError(
                f"spec {spec}: {rule.label} runs {rule.function}: custom Python runs only with "
                "--allow-python; nothing written",
                hint="read the function, then rerun with --allow-python",
            )
        assert rule.function is not None
        functions[rule.function] = import_function(rule.function, f"spec {spec}: {rule.label}")

    ref = resolve_item(open_location(src), step, item)
    report = inspect_item(ref)
    plan = plan_migration(report, parsed, chunk_limit)
    diffs = compare_target(plan.abstract(), abstract_state(target)) if target else None
    doc = render.plan_json(plan, ref, target, diffs)
    problem = _problem(plan, target, diffs, allow_unused, allow_mismatch)
    if dry_run or problem:
        if dry_run:
            emit_json(doc) if json_out else render.print_plan(plan, target, diffs)
        if problem:
            raise problem
        return
    for label in plan.unused_rules:
        warn(f"{label} matched no leaf")
    for d in diffs or ():
        warn(f"differs from --target: {d.text()}")

    prepare_destination(destination, ref)
    out_zarr3 = report.zarr_format == 3 if zarr3 is None else zarr3
    leaves = migrate_leaves(report, plan, out_zarr3, comp, mem_limit, functions)
    write_and_report(
        "migrate",
        ref,
        destination,
        leaves,
        total=plan.total_bytes,
        json_doc=doc if json_out else None,
        print_plan=lambda: render.print_plan(plan, target, diffs),
        after=_digests
        if (has_digests(ref.location) if record_digests is None else record_digests)
        else None,
        use_ocdbt=ocdbt,
        scale=scale,
        unit_bytes=units,
        use_zarr3=out_zarr3,
        memory_limit=mem_limit,
        step=out_step,
        operation={
            "operation": "migrate",
            "spec_file": spec,
            "spec_sha256": parsed.sha256,
            "spec": parsed.document,
            "target": target,
        },
    )


def _digests(result: Any) -> dict[str, Any]:
    from ckpt_cli.core.migrate.plan import record_step_digests
    from ckpt_cli.core.storage import open_location

    recorded = record_step_digests(open_location(result.path))
    return {"digests": "recorded" if recorded else "not recorded (run `ckpt verify` on the step)"}


def _destination(dst: str, step_out: int | None) -> tuple[Any, int | None]:
    """DST is a root; ``ROOT/N`` inside an existing CheckpointManager root names the step."""
    from ckpt_cli.core.format.layout import detect
    from ckpt_cli.core.storage import open_location

    location = open_location(dst)
    parent = location.parent
    if not location.name.isdigit() or not parent.is_dir() or detect(parent).kind != "root":
        return location, step_out
    if step_out is not None and step_out != int(location.name):
        raise UsageError(
            f"{dst} names step {int(location.name)}; --step-out {step_out} contradicts it"
        )
    return parent, int(location.name)


def _problem(
    plan: Any, target: str | None, diffs: Any, allow_unused: bool, allow_mismatch: bool
) -> RefusedError | None:
    if plan.unused_rules and not allow_unused:
        return RefusedError(
            f"{', '.join(plan.unused_rules)} matched no leaf; nothing written",
            hint="--dry-run lists the leaves; --allow-unused goes on without them",
        )
    if diffs and not allow_mismatch:
        return RefusedError(
            f"the result differs from --target {target} in {len(diffs)} leaves, nothing written; "
            f"{diffs[0].text()}",
            hint="--dry-run lists every difference; --allow-mismatch writes anyway",
        )
    return None
