"""``ckpt prune``: delete the steps a retention policy does not keep, after showing the plan."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from enum import Enum
from typing import Annotated

import typer

from ckpt_cli.commands._common import JsonOpt, emit_json, stderr_console, warn
from ckpt_cli.commands._render_prune import render_outcome, render_plan
from ckpt_cli.core.prune.execute import PruneOutcome, PruneProgress, execute_plan, prune_lock
from ckpt_cli.core.prune.plan import SYMLINK_KEPT, PrunePlan, plan_prune, scan_root
from ckpt_cli.core.prune.policy import Policy, parse_duration
from ckpt_cli.core.storage import open_location
from ckpt_cli.errors import RefusedError, StorageError


class Mode(str, Enum):
    min = "min"
    max = "max"


def _count(flag: str, help_: str) -> object:
    return typer.Option(flag, min=1, help=help_, show_default=False, metavar="N")


def prune(
    root: Annotated[
        str, typer.Argument(help="A CheckpointManager root (the directory holding the steps).")
    ],
    keep_last: Annotated[int | None, _count("--keep-last", "Keep the N newest steps.")] = None,
    keep_every: Annotated[
        int | None, _count("--keep-every", "Keep steps divisible by N (Orbax keep_period).")
    ] = None,
    keep_step: Annotated[
        list[int] | None,
        typer.Option(
            "--keep-step", help="Keep this step (repeatable).", show_default=False, metavar="STEP"
        ),
    ] = None,
    keep_within: Annotated[
        str | None,
        typer.Option(
            "--keep-within",
            help="Keep steps committed within this long before now: 90m, 36h, 7d, 2w.",
            show_default=False,
            metavar="DURATION",
        ),
    ] = None,
    keep_hourly: Annotated[
        int | None, _count("--keep-hourly", "Newest step of each of the last N hours with one.")
    ] = None,
    keep_daily: Annotated[
        int | None, _count("--keep-daily", "Newest step of each of the last N days (UTC).")
    ] = None,
    keep_weekly: Annotated[
        int | None, _count("--keep-weekly", "Newest step of each of the last N ISO weeks.")
    ] = None,
    keep_monthly: Annotated[
        int | None, _count("--keep-monthly", "Newest step of each of the last N months.")
    ] = None,
    keep_best: Annotated[
        int | None, _count("--keep-best", "Keep the N best steps by --metric.")
    ] = None,
    metric: Annotated[
        str | None,
        typer.Option(
            help="Metric of metrics/metrics to rank by (--keep-best).", show_default=False
        ),
    ] = None,
    mode: Annotated[
        Mode, typer.Option(help="Best is the lowest (min) or highest (max).")
    ] = Mode.min,
    keep_missing_metric: Annotated[
        bool,
        typer.Option(
            "--keep-missing-metric/--drop-missing-metric",
            help="With --keep-best: keep steps that lack the metric (Orbax's default), or let "
            "the other rules decide.",
        ),
    ] = True,
    clean_tmp: Annotated[
        bool,
        typer.Option("--clean-tmp", help="Also remove unfinished saves (*.orbax-checkpoint-tmp*)."),
    ] = False,
    tmp_min_age: Annotated[
        str,
        typer.Option(
            help="Only remove unfinished saves unmodified for this long (a save in progress "
            "writes all the time).",
            metavar="DURATION",
        ),
    ] = "1h",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", "-n", help="Print the plan; change nothing.")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Delete the steps that no retention rule keeps; show the plan first.

    Rules are OR-ed: a step is kept if any rule keeps it, and the plan shows why. The newest
    committed step is always kept; a command without any rule is refused. Unfinished saves are
    removed only with --clean-tmp, and only once idle for --tmp-min-age; trash left by an
    interrupted prune is always removed. Steps are renamed to a hidden trash name first, then
    deleted. A symlinked step is never deleted. On a terminal prune asks before deleting; else it
    needs --yes. Exit codes: 0 done (or nothing to do), 2 bad options, 3 refused (not confirmed,
    another prune running) or a deletion failed.
    """
    policy = Policy(
        keep_last=keep_last or 0,
        keep_every=keep_every or 0,
        keep_steps=frozenset(keep_step or ()),
        keep_within=parse_duration(keep_within, option="--keep-within") if keep_within else None,
        keep_hourly=keep_hourly or 0,
        keep_daily=keep_daily or 0,
        keep_weekly=keep_weekly or 0,
        keep_monthly=keep_monthly or 0,
        keep_best=keep_best or 0,
        metric=metric,
        mode=mode.value,
        keep_missing_metric=keep_missing_metric,
    )
    min_age = parse_duration(tmp_min_age, option="--tmp-min-age")
    location = open_location(root)

    def make_plan() -> PrunePlan:
        now = datetime.now(timezone.utc)
        plan = plan_prune(
            scan_root(location), policy, now, clean_tmp=clean_tmp, tmp_min_age=min_age
        )
        if not json_out:
            render_plan(plan, dry_run=dry_run)
        for k in plan.keep:
            if SYMLINK_KEPT in k.reasons:
                warn(f"step {k.step} is a symlink: kept, prune never deletes through a link")
        for missing in sorted(policy.keep_steps - {k.step for k in plan.keep}):
            warn(f"--keep-step {missing}: no committed step {missing} in {plan.root}")
        return plan

    if dry_run:
        _emit(make_plan(), None, json_out, dry_run=True)
        sys.stderr.write("dry run: nothing was changed\n")
        return
    with prune_lock(location):
        plan = make_plan()
        if plan.is_noop:
            _emit(plan, PruneOutcome((), (), ()), json_out, dry_run=False)
            return
        if not yes:
            _confirm(plan, json_out)
        with _progress(enabled=not json_out and sys.stderr.isatty()) as on_progress:
            outcome = execute_plan(plan, location, on_progress=on_progress)
    _emit(plan, outcome, json_out, dry_run=False)
    for s in (*outcome.skipped, *outcome.failed):
        warn(f"{s.name} not deleted: {s.why}")
    if outcome.failed:
        raise StorageError(
            f"{len(outcome.failed)} deletions failed; every kept step is intact",
            hint="fix the cause and run the prune again: it removes the leftover trash",
        )


