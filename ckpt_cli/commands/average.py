"""``ckpt average``: a new step whose float leaves are the mean of several steps, streaming."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Annotated

import typer

from ckpt_cli.commands import _options as o
from ckpt_cli.commands._command import Command, JsonOutput, Writer
from ckpt_cli.commands._context import run_context, write_plan
from ckpt_cli.errors import UsageError

if TYPE_CHECKING:
    from ckpt_cli.commands._context import Run
    from ckpt_cli.core.average.plan import AveragePlan
    from ckpt_cli.core.write.rewrite import WriteResult

AverageDestArg = Annotated[
    str,
    typer.Argument(
        help="Destination root (created if missing), or ROOT/N to name the step.",
        show_default=False,
    ),
]
AverageSourceArg = Annotated[
    str,
    typer.Argument(
        help="Source: a root; SRC@400,500,600 names the steps (as --steps).", show_default=False
    ),
]
StepsOpt = Annotated[
    str | None,
    typer.Option(
        "--steps",
        help="Committed steps to average, in order (the last one gives every other leaf): "
        "400,500,600 (or SRC@400,500,600).",
        show_default=False,
        metavar="A,B,C",
    ),
]
WeightsOpt = Annotated[
    str | None,
    typer.Option(
        "--weights",
        help="One positive weight per step, normalised to sum to 1 (default: equal).",
        show_default=False,
        metavar="W1,W2,...",
    ),
]
EmaOpt = Annotated[
    float | None,
    typer.Option(
        "--ema",
        help="Exponential moving average over the steps in order with this decay "
        "(0 < DECAY < 1): e1 = x1, ek = DECAY*e(k-1) + (1-DECAY)*xk.",
        show_default=False,
        metavar="DECAY",
    ),
]
AverageFilterOpt = Annotated[
    str | None,
    typer.Option(
        "--filter",
        "-f",
        help="Average only the float leaves whose name matches (the rest: the last step's): "
        + o.LEAF_PATTERN_HELP.split(": ", 1)[1],
        show_default=False,
        metavar="PATTERN",
    ),
]
OptimizerOpt = Annotated[
    str,
    typer.Option(
        "--optimizer",
        help="Optimizer state: carry (the last step's) or drop (left out: restore the "
        "parameters and start a fresh optimizer).",
        metavar="carry|drop",
    ),
]
StepOutOpt = Annotated[
    int | None,
    typer.Option(
        "--step-out", help="Step number to write (default: the last step's).", show_default=False
    ),
]


def average(
    ctx: typer.Context,
    src: AverageSourceArg,
    dst: AverageDestArg,
    steps: StepsOpt = None,
    weights: WeightsOpt = None,
    ema: EmaOpt = None,
    filter_: AverageFilterOpt = None,
    match: o.MatchAliasOpt = None,
    optimizer: OptimizerOpt = "carry",
    item: o.ItemOpt = None,
    step_out: StepOutOpt = None,
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
    """Average several steps of a run into a new step: each float leaf (parameters, batch
    statistics, EMA copies) becomes the weighted mean of its values at --steps, computed in
    float32 (float64 for float64 leaves) and cast back to its dtype.

    Every other leaf (the step counter, RNG keys, integer leaves, leaves --filter leaves out) is
    the last listed step's; optimizer state is carried from it or dropped (--optimizer). Streams
    block by block under --memory-limit; the new step records the steps and weights in its
    ckpt_history; the source is never modified; the step is written under a tmp name and renamed
    when complete. A leaf whose shape or dtype differs between the steps is a usage error (exit
    2) naming it; nothing is written.
    """
    from ckpt_cli.core.average.plan import parse_weights, plan_average
    from ckpt_cli.core.scale import ScaleOptions

    src, numbers, item = _source_steps(src, steps, item)
    scale = ScaleOptions.from_flags(executor, workers, scheduler, force_split, unit_bytes, threads)
    run = run_context(ctx, json_out, scale, start=not dry_run)
    write = o.write_options(
        run, max_chunk_bytes, memory_limit, zarr3, compression, ocdbt, allow_nonfinite
    )
    plan = plan_average(
        src, dst, numbers, weights=None if weights is None else parse_weights(weights), ema=ema,
        match=o.filter_or_match(filter_, match), optimizer=optimizer, item=item,
        step_out=step_out, write=write, storage=run.storage,
    )  # fmt: skip
    _write(run, plan, dry_run)


def _source_steps(
    src: str, steps: str | None, item: str | None
) -> tuple[str, list[int], str | None]:
    """The source root, the steps to average in order (--steps or SRC@A,B,C) and --item."""
    from ckpt_cli.core.average.plan import parse_steps

    src, steps, item = o.at_steps(src, steps, item)
    if steps is None:
        raise UsageError(
            "average needs the steps to average",
            hint="name them: --steps 400,500,600 or SRC@400,500,600",
        )
    return src, parse_steps(steps), item


def _write(run: Run, plan: AveragePlan, dry_run: bool) -> None:
    """The plan, then the new step streamed under the progress bar, then what was written."""
    from ckpt_cli.commands import _write_text as written
    from ckpt_cli.commands import average_text as render
    from ckpt_cli.core.average.execute import execute

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
    from ckpt_cli.core.average.plan import AverageJSON, AveragePlan

    return JsonOutput((AverageJSON,), AveragePlan.SCHEMA_VERSION)


def _renderer() -> ModuleType:
    """The module that renders the text output."""
    from ckpt_cli.commands import average_text as module

    return module


def _writer() -> Writer[AveragePlan, WriteResult]:
    """The plan ``ckpt_cli.execute`` takes, and the executor it hands that plan to."""
    from ckpt_cli.core.average.execute import execute
    from ckpt_cli.core.average.plan import AveragePlan

    return Writer(AveragePlan, execute)


COMMAND = Command(
    name="average",
    function=average,
    summary="the weighted mean or EMA of several steps' weights as a new step, streaming",
    guides=(("guide", "how-to/average.md"),),
    json_output=_json,
    renderer=_renderer,
    writer=_writer,
    examples=(
        "runs/exp7 runs/exp7-avg --steps 600,900,1000",
        "runs/exp7 avg --steps 600,900,1000 --weights 1,2,3 --dry-run",
        "runs/exp7 ema --steps 900,1000 --ema 0.9 --optimizer drop",
        "runs/exp7@600,900,1000 swa --filter params --dry-run",
    ),
)
