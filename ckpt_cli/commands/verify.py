"""``ckpt verify``: structure, data and recorded digests of a root, a step or an item."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ckpt_cli.commands._command import Command, JsonOutput
from ckpt_cli.commands._complete import complete_item, complete_step
from ckpt_cli.commands._context import run_context
from ckpt_cli.commands._options import (
    THREADS,
    UNIT_BYTES,
    ExecutorOpt,
    ForceSplitOpt,
    JsonOpt,
    SchedulerOpt,
    SizeParser,
    StepPathArg,
    ThreadsOpt,
    UnitBytesOpt,
    WorkersOpt,
    at_step,
)
from ckpt_cli.commands._output import emit_json, note, warn
from ckpt_cli.errors import EXIT_PROBLEMS, UsageError

if TYPE_CHECKING:
    from ckpt_cli.core.scale import ScaleOptions
    from ckpt_cli.core.verify.types import SampleSpec, VerifyOptions, VerifyReport

VerifyStepOpt = Annotated[
    int | None,
    typer.Option(
        "--step",
        "-s",
        help="Check only this step of a root.",
        show_default=False,
        metavar="N",
        autocompletion=complete_step,
    ),
]

VerifyItemOpt = Annotated[
    str | None,
    typer.Option(
        "--item",
        "-i",
        help="Check only this item of each step checked (default: every item).",
        show_default=False,
        metavar="NAME",
        autocompletion=complete_item,
    ),
]

LatestOpt = Annotated[
    bool, typer.Option("--latest", help="Check only the latest committed step of a root.")
]

DeepOpt = Annotated[
    bool,
    typer.Option(
        "--deep",
        help="Decode every chunk (streamed, in parallel): NaN/Inf per leaf, recorded "
        "digests and file checksums.",
    ),
]

RecordOpt = Annotated[
    bool,
    typer.Option(
        "--record",
        help="After a clean deep pass, store digests in each item (_CKPT_DIGESTS.json) "
        "that every later verify checks. Implies --deep.",
    ),
]

UpgradeOpt = Annotated[
    bool,
    typer.Option(
        "--upgrade",
        help="With --record: replace an old SHA-256 record by ld1 digests, in one read that "
        "first checks the old digests (an item that fails them is not recorded).",
    ),
]

SampleOpt = Annotated[
    Any,
    typer.Option(
        "--sample",
        parser=SizeParser("--sample", sample=True),
        metavar="SIZE|N%",
        help="Decode a random subset of chunks: a percentage of the bytes ('5%') or an "
        "amount ('2GiB'). Checks the files holding them against recorded digests.",
        show_default=False,
    ),
]

SeedOpt = Annotated[
    int | None,
    typer.Option("--seed", help="Seed choosing the --sample subset.", show_default=False),
]

StrictOpt = Annotated[
    bool, typer.Option("--strict", help="Treat warnings as errors (exit 1 on any).")
]

FailOnNonfiniteOpt = Annotated[
    bool, typer.Option("--fail-on-nonfinite", help="Treat NaN/Inf in a leaf as an error.")
]

MarkCommittedOpt = Annotated[
    bool,
    typer.Option(
        "--mark-committed",
        help="After a clean deep check, put commit_success.txt into each checked step that "
        "lacks it: every step of a root (the one-time stamp older steps need when a writer "
        "switches to commit-file mode), one with --step N, or the step given; for steps "
        "copied to a bucket without it (Orbax #394). A step with errors is not marked (exit "
        "1); a save that never finished (null commit timestamp) is refused (exit 3).",
    ),
]

MaxDurationOpt = Annotated[
    str | None,
    typer.Option(
        "--max-duration",
        help="With --deep: read for at most this long (90s, 10m, 2h), counted from the start; "
        "reports the coverage. Exit code on what was seen.",
        metavar="DURATION",
        show_default=False,
    ),
]

RotateOpt = Annotated[
    bool,
    typer.Option(
        "--rotate",
        help="With --max-duration: continue where the last run stopped (state in each item's "
        "_CKPT_VERIFY_STATE.json), so N runs cover every chunk.",
    ),
]

JunitOpt = Annotated[
    str | None,
    typer.Option(
        "--junit", help="Also write a JUnit XML report to FILE.", metavar="FILE", show_default=False
    ),
]


def verify(
    ctx: typer.Context,
    path: StepPathArg,
    step: VerifyStepOpt = None,
    item: VerifyItemOpt = None,
    latest: LatestOpt = False,
    deep: DeepOpt = False,
    record: RecordOpt = False,
    upgrade: UpgradeOpt = False,
    sample: SampleOpt = None,
    seed: SeedOpt = None,
    strict: StrictOpt = False,
    fail_on_nonfinite: FailOnNonfiniteOpt = False,
    mark_committed: MarkCommittedOpt = False,
    max_duration: MaxDurationOpt = None,
    rotate: RotateOpt = False,
    junit: JunitOpt = None,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = THREADS,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = 1,
    scheduler: SchedulerOpt = None,
    unit_bytes: UnitBytesOpt = UNIT_BYTES,
    force_split: ForceSplitOpt = False,
) -> None:
    """Check a checkpoint for damage: a root (all committed steps), a step or an item; or
    safetensors: a file, an index or a Hugging Face folder of shards.

    Structure (default, no array data): JSON files, leaves against arrays, zarr headers against
    write shapes and sharding, every chunk key, OCDBT CRCs and reference bounds, unknown files,
    symlinks leaving the checkpoint, commit state. --deep also decodes every chunk; --record
    stores digests so later runs catch silently changed bytes; --sample checks a random subset
    (5%, 2GiB) or the N-th of T disjoint ones (2/7). --max-duration 10m bounds a deep run and
    reports its coverage; --rotate makes successive runs continue until every chunk was read.

    Safetensors (a local .safetensors file, an index, or a Hugging Face folder): every header
    (JSON, size, dtypes, offsets tiling the file), the index against its shards, config.json;
    --deep reads every tensor in blocks: NaN/Inf, and the ld1 digests `ckpt export` recorded.

    Exit codes: 0 no errors (warnings allowed unless --strict) · 1 problems found · 2 usage ·
    3 not a checkpoint or unreadable.
    """
    # The core and rich.table are imported here, so that `ckpt --help` and `ls` do not pay.
    from ckpt_cli.core.scale import ScaleOptions
    from ckpt_cli.core.storage import open_location
    from ckpt_cli.core.verify.run import verify_path

    path, step, item = at_step(path, step, item)
    options = _verify_options(
        step, latest, deep, record, sample, seed, strict, fail_on_nonfinite, mark_committed,
        max_duration, rotate, upgrade, item,
    )  # fmt: skip
    scale = ScaleOptions.from_flags(executor, workers, scheduler, force_split, unit_bytes, threads)
    if _verify_safetensors(ctx, path, options, scale, json_out, junit):
        return
    run = run_context(ctx, json_out, scale, start=deep or record)
    location = open_location(path, run.storage)
    with run.progress() as on_progress:
        report = verify_path(location, options, on_progress, scale.executor, scale.unit_bytes)
    _report(report, junit, json_out, mark_committed)


def _verify_safetensors(
    ctx: typer.Context,
    path: str,
    options: VerifyOptions,
    scale: ScaleOptions,
    json_out: bool,
    junit: str | None,
) -> bool:
    """A safetensors file, index or folder checked and reported; False for anything else."""
    from ckpt_cli.core.safetensors.source import is_safetensors_source

    if not is_safetensors_source(path):
        return False
    from ckpt_cli.core.safetensors.checks import verify_safetensors

    if scale.scaled:
        raise UsageError(
            "--workers and --executor apply to Orbax checkpoints: safetensors files are "
            "read in this process"
        )
    run = run_context(ctx, json_out, scale)
    with run.progress() as on_progress:
        report = verify_safetensors(path, options, on_progress)
    _report(report, junit, json_out, mark_committed=False)
    return True


def _verify_options(
    step: int | None,
    latest: bool,
    deep: bool,
    record: bool,
    sample: SampleSpec | None,
    seed: int | None,
    strict: bool,
    fail_on_nonfinite: bool,
    mark_committed: bool,
    max_duration: str | None,
    rotate: bool,
    upgrade: bool = False,
    item: str | None = None,
) -> VerifyOptions:
    """What to check, from the command line."""
    from ckpt_cli.core.verify.types import VerifyOptions

    if latest and step is not None:
        raise UsageError(
            f"--latest and --step {step} both choose the step to check: give one of them"
        )
    if mark_committed and item is not None:
        raise UsageError(f"--mark-committed needs every item checked: drop --item {item}")
    return VerifyOptions(
        step=step,
        latest=latest,
        item=item,
        deep=deep,
        record=record,
        upgrade=upgrade,
        sample=sample,
        seed=seed,
        strict=strict,
        fail_on_nonfinite=fail_on_nonfinite,
        mark_committed=mark_committed,
        max_duration=_seconds(max_duration),
        rotate=rotate,
    )


def _report(report: VerifyReport, junit: str | None, json_out: bool, mark_committed: bool) -> None:
    """The JUnit file, the document or the text, the warnings and notes; exit 1 on problems."""
    from ckpt_cli.commands import verify_text as render

    if junit is not None:  # first: a report that cannot be written is the one document
        render.write_junit(report, junit)
    if json_out:
        emit_json(report)
    else:
        render.print_report(report)
    for kind, message in render.messages(report, json_out, mark_committed):
        (warn if kind == "warning" else note)(message)
    if not report.ok:
        raise typer.Exit(EXIT_PROBLEMS)


def _seconds(text: str | None) -> float | None:
    if text is None:
        return None
    from ckpt_cli.core.prune.policy import parse_duration

    return parse_duration(text, option="--max-duration").total_seconds()


def _json() -> JsonOutput:
    """What ``--json`` prints (loaded when asked: ``ckpt --help`` imports no core module)."""
    from ckpt_cli.core.verify.types import VerifyJSON, VerifyReport

    return JsonOutput((VerifyJSON,), VerifyReport.SCHEMA_VERSION)


def _renderer() -> ModuleType:
    """The module that renders the text output."""
    from ckpt_cli.commands import verify_text as module

    return module


COMMAND = Command(
    name="verify",
    function=verify,
    summary="damage before a restore finds it: structure, `--deep`, `--sample`, recorded digests, JUnit",
    guides=(("guide", "how-to/verify.md"),),
    json_output=_json,
    renderer=_renderer,
    examples=(
        "runs/exp7 --deep --json",
        "runs/exp7 --record",
        "runs/exp7 --latest --sample 5% --junit verify.xml",
        "export/model.safetensors.index.json --deep",
    ),
)
