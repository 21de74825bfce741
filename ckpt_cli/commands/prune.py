"""``ckpt prune``: delete the steps a retention policy does not keep, after showing the plan."""

from __future__ import annotations

import sys
from enum import Enum
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ckpt_cli.commands import _options as o
from ckpt_cli.commands._command import Command, JsonOutput, Writer
from ckpt_cli.commands._context import run_context
from ckpt_cli.commands._output import dry_run_note, emit_json, note, progress_bar, warn
from ckpt_cli.errors import CkptError, Interrupted, RefusedError

if TYPE_CHECKING:
    from datetime import timedelta

    from ckpt_cli.commands._context import Run
    from ckpt_cli.core.format.discovery import Detected
    from ckpt_cli.core.prune.execute import PruneResult
    from ckpt_cli.core.prune.plan import PrunePlan
    from ckpt_cli.core.prune.policy import Policy
    from ckpt_cli.core.storage import Location


class Mode(str, Enum):
    min = "min"
    max = "max"


def _count(flag: str, help_: str) -> Any:
    return typer.Option(flag, min=1, help=help_, show_default=False, metavar="N")


KeepLastOpt = Annotated[int | None, _count("--keep-last", "Keep the N newest steps.")]

KeepLastFiniteOpt = Annotated[
    int | None,
    _count(
        "--keep-last-finite",
        "Keep the N newest steps whose metrics are all finite numbers (no NaN, no inf): what "
        "survives a run that diverged. Judged by the metrics only; a root whose steps record "
        "none is refused.",
    ),
]

KeepEveryOpt = Annotated[
    int | None, _count("--keep-every", "Keep steps divisible by N (Orbax keep_period).")
]

KeepStepOpt = Annotated[
    list[int] | None,
    typer.Option(
        "--keep-step", help="Keep this step (repeatable).", show_default=False, metavar="STEP"
    ),
]

KeepWithinOpt = Annotated[
    str | None,
    typer.Option(
        "--keep-within",
        help="Keep steps committed within this long before now: 90m, 36h, 7d, 2w.",
        show_default=False,
        metavar="DURATION",
    ),
]

KeepHourlyOpt = Annotated[
    int | None, _count("--keep-hourly", "Newest step of each of the last N hours with one.")
]

KeepDailyOpt = Annotated[
    int | None, _count("--keep-daily", "Newest step of each of the last N days (UTC).")
]

KeepWeeklyOpt = Annotated[
    int | None, _count("--keep-weekly", "Newest step of each of the last N ISO weeks.")
]

KeepMonthlyOpt = Annotated[
    int | None, _count("--keep-monthly", "Newest step of each of the last N months.")
]

KeepBestOpt = Annotated[int | None, _count("--keep-best", "Keep the N best steps by --metric.")]

MetricOpt = Annotated[
    str | None,
    typer.Option(
        help="With --keep-best: the key of each step's metrics to rank by, e.g. loss (read "
        "from the step's metrics/metrics, else the metrics of _CHECKPOINT_METADATA); --mode says "
        "whether lower (min) or higher (max) is better.",
        show_default=False,
        metavar="NAME",
    ),
]

ModeOpt = Annotated[
    Mode | None,
    typer.Option(
        help="With --keep-best, required: best is the lowest (min, a loss) or the highest (max, "
        "an accuracy; Orbax's best_mode default).",
        show_default=False,
    ),
]

KeepMissingMetricOpt = Annotated[
    bool,
    typer.Option(
        "--keep-missing-metric/--drop-missing-metric",
        help="With --keep-best: keep steps that lack the metric (Orbax's default), or let "
        "the other rules decide.",
    ),
]

CleanTmpOpt = Annotated[
    bool,
    typer.Option("--clean-tmp", help="Also remove unfinished saves (*.orbax-checkpoint-tmp*)."),
]

TmpMinAgeOpt = Annotated[
    str,
    typer.Option(
        help="Only remove unfinished saves unmodified for this long (a save in progress "
        "writes all the time).",
        metavar="DURATION",
    ),
]

PruneDryRunOpt = Annotated[
    bool, typer.Option("--dry-run", "-n", help="Print the plan; change nothing.")
]

YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")]


