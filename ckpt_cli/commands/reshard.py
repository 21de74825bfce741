"""``ckpt reshard``: rewrite a checkpoint's layout for another device mesh, streaming."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Annotated

import typer

from ckpt_cli.commands import _options as o
from ckpt_cli.commands._command import Command, JsonOutput, Writer
from ckpt_cli.commands._context import run_context, write_plan

if TYPE_CHECKING:
    from ckpt_cli.commands._context import Run
    from ckpt_cli.core.reshard.plan import ReshardPlan
    from ckpt_cli.core.write.rewrite import WriteResult

ReshardDestArg = Annotated[
    str,
    typer.Argument(
        help="Destination root (created if missing; the step keeps its number).",
        show_default=False,
    ),
]

RuleOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--rule",
        help="PATTERN=SPEC, e.g. 'params.*kernel=[null, model]' (repeatable; after --rules). "
        "Patterns: docs/reference/layouts.md#leaf-patterns.",
        show_default=False,
    ),
]

LikeOpt = Annotated[
    str | None,
    typer.Option(
        "--like",
        help="Copy the chunking and sharding of this "
        "checkpoint (its latest step) instead of --mesh/--rules.",
        show_default=False,
    ),
]


def reshard(
    ctx: typer.Context,
    src: o.SourceArg,
    dst: ReshardDestArg,
    mesh: o.MeshOpt = None,
    rules: o.RulesOpt = None,
    rule: RuleOpt = None,
    like: LikeOpt = None,
    step: o.StepOpt = None,
    item: o.ItemOpt = None,
    max_chunk_bytes: o.MaxChunkBytesOpt = o.MAX_CHUNK_BYTES,
    memory_limit: o.MemoryLimitOpt = o.MEMORY_LIMIT,
    zarr3: o.Zarr3Opt = None,
    compression: o.CompressionOpt = "zstd",
    ocdbt: o.OcdbtOpt = True,
    allow_nonfinite: o.AllowNonfiniteOpt = False,
    dry_run: o.PlanOnlyOpt = False,
    json_out: o.JsonOpt = False,
    threads: o.ThreadsOpt = o.THREADS,
    executor: o.ExecutorOpt = "local",
    workers: o.WorkersOpt = 1,
    scheduler: o.SchedulerOpt = None,
    unit_bytes: o.UnitBytesOpt = o.UNIT_BYTES,
    force_split: o.ForceSplitOpt = False,
) -> None:
    """Rewrite a checkpoint for another device mesh: each device's shard becomes whole chunks.

    The output step is a new CheckpointManager step: chunk shape = the per-device shard (split
    under --max-chunk-bytes), `_sharding` = the target NamedSharding (device ids 0..n-1 in mesh
    order). Streams chunk by chunk under --memory-limit; the source is never modified; the step is
    written under a tmp name and renamed when complete. A step of several PyTree items (model +
    optimizer) is resharded whole unless --item names one.
    """
    from ckpt_cli.core.reshard.plan import plan_reshard
    from ckpt_cli.core.scale import ScaleOptions

    scale = ScaleOptions.from_flags(executor, workers, scheduler, force_split, unit_bytes, threads)
    src, step, item = o.at_step(src, step, item)
    run = run_context(ctx, json_out, scale, start=not dry_run)
    write = o.write_options(
        run, max_chunk_bytes, memory_limit, zarr3, compression, ocdbt, allow_nonfinite
    )
    plan = plan_reshard(
        src,
        dst,
        mesh=mesh,
        rules_file=rules,
        rules=rule or (),
        like=like,
        step=step,
        item=item,
        write=write,
        storage=run.storage,
    )
    _write(run, plan, dry_run)


def _write(run: Run, plan: ReshardPlan, dry_run: bool) -> None:
    """The plan, then the new step streamed under the progress bar, then what was written."""
    from ckpt_cli.commands import _write_text as written
    from ckpt_cli.commands import reshard_text as render
    from ckpt_cli.core.reshard.execute import execute

    write_plan(
        run,
        plan,
        execute,
        dry_run=dry_run,
        print_plan=render.print_plan,
        print_result=written.print_written_step,
        warnings=plan.warnings,
    )


def _json() -> JsonOutput:
    """What ``--json`` prints (loaded when asked: ``ckpt --help`` imports no core module)."""
    from ckpt_cli.core.reshard.plan import ReshardJSON, ReshardPlan

    return JsonOutput((ReshardJSON,), ReshardPlan.SCHEMA_VERSION)


def _renderer() -> ModuleType:
    """The module that renders the text output."""
    from ckpt_cli.commands import reshard_text as module

    return module


def _writer() -> Writer[ReshardPlan, WriteResult]:
    """The plan ``ckpt_cli.execute`` takes, and the executor it hands that plan to."""
    from ckpt_cli.core.reshard.execute import execute
    from ckpt_cli.core.reshard.plan import ReshardPlan

    return Writer(ReshardPlan, execute)


COMMAND = Command(
    name="reshard",
    function=reshard,
    summary="rewrite for another device mesh (`--mesh`, `--rules`, `--like`), streaming",
    guides=(("guide", "how-to/reshard.md"),),
    json_output=_json,
    renderer=_renderer,
    writer=_writer,
    examples=(
        "runs/exp7 runs/exp7-4x2 --mesh data=4,model=2 --rules r.yaml",
        "runs/exp7 out --mesh data=8 --rule '*kernel=[data, null]'",
        "runs/exp7 runs/exp7-like --like runs/other --dry-run",
    ),
)
