"""``ckpt export``: one item of an Orbax checkpoint into safetensors files, streamed."""

from __future__ import annotations

from typing import Annotated

import typer

from ckpt_cli.commands._common import ItemOpt, JsonOpt, StepOpt, emit_json, parse_size, warn
from ckpt_cli.commands._write import MemoryLimitOpt, with_progress
from ckpt_cli.errors import UsageError


def export(
    src: Annotated[
        str,
        typer.Argument(
            help="Source: a root, step or item directory (local, s3:// or gs://).",
            show_default=False,
        ),
    ],
    out: Annotated[
        str, typer.Argument(help="Output directory (new or empty).", show_default=False)
    ],
    format_: Annotated[
        str, typer.Option("--format", help="Output format (safetensors is the one there is).")
    ] = "safetensors",
    spec: Annotated[
        str | None,
        typer.Option(
            "--spec",
            help="A migrate spec (YAML or .toml): rules applied to the tree first (rename, "
            "transpose, unstack, ...).",
            show_default=False,
        ),
    ] = None,
    params_only: Annotated[
        bool,
        typer.Option(
            "--params-only",
            help="Only the model parameters (the leaves `inspect` names so); no optimizer "
            "state, step or RNG.",
        ),
    ] = False,
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype",
            help="Cast floating leaves: bfloat16, float16, float32, float64, float8_e4m3fn, "
            "float8_e5m2.",
            show_default=False,
        ),
    ] = None,
    max_shard_size: Annotated[
        str,
        typer.Option(
            "--max-shard-size",
            help="Shard above this size (5GB = 5e9 bytes, as transformers; GiB units too).",
        ),
    ] = "5GB",
    framework: Annotated[
        str,
        typer.Option("--framework", help="`format` in __metadata__: pt, np, flax, tf or mlx."),
    ] = "pt",
    provenance: Annotated[
        bool,
        typer.Option(
            "--provenance/--no-provenance",
            help="Record the source (path, item, step, Orbax format, spec hash) in __metadata__.",
        ),
    ] = True,
    allow_unused: Annotated[
        bool, typer.Option("--allow-unused", help="Warn, not fail, when a rule matches no leaf.")
    ] = False,
    step: StepOpt = None,
    item: ItemOpt = None,
    memory_limit: MemoryLimitOpt = "256MiB",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan per tensor; write nothing.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Export one item to safetensors: what Hugging Face and PyTorch load.

    One model.safetensors, or shards model-00001-of-0000N.safetensors and
    model.safetensors.index.json above --max-shard-size. Tensor names are the leaf names
    `inspect` shows, or those a --spec gives (one spec turns Flax names and [in, out] kernels
    into nn.Linear names and [out, in] weights). Values are bit-identical to an Orbax restore.
    Streams block by block under --memory-limit; written to a temporary directory renamed when
    every file is complete. Leaves safetensors cannot hold (strings, typed PRNG keys, int4) are
    refused before anything is written. No JAX.
    """
    from ckpt_cli.commands import _render_export as render
    from ckpt_cli.core import export as core
    from ckpt_cli.core.inspect import inspect_item
    from ckpt_cli.core.memory import bound_allocator
    from ckpt_cli.core.migrate_spec import load_spec
    from ckpt_cli.core.resolve import resolve_item
    from ckpt_cli.core.storage import open_location

    if format_ != "safetensors":
        raise UsageError(f"--format {format_!r}: the format ckpt exports is safetensors")
    shard_limit = parse_size(max_shard_size, "--max-shard-size")
    mem_limit = parse_size(memory_limit, "--memory-limit")
    bound_allocator()
    parsed = load_spec(spec) if spec else None
    ref = resolve_item(open_location(src), step, item)
    report = inspect_item(ref)
    plan = core.plan_export(
        ref,
        report,
        out,
        spec=parsed,
        params_only=params_only,
        dtype=dtype,
        max_shard_size=shard_limit,
        framework=framework,
        provenance=provenance,
        allow_unused=allow_unused,
    )
    if dry_run:
        emit_json(plan.to_json()) if json_out else render.print_export_plan(plan)
        return
    for label in plan.unused_rules:
        warn(f"{label} matched no leaf")
    core.check_output(plan.out)
    result = with_progress(
        "export",
        plan.total_bytes,
        not json_out,
        lambda on_bytes: core.execute(plan, report, memory_limit=mem_limit, on_bytes=on_bytes),
    )
    if json_out:
        emit_json(result.to_json())
    else:
        render.print_export_plan(plan)
        render.print_written(plan.out, result.bytes_written, result.seconds)
