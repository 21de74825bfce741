"""``ckpt cp``: copy a run, a step or a range of steps between local disk and buckets."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Annotated

import typer

from ckpt_cli.commands import _options as o
from ckpt_cli.commands._command import Command, JsonOutput, Writer
from ckpt_cli.commands._complete import complete_root_at_step
from ckpt_cli.commands._context import run_context, write_plan
from ckpt_cli.commands._output import note, warn
from ckpt_cli.errors import Interrupted

if TYPE_CHECKING:
    from ckpt_cli.core.copy.execute import CopyResult
    from ckpt_cli.core.copy.plan import CopyPlan
    from ckpt_cli.core.progress import ProgressFn

CpSourceArg = Annotated[
    str,
    typer.Argument(
        help="A root (every committed step), a step directory, ROOT@STEP / ROOT@100-300, or a "
        "directory of Checkpointer saves (each committed save).",
        autocompletion=complete_root_at_step,
        show_default=False,
    ),
]
CpDestArg = Annotated[
    str,
    typer.Argument(
        help="Destination root (created if missing); steps keep their names.", show_default=False
    ),
]
CpStepOpt = Annotated[
    list[int] | None,
    typer.Option(
        "--step", "-s", help="Copy this step (repeatable).", show_default=False, metavar="N"
    ),
]
CpStepsOpt = Annotated[
    str | None,
    typer.Option(
        "--steps",
        help="Copy the committed steps in these ranges: 100-300, 100- (from 100 on), "
        "-300, 100-300,500.",
        show_default=False,
        metavar="RANGES",
    ),
]
CpLatestOpt = Annotated[bool, typer.Option("--latest", help="Copy the latest committed step.")]
UnfinishedOpt = Annotated[
    bool,
    typer.Option(
        "--unfinished",
        help="Also copy the selected steps a save or deletion did not finish (uncommitted, v1 "
        "partial saves), as they are: never given a commit marker, so they stay unfinished "
        "at the destination. Tmp dirs are never copied.",
    ),
]
CpVerifyOpt = Annotated[
    bool,
    typer.Option(
        "--verify",
        help="Check every file of an item with recorded digests (_CKPT_DIGESTS.json) against "
        "its recorded size and CRC-32 as it is written; a step that fails is not committed "
        "(exit 1).",
    ),
]
CpDryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="Print the plan (steps, objects, bytes); copy nothing.")
]
ConcurrencyOpt = Annotated[
    int,
    typer.Option(
        "--concurrency",
        min=1,
        help="Files copied at once (object stores answer each request in tens of ms: many "
        "small files need many in flight).",
        metavar="N",
    ),
]


def cp(
    ctx: typer.Context,
    src: CpSourceArg,
    dst: CpDestArg,
    step: CpStepOpt = None,
    steps: CpStepsOpt = None,
    latest: CpLatestOpt = False,
    unfinished: UnfinishedOpt = False,
    verify: CpVerifyOpt = False,
    concurrency: ConcurrencyOpt = 16,
    dry_run: CpDryRunOpt = False,
    json_out: o.JsonOpt = False,
) -> None:
    """Copy a run, a step or a range of steps between local disk, s3:// and gs://, as Orbax needs it.

    Every step's data files go first and its commit markers last (`_CHECKPOINT_METADATA`, the
    `commit_success.txt` files, then locally the rename of the tmp dir), so no step at the
    destination looks committed before all its data is there; a bucket copy of a local step
    without `commit_success.txt` gets one (Orbax #394). Files stream in pieces, several at
    once. Rerun after a kill: files already at the destination with the right size and
    checksum are kept, the rest is copied; committed steps there are checked, never changed.
    Interrupted (Ctrl-C, SIGTERM), it says which steps it copied and keeps the files of the
    step it was copying where no reader takes them for a step (a tmp dir; in a bucket the step
    without commit_success.txt), for the rerun to resume.
    Unfinished and uncommitted source steps are not copied. Checkpointer saves side by side
    (`ckpt_dir/state`) are copied save by save (`DST/state`); step options do not apply.

    Exit codes: 0 copied · 1 --verify found a file unlike its recorded digest · 2 usage ·
    3 not a checkpoint, unreadable, or refused (a different step at the destination).
    """
    from ckpt_cli.commands import cp_text as render
    from ckpt_cli.core.copy.plan import plan_copy

    run = run_context(ctx, json_out)
    plan = plan_copy(
        src,
        dst,
        steps=step,
        step_ranges=steps,
        latest=latest,
        verify=verify,
        concurrency=concurrency,
        storage=run.storage,
        unfinished=unfinished,
    )
    write_plan(
        run,
        plan,
        _execute,
        dry_run=dry_run,
        print_plan=render.print_plan,
        print_result=render.print_result,
        warnings=plan.warnings,
    )


def _execute(plan: CopyPlan, on_progress: ProgressFn | None) -> CopyResult:
    """The copy, then its notes on open uploads cleaned up; interrupted, what it leaves."""
    from ckpt_cli.commands import cp_text as render
    from ckpt_cli.commands._write_text import cleanup_notes
    from ckpt_cli.core.copy.execute import execute_copy, left_behind

    try:
        result = execute_copy(plan, on_progress)
    except Interrupted:
        # Kept, not removed: a rerun resumes the unfinished step from what it holds.
        note(render.interrupted_note(left_behind(plan)))
        raise
    for message in cleanup_notes(result.uploads):
        note(message)
    for message in result.uploads.failed:
        warn(message)
    return result


def _json() -> JsonOutput:
    """What ``--json`` prints (loaded when asked: ``ckpt --help`` imports no core module)."""
    from ckpt_cli.core.copy.plan import CopyPlan, CpJSON

    return JsonOutput((CpJSON,), CopyPlan.SCHEMA_VERSION)


def _renderer() -> ModuleType:
    """The module that renders the text output."""
    from ckpt_cli.commands import cp_text as module

    return module


def _writer() -> Writer[CopyPlan, CopyResult]:
    """The plan ``ckpt_cli.execute`` takes, and the executor it hands that plan to."""
    from ckpt_cli.core.copy.execute import execute_copy as execute
    from ckpt_cli.core.copy.plan import CopyPlan

    return Writer(CopyPlan, execute)


COMMAND = Command(
    name="cp",
    function=cp,
    summary="copy a run, a step or `--steps 100-300` between local disk, `s3://` and `gs://`: data first, commit markers last, resumable after a kill, `--verify` against recorded digests",
    guides=(("guide", "how-to/object-storage.md#copying-runs-ckpt-cp"),),
    json_output=_json,
    renderer=_renderer,
    writer=_writer,
    examples=(
        "runs/exp7 s3://bucket/exp7",
        "s3://bucket/exp7 gs://other/exp7 --steps 100-300 --verify",
        "gs://other/exp7@300 runs/restored --dry-run",
    ),
)
