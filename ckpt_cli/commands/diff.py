"""``ckpt diff``: compare two checkpoints leaf by leaf, values streamed chunk by chunk."""

from __future__ import annotations

from types import ModuleType
from typing import Annotated

import typer

from ckpt_cli.commands._command import Command, JsonOutput
from ckpt_cli.commands._complete import complete_root_at_step
from ckpt_cli.commands._context import run_context
from ckpt_cli.commands._options import (
    MEMORY_LIMIT,
    THREADS,
    FilterOpt,
    ItemOpt,
    JsonOpt,
    MemoryLimitOpt,
    ThreadsOpt,
)
from ckpt_cli.commands._output import emit_json
from ckpt_cli.errors import EXIT_PROBLEMS

ItemAOpt = Annotated[
    str | None,
    typer.Option(
        "--item-a", help="Item of A (also A@STEP:ITEM).", show_default=False, metavar="NAME"
    ),
]

ItemBOpt = Annotated[
    str | None,
    typer.Option(
        "--item-b", help="Item of B (also B@STEP:ITEM).", show_default=False, metavar="NAME"
    ),
]

SideArg = Annotated[
    str,
    typer.Argument(
        help="Root, step or item; ROOT@STEP picks a step, ROOT@STEP:ITEM an item.",
        autocompletion=complete_root_at_step,
    ),
]

BothStepsOpt = Annotated[
    int | None,
    typer.Option("--step", "-s", help="Step to take from both roots.", show_default=False),
]

StepAOpt = Annotated[
    int | None, typer.Option("--step-a", help="Step of A's root.", show_default=False)
]

StepBOpt = Annotated[
    int | None, typer.Option("--step-b", help="Step of B's root.", show_default=False)
]

AtolOpt = Annotated[
    float, typer.Option("--atol", help="Absolute tolerance: |a-b| <= atol + rtol*|b|.")
]

RtolOpt = Annotated[float, typer.Option("--rtol", help="Relative tolerance.")]

CompareCastOpt = Annotated[
    bool,
    typer.Option(
        "--compare-cast",
        help="Compare leaves whose dtype changed as float64 instead of counting them as different.",
    ),
]

AllOpt = Annotated[
    bool, typer.Option("--all", help="List equal leaves too, not only the differences.")
]

StructureOpt = Annotated[
    bool,
    typer.Option(
        "--structure",
        help=(
            "Compare names, dtypes, shapes and layouts (mesh, partition spec, chunk grid) "
            "only: no array data is read."
        ),
    ),
]


def diff(
    ctx: typer.Context,
    a: SideArg,
    b: SideArg,
    step: BothStepsOpt = None,
    step_a: StepAOpt = None,
    step_b: StepBOpt = None,
    item: ItemOpt = None,
    item_a: ItemAOpt = None,
    item_b: ItemBOpt = None,
    atol: AtolOpt = 0.0,
    rtol: RtolOpt = 0.0,
    compare_cast: CompareCastOpt = False,
    filter_: FilterOpt = None,
    show_all: AllOpt = False,
    structure: StructureOpt = False,
    memory_limit: MemoryLimitOpt = MEMORY_LIMIT,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = THREADS,
) -> None:
    """Compare two checkpoints (any layouts, steps or items) leaf by leaf.

    Reports leaves only in A or only in B, changed dtype or shape, and for the others whether
    the values are equal within --atol/--rtol, with the max absolute and relative difference.
    Reads both sides block by block (a large chunk in slabs) under --memory-limit, whatever the
    leaf size; --structure reads no array data. NaN equals NaN. Each side reads its step's state
    item unless --item (both), --item-a/--item-b or ROOT@STEP:ITEM names one; two steps of
    several PyTree items are compared item by item of the same name.

    Exit codes: 0 equal within tolerance · 1 different · 2 usage · 3 not a checkpoint.
    """
    from ckpt_cli.commands import diff_text as render
    from ckpt_cli.core.diff.items import diff_paths
    from ckpt_cli.core.scale import ScaleOptions

    run = run_context(ctx, json_out, ScaleOptions(threads=threads))
    with run.progress() as on_progress:
        report = diff_paths(
            a,
            b,
            step=step,
            step_a=step_a,
            step_b=step_b,
            item=item,
            item_a=item_a,
            item_b=item_b,
            atol=atol,
            rtol=rtol,
            compare_cast=compare_cast,
            name_filter=filter_,
            on_progress=on_progress,
            storage=run.storage,
            memory_limit=memory_limit,
            structure_only=structure,
        )
    emit_json(report) if json_out else render.print_report(report, show_all)
    if not report.equal:
        raise typer.Exit(EXIT_PROBLEMS)


def _json() -> JsonOutput:
    """What ``--json`` prints (loaded when asked: ``ckpt --help`` imports no core module)."""
    from ckpt_cli.core.diff import DiffJSON, DiffReport

    return JsonOutput((DiffJSON,), DiffReport.SCHEMA_VERSION)


def _renderer() -> ModuleType:
    """The module that renders the text output."""
    from ckpt_cli.commands import diff_text as module

    return module


COMMAND = Command(
    name="diff",
    function=diff,
    summary="leaf by leaf equality within tolerances, any two layouts",
    guides=(("guide", "how-to/diff.md"),),
    json_output=_json,
    renderer=_renderer,
    examples=(
        "runs/exp7@900 runs/exp7@1000  # exit 1: the values differ",
        "runs/exp7 runs/exp7-4x2 --atol 1e-6",
        "runs/a runs/b --structure",
    ),
)
