"""``ckpt migrate``: apply a reviewed spec of rules to a checkpoint, streaming, into a new step."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Annotated

import typer

from ckpt_cli.commands import _options as o
from ckpt_cli.commands._command import Command, JsonOutput, Writer
from ckpt_cli.commands._context import run_context, write_plan

if TYPE_CHECKING:
    from ckpt_cli.commands._context import Run
    from ckpt_cli.core.migrate.plan import MigrationPlan
    from ckpt_cli.core.write.rewrite import WriteResult

MigrateDestArg = Annotated[
    str,
    typer.Argument(
        help="Destination root (created if missing), or ROOT/N to name the step.",
        show_default=False,
    ),
]

SpecOpt = Annotated[
    str,
    typer.Option(
        "--spec",
        help="YAML (or .toml) file of ordered rules; their match/from/exclude are leaf "
        "patterns: docs/reference/layouts.md#leaf-patterns.",
        show_default=False,
    ),
]

AllowMismatchOpt = Annotated[
    bool,
    typer.Option("--allow-mismatch", help="Write even if the result differs from --target."),
]

AllowPythonOpt = Annotated[
    bool,
    typer.Option("--allow-python", help="Let `op: python` rules import and run their function."),
]

StepOutOpt = Annotated[
    int | None,
    typer.Option(
        "--step-out", help="Step number to write (default: the source's).", show_default=False
    ),
]

RecordDigestsOpt = Annotated[
    bool | None,
    typer.Option(
        "--record-digests/--no-record-digests",
        help="Read the new step back and record its digests, as `ckpt verify --record` "
        "(default: when the source has a record).",
        show_default=False,
    ),
]


def migrate(
    ctx: typer.Context,
    src: o.SourceArg,
    dst: MigrateDestArg,
    spec: SpecOpt,
    target: o.TargetOpt = None,
    allow_mismatch: AllowMismatchOpt = False,
    allow_unused: o.AllowUnusedOpt = False,
    allow_python: AllowPythonOpt = False,
    step: o.StepOpt = None,
    item: o.ItemOpt = None,
    step_out: StepOutOpt = None,
    max_chunk_bytes: o.MaxChunkBytesOpt = o.MAX_CHUNK_BYTES,
    memory_limit: o.MemoryLimitOpt = o.MEMORY_LIMIT,
    zarr3: o.Zarr3Opt = None,
    compression: o.CompressionOpt = "zstd",
    ocdbt: o.OcdbtOpt = True,
    allow_nonfinite: o.AllowNonfiniteOpt = False,
    record_digests: RecordDigestsOpt = None,
    dry_run: o.PlanOnlyOpt = False,
    json_out: o.JsonOpt = False,
    threads: o.ThreadsOpt = o.THREADS,
    executor: o.ExecutorOpt = "local",
    workers: o.WorkersOpt = 1,
    scheduler: o.SchedulerOpt = None,
    unit_bytes: o.UnitBytesOpt = o.UNIT_BYTES,
    force_split: o.ForceSplitOpt = False,
) -> None:
    """Migrate a checkpoint to a changed model with a spec of rules: rename, drop, keep_only, cast,
    resize, reshape, transpose, split, concat, add, set (and python, behind --allow-python).

    Optimizer state follows the parameters a rule changes. The plan is checked before anything is
    written (collisions, rules that match nothing, --target). The new step streams chunk by chunk
    under --memory-limit (reshape and python hold one leaf); the source is never modified; the step
    is written under a tmp name and renamed when complete, recording the spec it applied. A step
    of several PyTree items (model + optimizer) migrates whole unless --item names one.
    """
    from ckpt_cli.core.migrate.plan import plan_migration
    from ckpt_cli.core.scale import ScaleOptions

    scale = ScaleOptions.from_flags(executor, workers, scheduler, force_split, unit_bytes, threads)
    src, step, item = o.at_step(src, step, item)
    run = run_context(ctx, json_out, scale, start=not dry_run)
    write = o.write_options(
        run, max_chunk_bytes, memory_limit, zarr3, compression, ocdbt, allow_nonfinite
    )
    plan = plan_migration(
        src, dst, spec, target=target, allow_python=allow_python, allow_unused=allow_unused,
        allow_mismatch=allow_mismatch, step=step, item=item, step_out=step_out, write=write,
        record_digests=record_digests, storage=run.storage,
    )  # fmt: skip
    _write(run, plan, dry_run)


def _write(run: Run, plan: MigrationPlan, dry_run: bool) -> None:
    """The plan, then the new step streamed under the progress bar, then what was written."""
    from ckpt_cli.commands import _write_text as written
    from ckpt_cli.commands import migrate_text as render
    from ckpt_cli.core.migrate.execute import execute

    write_plan(
        run,
        plan,
        execute,
        dry_run=dry_run,
        print_plan=render.print_plan,
        print_result=written.print_written_step,
        warnings=() if dry_run else plan.warnings,
    )


def _json() -> JsonOutput:
    """What ``--json`` prints (loaded when asked: ``ckpt --help`` imports no core module)."""
    from ckpt_cli.core.migrate.plan import MigrateJSON, MigrationPlan

    return JsonOutput((MigrateJSON,), MigrationPlan.SCHEMA_VERSION)


def _renderer() -> ModuleType:
    """The module that renders the text output."""
    from ckpt_cli.commands import migrate_text as module

    return module


def _writer() -> Writer[MigrationPlan, WriteResult]:
    """The plan ``ckpt_cli.execute`` takes, and the executor it hands that plan to."""
    from ckpt_cli.core.migrate.execute import execute
    from ckpt_cli.core.migrate.plan import MigrationPlan

    return Writer(MigrationPlan, execute)


COMMAND = Command(
    name="migrate",
    function=migrate,
    summary="apply a spec of rules (`--spec FILE`) for a changed model, checked against it",
    guides=(("guide", "how-to/migrate.md"),),
    json_output=_json,
    renderer=_renderer,
    writer=_writer,
    examples=(
        "runs/exp7 runs/exp7-wide --spec widen.yaml --dry-run",
        "runs/exp7 runs/bf16 --spec cast.yaml --target model:abstract",
    ),
)
