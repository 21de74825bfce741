"""``ckpt diff``: compare two checkpoints leaf by leaf, values streamed chunk by chunk."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Annotated

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

if TYPE_CHECKING:
    from ckpt_cli.commands._context import Run
    from ckpt_cli.core.diff import DiffReport
    from ckpt_cli.core.progress import ProgressFn
    from ckpt_cli.core.safetensors.parity import ParityOptions
    from ckpt_cli.core.storage import StorageOptions

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
        help=(
            "Root, step or item (ROOT@STEP picks a step, ROOT@STEP:ITEM an item), or "
            "safetensors: a .safetensors file, a *.safetensors.index.json, a Hugging Face folder."
        ),
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


SpecOpt = Annotated[
    str | None,
    typer.Option(
        "--spec",
        help=(
            "Migrate spec (the YAML export takes) applied to A's names and values before "
            "comparing: A an Orbax checkpoint, B its export."
        ),
        show_default=False,
        metavar="FILE",
    ),
]

IgnoreOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--ignore",
        help="Leave out names this glob or regex finds (repeatable).",
        show_default=False,
        metavar="PATTERN",
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
    spec: SpecOpt = None,
    ignore: IgnoreOpt = None,
    memory_limit: MemoryLimitOpt = MEMORY_LIMIT,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = THREADS,
) -> None:
    """Compare two checkpoints (any layouts, steps or items) leaf by leaf.

    Reports leaves only in A or only in B, changed dtype or shape, and for the others whether
    the values are equal within --atol/--rtol, with the max absolute and relative difference
    and the elements outside the tolerance. Reads both sides block by block (a large chunk in
    slabs) under --memory-limit, whatever the leaf size; --structure reads no array data. NaN
    equals NaN. Each side reads its step's state item unless --item (both), --item-a/--item-b
    or ROOT@STEP:ITEM names one; two steps of several PyTree items are compared item by item of
    the same name.

    Either side may be safetensors (a file, an index, a Hugging Face folder): tensors are
    paired by name, and --spec maps A's leaves first as `ckpt export --spec` does, so a step
    and its export compare equal. --ignore leaves names out on both sides.

    Exit codes: 0 equal within tolerance · 1 different · 2 usage · 3 unreadable (not a
    checkpoint, a damaged safetensors file).
    """
    from ckpt_cli.core.diff.items import diff_paths
    from ckpt_cli.core.safetensors.parity import ParityOptions, needs_parity

    run = _run(ctx, json_out, threads, one_heap=needs_parity(a, b, spec) and not structure)
    ignored = tuple(ignore or ())
    with run.progress() as on_progress:
        if needs_parity(a, b, spec):
            options = ParityOptions(
                spec, atol, rtol, compare_cast, filter_, ignored, memory_limit, structure
            )
            steps, items = (step, step_a, step_b), (item, item_a, item_b)
            report = _parity(a, b, steps, items, options, on_progress, run.storage)
        else:
            report = diff_paths(
                a, b, step=step, step_a=step_a, step_b=step_b, item=item, item_a=item_a,
                item_b=item_b, atol=atol, rtol=rtol, compare_cast=compare_cast,
                name_filter=filter_, on_progress=on_progress, storage=run.storage,
                memory_limit=memory_limit, structure_only=structure, ignore=ignored,
            )  # fmt: skip
    _finish(report, json_out, show_all)


def _run(ctx: typer.Context, json_out: bool, threads: int, *, one_heap: bool) -> Run:
    """The run's context; ``one_heap`` (a parity diff that reads values): one malloc heap for
    every thread, set before the progress thread starts, so freed blocks are reused, not kept
    per read thread (``core/write/memory.py``; a 2 GiB parity diff peaked at 340-372 MiB with
    glibc's heap per thread, 214 MiB with one)."""
    from ckpt_cli.core.scale import ScaleOptions

    if one_heap:
        from ckpt_cli.core.write.memory import bound_allocator

        bound_allocator()
    return run_context(ctx, json_out, ScaleOptions(threads=threads))


def _finish(report: DiffReport, json_out: bool, show_all: bool) -> None:
    """Print the report; exit 1 when the sides differ."""
    from ckpt_cli.commands import diff_text as render

    emit_json(report) if json_out else render.print_report(report, show_all)
    if not report.equal:
        raise typer.Exit(EXIT_PROBLEMS)


def _parity(
    a: str,
    b: str,
    steps: tuple[int | None, int | None, int | None],
    items: tuple[str | None, str | None, str | None],
    options: ParityOptions,
    on_progress: ProgressFn | None,
    storage: StorageOptions | None,
) -> DiffReport:
    """A diff where a side is safetensors or --spec maps A: --step and --item apply to the
    Orbax sides."""
    from ckpt_cli.core.safetensors.parity import diff_parity
    from ckpt_cli.core.safetensors.parity_source import is_safetensors

    both_step, both_item = steps[0], items[0]
    st = (is_safetensors(a), is_safetensors(b))
    return diff_parity(
        a,
        b,
        options,
        steps=(
            steps[1] if steps[1] is not None else None if st[0] else both_step,
            steps[2] if steps[2] is not None else None if st[1] else both_step,
        ),
        items=(
            items[1] or (None if st[0] else both_item),
            items[2] or (None if st[1] else both_item),
        ),
        on_progress=on_progress,
        storage=storage,
    )


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
        "runs/llama hf --spec llama_to_hf.yaml  # a run vs its HF export",
    ),
)
