"""``ckpt trend``: what happened to the weights across a run's steps."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Annotated

import typer

from ckpt_cli.commands._command import Command, JsonOutput
from ckpt_cli.commands._context import run_context
from ckpt_cli.commands._options import (
    THREADS,
    UNIT_BYTES,
    ExecutorOpt,
    FilterOpt,
    ForceSplitOpt,
    ItemOpt,
    JsonOpt,
    MatchAliasOpt,
    SchedulerOpt,
    ThreadsOpt,
    UnitBytesOpt,
    WorkersOpt,
    at_steps,
    filter_or_match,
)
from ckpt_cli.commands._output import emit_json, note, warn
from ckpt_cli.errors import EXIT_PROBLEMS

if TYPE_CHECKING:
    from ckpt_cli.core.trend.types import TrendReport

TrendStepsOpt = Annotated[
    str | None,
    typer.Option(
        "--steps",
        help="Only the committed steps in these ranges: 100-300, 100- (from 100 on), -300, "
        "100-300,500. Default: every committed step.",
        show_default=False,
        metavar="RANGES",
    ),
]
TrendPathArg = Annotated[
    str,
    typer.Argument(
        help="A CheckpointManager root (ROOT@RANGES: those steps, as --steps; ROOT@RANGES:ITEM "
        "adds --item), a step directory or an item directory.",
        show_default=False,
    ),
]
CheckOpt = Annotated[
    bool,
    typer.Option("--check", help="Exit 1 when a finding is an error (NaN/Inf in a leaf)."),
]
HtmlOpt = Annotated[
    str | None,
    typer.Option(
        "--html",
        help="Also write one self-contained page to FILE (inline SVG, no script, no network): "
        "findings, metrics, norm and update-ratio curves, a leaf x step heat map.",
        metavar="FILE",
        show_default=False,
    ),
]
GroupOpt = Annotated[
    str,
    typer.Option(
        "--group",
        help="How the tables (and the page's plots) group the leaves: part (parameters, "
        "optimizer state, the rest), module (the name without its last component), "
        "depth (the first 2 components of the name) or depth:N.",
        metavar="HOW",
    ),
]
ExplodeOpt = Annotated[
    float,
    typer.Option(
        "--explode",
        min=1.0,
        help="An update ratio above this many times the leaf's median is `exploding`.",
        metavar="X",
    ),
]
VanishOpt = Annotated[
    float,
    typer.Option(
        "--vanish",
        min=1.0,
        help="An update ratio below the leaf's median divided by this is `vanishing`.",
        metavar="X",
    ),
]
NormJumpOpt = Annotated[
    float,
    typer.Option(
        "--norm-jump",
        min=1.0,
        help="A norm growing or shrinking by more than this factor between listed steps is a "
        "`norm-jump`.",
        metavar="X",
    ),
]

DeadUnitsOpt = Annotated[
    int,
    typer.Option(
        "--dead-units",
        min=1,
        help="A leaf of 2+ dimensions with at least N units (last axis) all zero at a step "
        "that were not at the step before is `dead`.",
        metavar="N",
    ),
]

ReadAllOpt = Annotated[
    bool,
    typer.Option(
        "--read-all",
        help="Read every step, even a leaf whose recorded digest (verify --record, save-time "
        "digests) equals the previous step's: by default such a leaf is not read again.",
    ),
]


def trend(
    ctx: typer.Context,
    path: TrendPathArg,
    steps: TrendStepsOpt = None,
    item: ItemOpt = None,
    filter_: FilterOpt = None,
    match: MatchAliasOpt = None,
    group: GroupOpt = "part",
    check: CheckOpt = False,
    html: HtmlOpt = None,
    explode: ExplodeOpt = 10.0,
    vanish: VanishOpt = 10.0,
    norm_jump: NormJumpOpt = 4.0,
    dead_units: DeadUnitsOpt = 1,
    read_all: ReadAllOpt = False,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = THREADS,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = 1,
    scheduler: SchedulerOpt = None,
    unit_bytes: UnitBytesOpt = UNIT_BYTES,
    force_split: ForceSplitOpt = False,
) -> None:
    """Did the run train? Every array leaf at every committed step, read block by block:
    norm, rms, max |x|, mean, fraction of zeros, NaN/Inf count, and the update from the step
    before (its norm, and the ratio to the previous norm); the run's metrics; findings first.

    Findings: nonfinite (error: the first step a leaf holds NaN/Inf), frozen (a float leaf that
    never changes while others do), zero (all zeros at every step), dead (units, along the last
    axis, all zero that were not at the step before, --dead-units), exploding/vanishing (an
    update ratio far from the leaf's median, --explode/--vanish), norm-jump (--norm-jump).

    --workers N (local processes) or --executor dask reads in units of leaves and of runs of
    blocks (--unit-bytes) on the workers, as verify --deep does; the figures are the same.

    Exit codes: 0 done (with --check: no error-level finding) · 1 --check found an error ·
    2 usage · 3 not a checkpoint or unreadable.
    """
    from ckpt_cli.core.scale import ScaleOptions
    from ckpt_cli.core.storage import open_location
    from ckpt_cli.core.trend.plan import plan_trend
    from ckpt_cli.core.trend.run import trend as run_trend
    from ckpt_cli.core.trend.types import TrendOptions

    path, steps, item = at_steps(path, steps, item)
    pattern = filter_or_match(filter_, match)
    options = TrendOptions(
        steps, item, pattern, explode, vanish, norm_jump, dead_units=dead_units, read_all=read_all
    )
    scale = ScaleOptions.from_flags(executor, workers, scheduler, force_split, unit_bytes, threads)
    _check_group(group)
    run = run_context(ctx, json_out, scale, start=True)
    plan = plan_trend(open_location(path, run.storage), options)
    with run.progress() as on_progress:
        report = run_trend(plan, on_progress, scale.executor, scale.unit_bytes)
    _report(report, json_out, check, html, group)


def _check_group(group: str) -> None:
    from ckpt_cli.commands.trend_text import parse_group
    from ckpt_cli.errors import UsageError

    try:
        parse_group(group)
    except ValueError:
        raise UsageError(
            f"--group {group!r} is not a grouping",
            hint="use part, module, depth or depth:N (N >= 1)",
        ) from None


def _report(report: TrendReport, json_out: bool, check: bool, html: str | None, group: str) -> None:
    from ckpt_cli.commands import trend_text as render

    if html is not None:  # first: a page that cannot be written is the one error
        from ckpt_cli.commands.trend_html import write_html

        write_html(report, html, group)
    if json_out:
        emit_json(report)
    else:
        render.print_report(report, group)
        if report.scale is not None:
            note(render.scale_line(report.scale))
    if check and not report.ok:
        errors = sum(1 for f in report.findings if f.severity == "error")
        if json_out:
            warn(f"--check: {errors} error-level finding(s)")
        raise typer.Exit(EXIT_PROBLEMS)


def _json() -> JsonOutput:
    """What ``--json`` prints (loaded when asked: ``ckpt --help`` imports no core module)."""
    from ckpt_cli.core.trend.types import TrendJSON, TrendReport

    return JsonOutput((TrendJSON,), TrendReport.SCHEMA_VERSION)


def _renderer() -> ModuleType:
    """The module that renders the text output."""
    from ckpt_cli.commands import trend_text as module

    return module


COMMAND = Command(
    name="trend",
    function=trend,
    summary="did the run train? norms, updates, NaN/Inf, frozen and zero leaves across steps",
    guides=(("guide", "how-to/trend.md"),),
    json_output=_json,
    renderer=_renderer,
    examples=(
        "runs/exp7",
        "runs/exp7 --steps 500- --filter params --json",
        "runs/exp7 --check",
        "runs/exp7 --group module --html trend.html",
    ),
)