def prune(
    ctx: typer.Context,
    root: o.RootArg,
    keep_last: KeepLastOpt = None,
    keep_last_finite: KeepLastFiniteOpt = None,
    keep_every: KeepEveryOpt = None,
    keep_step: KeepStepOpt = None,
    keep_within: KeepWithinOpt = None,
    keep_hourly: KeepHourlyOpt = None,
    keep_daily: KeepDailyOpt = None,
    keep_weekly: KeepWeeklyOpt = None,
    keep_monthly: KeepMonthlyOpt = None,
    keep_best: KeepBestOpt = None,
    metric: MetricOpt = None,
    mode: ModeOpt = None,
    keep_missing_metric: KeepMissingMetricOpt = True,
    clean_tmp: CleanTmpOpt = False,
    tmp_min_age: TmpMinAgeOpt = "1h",
    dry_run: PruneDryRunOpt = False,
    yes: YesOpt = False,
    json_out: o.JsonOpt = False,
) -> None:
    """Delete the steps that no retention rule keeps; show the plan first.

    Rules are OR-ed: a step is kept if any rule keeps it, and the plan shows why. The newest
    committed step is always kept; a command without any rule is refused. A NaN metric ranks worst;
    the plan warns when a rule keeps only NaN steps (--keep-last-finite N keeps healthy ones).
    Unfinished saves are removed only with --clean-tmp, and only once idle for --tmp-min-age (so are
    the multipart uploads a killed writer left open in a bucket, never while a live writer holds the
    root); trash left by an interrupted prune is always removed. Steps are renamed to a hidden trash
    name first, then deleted. A symlinked step is never deleted. On a terminal prune asks before
    deleting; else it needs --yes; answering no deletes nothing and exits 0. Exit codes: 0 done (or
    nothing to do, or declined), 2 bad options, 3 refused (no terminal to ask on and no --yes,
    another prune running) or a deletion failed, 130/143 interrupted.
    """
    from ckpt_cli.core.prune.policy import Policy, parse_duration
    from ckpt_cli.core.storage import open_location

    within = parse_duration(keep_within, option="--keep-within") if keep_within else None
    policy = Policy.from_rules(
        keep_last=keep_last, keep_last_finite=keep_last_finite, keep_every=keep_every,
        keep_steps=keep_step, keep_within=within, keep_hourly=keep_hourly, keep_daily=keep_daily,
        keep_weekly=keep_weekly, keep_monthly=keep_monthly, keep_best=keep_best, metric=metric,
        mode=mode.value if mode is not None else None, keep_missing_metric=keep_missing_metric,
    )  # fmt: skip
    min_age = parse_duration(tmp_min_age, option="--tmp-min-age")
    run = run_context(ctx, json_out)
    location = open_location(root, run.storage)
    if dry_run:
        return _dry_run(run, location, policy, clean_tmp, min_age)
    from ckpt_cli.core.prune.execute import prune_lock

    # Held from the plan to the last deletion: the plan confirmed is the plan executed.
    with prune_lock(location) as found:
        plan = _plan(location, policy, clean_tmp, min_age, found, json_out, dry_run=False)
        if not plan.is_noop and not yes and not _confirm(plan, json_out):
            sys.stdout.write("nothing deleted\n")
            return
        result = _execute(run, plan, dry_run=False)
    _report(result, json_out)


def _dry_run(
    run: Run, location: Location, policy: Policy, clean_tmp: bool, min_age: timedelta
) -> None:
    """The plan and what executing it would do; nothing deleted (no lock: nothing changes)."""
    plan = _plan(location, policy, clean_tmp, min_age, None, run.json_out, dry_run=True)
    _report(_execute(run, plan, dry_run=True), run.json_out)
    dry_run_note()


def _plan(
    location: Location,
    policy: Policy,
    clean_tmp: bool,
    min_age: timedelta,
    detected: Detected | None,
    json_out: bool,
    *,
    dry_run: bool,
) -> PrunePlan:
    """The library's plan, shown (text) with its warnings (stderr)."""
    from ckpt_cli.commands import prune_text as render
    from ckpt_cli.core.prune.plan import plan_prune_root

    plan = plan_prune_root(
        location, policy, clean_tmp=clean_tmp, tmp_min_age=min_age, detected=detected
    )
    if not json_out:
        render.render_plan(plan, dry_run=dry_run)
    for message in render.plan_warnings(plan):
        warn(message)
    return plan


def _execute(run: Run, plan: PrunePlan, *, dry_run: bool) -> PruneResult:
    """The library's ``execute`` (under the lock the plan was made in), with a progress bar;
    on Ctrl-C/SIGTERM, says what is left half deleted."""
    from ckpt_cli.core.prune.execute import execute

    with progress_bar(not run.json_out and not dry_run) as on_progress:
        try:
            return execute(plan, on_progress, dry_run=dry_run)
        except Interrupted:
            assert plan.location is not None  # a plan of plan_prune_root
            _say_what_is_left(plan.location)
            raise


