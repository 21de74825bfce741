"""``ckpt du``: where a checkpoint's bytes go, and which of them nothing reads."""

from __future__ import annotations

from enum import Enum
from types import ModuleType
from typing import TYPE_CHECKING, Annotated

import typer

from ckpt_cli.commands._command import Command, JsonOutput
from ckpt_cli.commands._context import run_context
from ckpt_cli.commands._options import (
    MEMORY_LIMIT,
    THREADS,
    JsonOpt,
    MemoryLimitOpt,
    ThreadsOpt,
    at_step,
)
from ckpt_cli.commands._output import emit_json

if TYPE_CHECKING:
    from ckpt_cli.core.storage import Location, StorageOptions


DuPathArg = Annotated[
    str,
    typer.Argument(
        help="A CheckpointManager root, a step directory or an item directory; ROOT@STEP "
        "names a step of a root, ROOT@STEP:ITEM an item of it.",
        show_default=False,
    ),
]


class By(str, Enum):
    step = "step"
    item = "item"
    leaf = "leaf"


ByOpt = Annotated[
    By | None,
    typer.Option(
        "--by",
        help="Rows of the table: step, item or leaf (default: step for a root, item for a "
        "step, leaf for an item). Text only: --json carries every level.",
        show_default=False,
    ),
]
TopOpt = Annotated[
    int,
    typer.Option(
        "--top",
        min=0,
        help="Show the N largest rows (0: all; steps stay in step order). Text only.",
    ),
]

DeepOpt = Annotated[
    bool,
    typer.Option(
        "--deep",
        help="Compare leaves no record covers by their values: compute the ld1 digest of "
        "each leaf found in several steps (same item, name, dtype, shape) that has no "
        "recorded digest. Reads those arrays, under --memory-limit.",
    ),
]


def du(
    ctx: typer.Context,
    path: DuPathArg,
    by: ByOpt = None,
    top: TopOpt = 20,
    deep: DeepOpt = False,
    memory_limit: MemoryLimitOpt = MEMORY_LIMIT,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = THREADS,
) -> None:
    """Where the bytes of a root, step or item go: per step, item and leaf, and the garbage.

    Totals add up to the file sizes under PATH. A leaf's bytes are its stored chunks (from the
    OCDBT b-tree's value ranges, or its zarr directory); logical bytes are dtype size x
    elements, and the ratio shows what compression saves. Garbage: OCDBT data files no
    version references, ranges of data files only older versions read,
    unfinished saves, open multipart uploads in a bucket; each with the command that reclaims
    it. Duplicates: leaves whose ld1 digests are equal in several steps, and what one copy
    would save; digests recorded by `ckpt verify --deep --record`, or with --deep computed
    here. Without --deep, reads only metadata: no JAX, no array data.
    Exit codes: 0 counted (garbage is no error) · 2 usage · 3 not found or not a checkpoint.
    """
    from ckpt_cli.commands import du_text as render
    from ckpt_cli.core.du import disk_usage
    from ckpt_cli.core.scale import ScaleOptions

    run = run_context(ctx, json_out, ScaleOptions(threads=threads))
    root, step, item = at_step(path, None)
    location = _location(root, step, item, run.storage)
    with run.progress() as on_progress:
        report = disk_usage(
            location,
            deep=deep,
            memory_limit=memory_limit,
            on_progress=on_progress,
        )
    if json_out:
        emit_json(report)
    else:
        # ROOT@STEP is not the report's path: its hints name the step directory itself.
        render.print_report(report, by.value if by else None, top, path if step is None else None)


def _location(root: str, step: int | None, item: str | None, storage: StorageOptions) -> Location:
    """PATH, or for ROOT@STEP (ROOT@STEP:ITEM) that step (item) of the root."""
    from ckpt_cli.core.storage import open_location

    location = open_location(root, storage)
    if step is None:
        return location
    from ckpt_cli.core.format.discovery import list_steps
    from ckpt_cli.core.format.resolve import find_step, resolve_item

    if item is not None:
        return resolve_item(location, step, item).location
    return find_step(location, list_steps(location), step).location


def _json() -> JsonOutput:
    """What ``--json`` prints (loaded when asked: ``ckpt --help`` imports no core module)."""
    from ckpt_cli.core.du import DuJSON, DuReport

    return JsonOutput((DuJSON,), DuReport.SCHEMA_VERSION)


def _renderer() -> ModuleType:
    """The module that renders the text output."""
    from ckpt_cli.commands import du_text as module

    return module


COMMAND = Command(
    name="du",
    function=du,
    summary="where the bytes go: per step, item and leaf, compression, garbage, duplicates",
    guides=(("guide", "how-to/du.md"),),
    json_output=_json,
    renderer=_renderer,
    examples=(
        "runs/exp7",
        "runs/exp7 --by leaf --top 10",
        "runs/exp7 --deep",
        "s3://bucket/runs/exp7 --json",
    ),
)
