"""``ckpt inspect``: the tree of one item, its training-state parts, stats and shard layout."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ckpt_cli.commands._common import (
    FilterOpt,
    ItemOpt,
    JsonOpt,
    PathArg,
    StepOpt,
    emit_json,
    warn,
)
from ckpt_cli.core.format.resolve import resolve_item
from ckpt_cli.core.inspect import inspect_item
from ckpt_cli.core.storage import open_location
from ckpt_cli.errors import NotFoundError


def inspect(
    path: PathArg,
    step: StepOpt = None,
    item: ItemOpt = None,
    flat: Annotated[
        bool, typer.Option("--flat", help="One line per leaf instead of a tree.")
    ] = False,
    filter_: FilterOpt = None,
    stats: Annotated[
        bool,
        typer.Option(
            "--stats",
            help="Add min, max, mean, std, NaN and Inf counts per leaf (reads the data, "
            "chunk by chunk).",
        ),
    ] = False,
    layout: Annotated[
        str | None,
        typer.Option(
            "--layout", help="Draw which device holds which block of this leaf.", show_default=False
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Show the tree of one item: dtype, shape, bytes, chunking and sharding of every leaf.

    Says which subtrees hold the four parts of a training state (parameters, optimizer state,
    step, RNG state) and what resuming loses when one is missing. Reads only metadata unless
    --stats is given. No JAX.
    """
    # Rendering pulls in rich.tree/table: imported here so `ls` and `--help` do not pay for it.
    from ckpt_cli.commands import _render_inspect as render

    ref = resolve_item(open_location(path), step, item)
    report = inspect_item(ref, filter_)
    if filter_ is not None and not report.leaves:
        raise NotFoundError(
            f"no leaf of {ref.location} matches {filter_!r}",
            hint="run `ckpt inspect --flat` to see the leaf names",
        )
    leaf_stats: dict[str, Any] = {}
    if stats:
        leaf_stats = render.compute_stats(report, show_progress=not json_out)
    shard_layout = None
    if layout is not None:
        shard_layout = render.layout_of(report, layout)
    if json_out:
        doc: dict[str, Any] = render.report_json(report)
        if stats:
            for leaf_doc in doc["leaves"]:
                s = leaf_stats.get(leaf_doc["name"])
                leaf_doc["stats"] = s.to_json() if s else None
        if shard_layout is not None:
            doc["layout"] = render.layout_json(layout or "", shard_layout)
        emit_json(doc)
    else:
        if shard_layout is not None:
            render.print_layout(layout or "", shard_layout, report)
        else:
            render.print_report(report, flat=flat, stats=leaf_stats if stats else None)
    for leaf in report.problems:
        warn(f"{leaf.name}: {leaf.problem} (run `ckpt verify` on this checkpoint)")