def _report(result: PruneResult, json_out: bool) -> None:
    """What the prune did (or, dry, would do): the uploads cleanup, the document or the text,
    the warnings; a failed deletion ends the run as its error (the document holds the outcome)."""
    from ckpt_cli.commands import prune_text as render
    from ckpt_cli.commands._write_text import cleanup_notes

    if result.uploads is not None:
        for message in cleanup_notes(result.uploads, dry_run=result.dry_run):
            note(message)
        for message in result.uploads.failed:
            warn(message)
    outcome = result.outcome
    failure = outcome.failure if outcome is not None else None
    if failure is not None and json_out:
        failure.result = result.to_json()  # one document: the outcome so far, and the failure
    elif json_out:
        emit_json(result)
    elif outcome is not None:
        render.render_outcome(result.plan, outcome)
    for message in render.outcome_warnings(outcome) if outcome is not None else ():
        warn(message)
    if failure is not None:
        raise failure


def _say_what_is_left(location: Location) -> None:
    """After Ctrl-C/SIGTERM mid-deletion: name the steps left half deleted (hidden from Orbax
    and `ckpt ls`, their files partly gone) and how to finish them."""
    from ckpt_cli.core.prune.plan import scan_root

    try:
        location.refresh()
        trash = scan_root(location).trash
    except CkptError:
        return
    if trash:
        names = ", ".join(t.name for t in trash)
        note(
            f"interrupted while deleting; left half deleted: {names} (hidden from Orbax and "
            "ckpt ls); run the same ckpt prune again to remove them"
        )


def _interactive() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def _confirm(plan: PrunePlan, json_out: bool) -> bool:
    """Whether the person at the terminal said yes (no is not an error); without a terminal to
    ask on (or with --json), a refusal naming --yes."""
    from ckpt_cli.commands import prune_text as render

    if json_out or not _interactive():
        why = "--json never asks" if json_out else "there is no terminal to ask on"
        raise RefusedError(
            f"refusing to delete without confirmation: {why}",
            hint="rerun with --yes to delete, or --dry-run to only print the plan",
            # the plan, in the one document
            result=_planned(plan).to_json() if json_out else None,
        )
    return _ask(render.confirm_question(plan))


def _planned(plan: PrunePlan) -> PruneResult:
    """A plan as a prune's document before anything was deleted."""
    from ckpt_cli.core.prune.execute import PruneResult

    return PruneResult(plan, None, False)


def _ask(question: str) -> bool:
    """``QUESTION [y/N]:`` on stderr, the answer from stdin (empty or end of input: no).

    Waits in short ``select`` calls rather than one blocking read: a Ctrl-C or SIGTERM that
    the kernel hands to another thread of the process (TensorStore's, a listing pool's) does
    not interrupt the main thread's read, so its handler would run only at the next key press.
    """
    import select

    while True:
        sys.stderr.write(f"{question} [y/N]: ")
        sys.stderr.flush()
        try:
            fd = sys.stdin.fileno()
        except (AttributeError, OSError, ValueError):
            fd = None  # not a file (a test's StringIO): read it directly
        while fd is not None and not select.select([fd], [], [], 0.1)[0]:
            pass
        line = sys.stdin.readline()
        if not line:
            sys.stderr.write("\n")
            return False
        answer = line.strip().lower()
        if answer in ("", "n", "no"):
            return False
        if answer in ("y", "yes"):
            return True
        sys.stderr.write("Error: answer y or n\n")


def _json() -> JsonOutput:
    """What ``--json`` prints (loaded when asked: ``ckpt --help`` imports no core module)."""
    from ckpt_cli.core.prune.execute import PruneJSON
    from ckpt_cli.core.prune.plan import PrunePlan

    return JsonOutput((PruneJSON,), PrunePlan.SCHEMA_VERSION)


def _renderer() -> ModuleType:
    """The module that renders the text output."""
    from ckpt_cli.commands import prune_text as module

    return module


def _writer() -> Writer[PrunePlan, PruneResult]:
    """The plan ``ckpt_cli.execute`` takes, and the executor it hands that plan to."""
    from ckpt_cli.core.prune.execute import execute
    from ckpt_cli.core.prune.plan import PrunePlan

    return Writer(PrunePlan, execute)


COMMAND = Command(
    name="prune",
    function=prune,
    summary="delete the steps no retention rule keeps, plan first, reasons shown",
    guides=(("guide", "how-to/retention.md"),),
    json_output=_json,
    renderer=_renderer,
    writer=_writer,
    examples=(
        "runs/exp7 --keep-last 3 --keep-every 1000 --dry-run",
        "runs/exp7 --keep-best 2 --metric loss --mode min --yes",
        "runs/exp7 --keep-last 2 --keep-last-finite 2 --dry-run",
    ),
)
