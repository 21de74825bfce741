"""``ckpt verify``: structure, data and recorded digests of a root, a step or an item."""

from __future__ import annotations

import contextlib
import sys
from typing import Annotated

import typer

from ckpt_cli.commands._common import JsonOpt, PathArg, emit_json, warn
from ckpt_cli.commands._progress import progress_bar
from ckpt_cli.commands._scale import (
    ExecutorOpt,
    SchedulerOpt,
    UnitBytesOpt,
    WorkersOpt,
    executor_spec,
)
from ckpt_cli.commands._scale import unit_bytes as parse_unit_bytes
from ckpt_cli.errors import EXIT_PROBLEMS


def verify(
    path: PathArg,
    step: Annotated[
        int | None,
        typer.Option("--step", "-s", help="Check only this step of a root.", show_default=False),
    ] = None,
    latest: Annotated[
        bool, typer.Option("--latest", help="Check only the latest committed step of a root.")
    ] = False,
    deep: Annotated[
        bool,
        typer.Option(
            "--deep",
            help="Decode every chunk (streamed, in parallel): NaN/Inf per leaf, recorded "
            "digests and file checksums.",
        ),
    ] = False,
    record: Annotated[
        bool,
        typer.Option(
            "--record",
            help="After a clean deep pass, store digests in each item (_CKPT_DIGESTS.json) "
            "that every later verify checks. Implies --deep.",
        ),
    ] = False,
    sample: Annotated[
        str | None,
        typer.Option(
            "--sample",
            help="Decode a random subset of chunks: a percentage of the bytes ('5%') or an "
            "amount ('2GiB'). Checks the files holding them against recorded digests.",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option("--seed", help="Seed choosing the --sample subset.", show_default=False),
    ] = None,
    strict: Annotated[
        bool, typer.Option("--strict", help="Treat warnings as errors (exit 1 on any).")
    ] = False,
    fail_on_nonfinite: Annotated[
        bool,
        typer.Option("--fail-on-nonfinite", help="Treat NaN/Inf in a leaf as an error."),
    ] = False,
    mark_committed: Annotated[
        bool,
        typer.Option(
            "--mark-committed",
            help="After a clean deep check of the one step (a root with --step N, or a step), "
            "put its commit_success.txt: for steps copied to a bucket without it (Orbax #394). "
            "Refused (nothing written, exit 1) when the check finds errors.",
        ),
    ] = False,
    junit: Annotated[
        str | None,
        typer.Option(
            "--junit",
            help="Also write a JUnit XML report to FILE.",
            metavar="FILE",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOpt = False,
    executor: ExecutorOpt = "local",
    workers: WorkersOpt = 1,
    scheduler: SchedulerOpt = None,
    unit_bytes: UnitBytesOpt = "256MiB",
) -> None:
    """Check a checkpoint for damage: a root (all committed steps), a step or an item.

    Structure (default, no array data): JSON files, leaves against arrays, zarr headers against
    write shapes and sharding, every chunk key, OCDBT CRCs and reference bounds, unknown files,
    symlinks leaving the checkpoint, commit state. --deep also decodes every chunk; --record
    stores digests so later runs catch silently changed bytes; --sample checks a random subset.

    Exit codes: 0 no errors (warnings allowed unless --strict) · 1 problems found · 2 usage ·
    3 not a checkpoint or unreadable.
    """
    # The core and rich.table are imported here, so that `ckpt --help` and `ls` do not pay.
    from ckpt_cli.commands import _render_verify as render
    from ckpt_cli.core.storage import open_location
    from ckpt_cli.core.verify.deep import parse_sample
    from ckpt_cli.core.verify.run import verify_path
    from ckpt_cli.core.verify.types import VerifyOptions

    options = VerifyOptions(
        step=step,
        latest=latest,
        deep=deep,
        record=record,
        sample=parse_sample(sample) if sample is not None else None,
        seed=seed,
        strict=strict,
        fail_on_nonfinite=fail_on_nonfinite,
        mark_committed=mark_committed,
    )
    scale = executor_spec(executor, workers, scheduler)
    units = parse_unit_bytes(unit_bytes)
    with contextlib.ExitStack() as stack:
        pool = None
        if scale.scaled and (deep or record):
            from ckpt_cli.core.executor import open_executor

            pool = stack.enter_context(open_executor(scale))
        on_progress = stack.enter_context(progress_bar(not json_out))
        report = verify_path(open_location(path), options, on_progress, pool, units)
    if json_out:
        emit_json(report.to_json())
    else:
        render.print_report(report)
    if junit is not None:
        render.write_junit(report, junit)
    for item in report.items:
        if item.digests == "not-recorded":
            warn(f"digests of {item.path} were not recorded: fix its errors first")
    if report.recorded and not json_out:
        sys.stderr.write(
            f"ckpt: recorded digests in {len(report.recorded)} item(s); later `ckpt verify` "
            "runs check them (file sizes always, values with --deep)\n"
        )
    for marked in report.marked_committed:
        sys.stderr.write(f"ckpt: marked {marked} committed (commit_success.txt)\n")
    if mark_committed and not report.marked_committed:
        warn("not marked committed: the check found errors; nothing was written")
    if not report.ok:
        raise typer.Exit(EXIT_PROBLEMS)
