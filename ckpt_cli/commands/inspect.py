"""``ckpt inspect``: the tree of one item, its step's training state, stats and shard layout."""

from __future__ import annotations

from types import ModuleType
from typing import Annotated

import typer

from ckpt_cli.commands._command import Command, JsonOutput
from ckpt_cli.commands._context import Run, run_context
from ckpt_cli.commands._options import (
    FilterOpt,
    ItemOpt,
    JsonOpt,
    StepOpt,
    StepPathArg,
    at_step,
)
from ckpt_cli.commands._output import emit_json, warn
from ckpt_cli.errors import UsageError

FlatOpt = Annotated[bool, typer.Option("--flat", help="One line per leaf instead of a tree.")]

StatsOpt = Annotated[
    bool,
    typer.Option(
        "--stats",
        help="Add min, max, mean, std, NaN and Inf counts per leaf (reads the data, "
        "chunk by chunk).",
    ),
]

LayoutOpt = Annotated[
    str | None,
    typer.Option(
        "--layout", help="Draw which device holds which block of this leaf.", show_default=False
    ),
]


def inspect(
    ctx: typer.Context,
    path: StepPathArg,
    step: StepOpt = None,
    item: ItemOpt = None,
    flat: FlatOpt = False,
    filter_: FilterOpt = None,
    stats: StatsOpt = False,
    layout: LayoutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show the tree of one item: dtype, shape, bytes, chunking and sharding of every leaf.

    A step of several items shows its state item (the only PyTree beside JSON and ArraySave
    items) and names the others; when no item is the obvious one, it shows every item.

    Judges the training state of the step across all its items: which item and subtrees hold
    the parameters, optimizer state and step (required), RNG state and data order (optional:
    a note when missing), and what resuming loses when one is missing. Reads only metadata
    unless --stats is given. No JAX.

    A local safetensors file, index or Hugging Face folder lists every tensor (dtype, shape,
    bytes, file, offsets), each file's __metadata__ and the folder's config.json.
    """
    # Rendering pulls in rich.tree/table: imported here so `ls` and `--help` do not pay for it.
    from ckpt_cli.commands import inspect_text as render
    from ckpt_cli.core.inspect.step import inspect_path
    from ckpt_cli.core.storage import open_location

    run = run_context(ctx, json_out)
    path, step, item = at_step(path, step, item)
    if _inspect_safetensors(run, path, step, item, layout, filter_, stats, json_out):
        return
    location = open_location(path, run.storage)
    # A bar only for stats worth waiting for.
    with run.progress(min_bytes=64 << 20) as on_progress:
        result = inspect_path(
            location,
            step,
            item,
            name_filter=filter_,
            stats=stats,
            layout=layout,
            on_progress=on_progress,
        )
    if json_out:
        emit_json(result)
    else:
        render.print_result(result, flat)
    for message in render.warnings(result):
        warn(message)


def _inspect_safetensors(
    run: Run,
    path: str,
    step: int | None,
    item: str | None,
    layout: str | None,
    filter_: str | None,
    stats: bool,
    json_out: bool,
) -> bool:
    """A safetensors file, index or folder inspected and shown; False for anything else."""
    from ckpt_cli.core.safetensors.source import is_safetensors_source

    if not is_safetensors_source(path):
        return False
    from ckpt_cli.commands import inspect_text as render
    from ckpt_cli.core.safetensors.contents import inspect_safetensors

    given = [
        o for o, v in (("--step", step), ("--item", item), ("--layout", layout)) if v is not None
    ]
    if given:
        raise UsageError(
            f"{', '.join(given)} apply to Orbax checkpoints, not to safetensors files",
            hint="inspect safetensors with --filter, --stats or --json",
        )
    with run.progress(min_bytes=64 << 20) as on_progress:
        result = inspect_safetensors(
            path, name_filter=filter_, stats=stats, on_progress=on_progress
        )
    if json_out:
        emit_json(result)
    else:
        render.print_safetensors(result)
    return True


def _json() -> JsonOutput:
    """What ``--json`` prints (loaded when asked: ``ckpt --help`` imports no core module)."""
    from ckpt_cli.core.inspect import InspectJSON, ItemReport, StepInspectJSON
    from ckpt_cli.core.safetensors.contents import SafetensorsInspectJSON

    return JsonOutput(
        (InspectJSON, StepInspectJSON, SafetensorsInspectJSON), ItemReport.SCHEMA_VERSION
    )


def _renderer() -> ModuleType:
    """The module that renders the text output."""
    from ckpt_cli.commands import inspect_text as module

    return module


COMMAND = Command(
    name="inspect",
    function=inspect,
    summary="the tree of one item, its sharding, `--stats`, `--layout`, and the training state of its step, part by part and item by item",
    guides=(("guide", "how-to/inspecting.md#ckpt-inspect-path"),),
    json_output=_json,
    renderer=_renderer,
    examples=(
        "runs/exp7 --step 1000",
        "runs/exp7 --flat --filter 'params.*kernel' --stats",
        "runs/exp7 --layout params.Dense_0.kernel",
        "export --filter 'params.*kernel'",
    ),
)