def _emit(plan: PrunePlan, outcome: PruneOutcome | None, json_out: bool, *, dry_run: bool) -> None:
    if json_out:
        doc = {**plan.to_json(), "dry_run": dry_run}
        emit_json({**doc, "outcome": outcome.to_json() if outcome else None})
    elif outcome is not None:
        render_outcome(plan, outcome)


def _interactive() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def _confirm(plan: PrunePlan, json_out: bool) -> None:
    if json_out or not _interactive():
        _emit(plan, None, json_out, dry_run=False)
        why = "--json never asks" if json_out else "there is no terminal to ask on"
        raise RefusedError(
            f"refusing to delete without confirmation: {why}",
            hint="rerun with --yes to delete, or --dry-run to only print the plan",
        )
    question = f"Delete {len(plan.delete)} steps and {len(plan.clean)} other directories?"
    try:
        confirmed = typer.confirm(question, default=False, err=True)
    except typer.Abort:
        confirmed = False
    if not confirmed:
        raise RefusedError("not confirmed: nothing deleted")


@contextmanager
def _progress(*, enabled: bool) -> Iterator[Callable[[PruneProgress], None] | None]:
    if not enabled:
        yield None
        return
    from rich.progress import Progress

    with Progress(console=stderr_console(), transient=True) as bar:
        task = bar.add_task("pruning", total=None)

        def on_progress(event: PruneProgress) -> None:
            verb = "hiding" if event.action == "hide" else "deleting"
            bar.update(
                task, description=f"{verb} {event.name}", completed=event.done, total=event.total
            )

        yield on_progress
