"""``ckpt export``: one item of an Orbax checkpoint into safetensors files, streamed."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Annotated

import typer

from ckpt_cli.commands import _options as o
from ckpt_cli.commands._command import Command, JsonOutput, Writer
from ckpt_cli.commands._context import run_context, write_plan
from ckpt_cli.errors import UsageError

if TYPE_CHECKING:
    from ckpt_cli.commands._context import Run
    from ckpt_cli.core.progress import ProgressFn
    from ckpt_cli.core.safetensors.export import ExportPlan
    from ckpt_cli.core.safetensors.export_run import ExportResult

#: transformers' default for save_pretrained(max_shard_size=...): 5 GB, decimal.
MAX_SHARD_SIZE = o.size_default("5GB")

MaxShardSizeOpt = Annotated[
    int,
    o.size_option(
        "--max-shard-size",
        "Shard above this size (5GB = 5e9 bytes, as transformers; GiB units too).",
    ),
]


ExportSourceArg = Annotated[
    str,
    typer.Argument(
        help="Source: a root, step or item directory (local, s3:// or gs://); ROOT@STEP names "
        "a step of a root (as --step), ROOT@STEP:ITEM an item of it.",
        show_default=False,
    ),
]
OutArg = Annotated[str, typer.Argument(help="Output directory (new or empty).", show_default=False)]
FormatOpt = Annotated[
    str,
    typer.Option(
        "--format", help="Output format (safetensors is the one there is).", metavar="FORMAT"
    ),
]
ParamsOnlyOpt = Annotated[
    bool,
    typer.Option(
        "--params-only",
        help="Only the model parameters (the leaves `inspect` names so): no optimizer "
        "state, step or RNG.",
    ),
]
DtypeOpt = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        help="Cast floating leaves: bfloat16, float16, float32, float64, float8_e4m3fn, "
        "float8_e5m2.",
        show_default=False,
    ),
]
FrameworkOpt = Annotated[
    str,
    typer.Option("--framework", help="`format` in `__metadata__`: pt, np, flax, tf or mlx."),
]
ProvenanceOpt = Annotated[
    bool,
    typer.Option(
        "--provenance/--no-provenance",
        help="Record the source (path, item, step, Orbax format, spec hash) in `__metadata__`.",
    ),
]


def export(
    ctx: typer.Context,
    src: ExportSourceArg,
    out: OutArg,
    format_: FormatOpt = "safetensors",
    spec: o.OptionalSpecOpt = None,
    params_only: ParamsOnlyOpt = False,
    dtype: DtypeOpt = None,
    max_shard_size: MaxShardSizeOpt = MAX_SHARD_SIZE,
    framework: FrameworkOpt = "pt",
    provenance: ProvenanceOpt = True,
    allow_unused: o.AllowUnusedOpt = False,
    step: o.StepOpt = None,
    item: o.ItemOpt = None,
    memory_limit: o.MemoryLimitOpt = o.EXCHANGE_MEMORY_LIMIT,
    allow_nonfinite: o.AllowNonfiniteOpt = False,
    dry_run: o.PlanOnlyOpt = False,
    json_out: o.JsonOpt = False,
    threads: o.ThreadsOpt = o.THREADS,
) -> None:
    """Export one item to safetensors: what Hugging Face and PyTorch load.

    One model.safetensors, or shards model-00001-of-0000N.safetensors and
    model.safetensors.index.json above --max-shard-size. Tensor names are the leaf names
    `inspect` shows, or those a --spec gives (one spec turns Flax names and [in, out] kernels
    into nn.Linear names and [out, in] weights). Values are bit-identical to an Orbax restore.
    Streams block by block under --memory-limit into a temporary directory renamed when every
    file is complete. Leaves safetensors cannot hold (strings, typed PRNG keys, int4) are
    refused before anything is written. No JAX.
    """
    from ckpt_cli.core.safetensors.export import plan_export
    from ckpt_cli.core.scale import ScaleOptions
    from ckpt_cli.core.write.memory import bound_allocator

    run = run_context(ctx, json_out, ScaleOptions(threads=threads))
    src, step, item = o.at_step(src, step, item)
    if format_ != "safetensors":
        raise UsageError(f"--format {format_!r}: the format ckpt exports is safetensors")
    # Blocks under 32 MiB come from (and return to) one heap that keeps freed memory for the
    # next block: no page faults for a fresh mapping per block (core/write/memory.py).
    bound_allocator()
    plan = plan_export(
        src,
        out,
        spec=spec,
        params_only=params_only,
        dtype=dtype,
        max_shard_size=max_shard_size,
        framework=framework,
        provenance=provenance,
        allow_unused=allow_unused,
        step=step,
        item=item,
        memory_limit=memory_limit,
        storage=run.storage,
        allow_nonfinite=allow_nonfinite,
    )
    _write(run, plan, dry_run)


def _write(run: Run, plan: ExportPlan, dry_run: bool) -> None:
    """Check the output directory, stream the files; the plan is shown with the result."""
    from ckpt_cli.commands import export_text as render
    from ckpt_cli.commands._write_text import print_written
    from ckpt_cli.core.safetensors.export_run import check_output, execute

    def checked_execute(plan: ExportPlan, on_progress: ProgressFn | None) -> ExportResult:
        check_output(plan.out)
        return execute(plan, on_progress)

    def print_result(result: ExportResult) -> None:
        render.print_export_plan(plan)
        written = result.to_json()["written"]
        print_written(plan.out, result.bytes_written, result.seconds, written["files"])

    write_plan(
        run,
        plan,
        checked_execute,
        dry_run=dry_run,
        print_plan=render.print_export_plan,
        print_result=print_result,
        warnings=() if dry_run else [f"{label} matched no leaf" for label in plan.unused_rules],
        plan_first=False,
    )


def _json() -> JsonOutput:
    """What ``--json`` prints (loaded when asked: ``ckpt --help`` imports no core module)."""
    from ckpt_cli.core.safetensors.export_run import ExportJSON
    from ckpt_cli.core.schema import SCHEMA_VERSION

    return JsonOutput((ExportJSON,), SCHEMA_VERSION)


def _renderer() -> ModuleType:
    """The module that renders the text output."""
    from ckpt_cli.commands import export_text as module

    return module


def _writer() -> Writer[ExportPlan, ExportResult]:
    """The plan ``ckpt_cli.execute`` takes, and the executor it hands that plan to."""
    from ckpt_cli.core.safetensors.export import ExportPlan
    from ckpt_cli.core.safetensors.export_run import execute

    return Writer(ExportPlan, execute)


COMMAND = Command(
    name="export",
    function=export,
    summary="one item as Hugging Face / PyTorch safetensors (sharded with an index above `--max-shard-size`), streamed",
    guides=(("guide", "how-to/export.md"),),
    json_output=_json,
    renderer=_renderer,
    writer=_writer,
    examples=(
        "runs/exp7 out --step 600 --spec mlp_to_pytorch.yaml",
        "runs/llama hf --spec llama_to_hf.yaml --dtype bfloat16",
        "runs/exp7 out --params-only --dry-run",
    ),
)
