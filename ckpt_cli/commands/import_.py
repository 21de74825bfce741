"""``ckpt import``: safetensors files (a file, or a Hugging Face directory) into an Orbax step."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Annotated

import typer

from ckpt_cli.commands import _options as o
from ckpt_cli.commands._command import Command, JsonOutput, Writer
from ckpt_cli.commands._context import run_context, write_plan

if TYPE_CHECKING:
    from ckpt_cli.commands._context import Run
    from ckpt_cli.core.safetensors.import_ import ImportPlan
    from ckpt_cli.core.safetensors.import_run import ImportResult

IMPORT_CHUNK_BYTES = o.size_default("16MiB")


ImportSourceArg = Annotated[
    str,
    typer.Argument(
        help="A .safetensors file, an *.safetensors.index.json, or a directory holding either.",
        show_default=False,
    ),
]
ImportDestArg = Annotated[
    str,
    typer.Argument(
        help="Destination CheckpointManager root (created if missing); ROOT@STEP names the "
        "step to write (as --step), ROOT@STEP:ITEM the item too.",
        show_default=False,
    ),
]
ImportStepOpt = Annotated[
    int | None,
    typer.Option(
        "--step",
        "-s",
        help="Step number to write (default: the step `ckpt export` recorded, ckpt.step, else 0).",
        min=0,
    ),
]
ImportZarr3Opt = Annotated[bool, typer.Option("--zarr3/--zarr2", help="Output zarr version.")]
ImportItemOpt = Annotated[
    str | None,
    typer.Option(
        "--item",
        "-i",
        help="Item to write (default: the item ckpt export recorded, ckpt.item, else default): "
        "the name the loader asks for (Keras pytree, MaxText items).",
        show_default=False,
        metavar="NAME",
    ),
]


def import_(
    ctx: typer.Context,
    src: ImportSourceArg,
    dst: ImportDestArg,
    spec: o.OptionalSpecOpt = None,
    mesh: o.MeshOpt = None,
    rules: o.RulesOpt = None,
    step: ImportStepOpt = None,
    item: ImportItemOpt = None,
    target: o.TargetOpt = None,
    allow_unused: o.AllowUnusedOpt = False,
    max_chunk_bytes: o.MaxChunkBytesOpt = IMPORT_CHUNK_BYTES,
    memory_limit: o.MemoryLimitOpt = o.EXCHANGE_MEMORY_LIMIT,
    zarr3: ImportZarr3Opt = False,
    compression: o.CompressionOpt = "zstd",
    ocdbt: o.OcdbtOpt = True,
    allow_nonfinite: o.AllowNonfiniteOpt = False,
    dry_run: o.PlanOnlyOpt = False,
    json_out: o.JsonOpt = False,
    threads: o.ThreadsOpt = o.THREADS,
) -> None:
    """Import safetensors into a new Orbax step that Orbax restores.

    Tensor names become tree paths (model.layers.0.weight -> model/layers/0/weight), or the
    names a --spec gives; --mesh/--rules lay every array out for a device mesh as reshard does.
    Every header is checked first: a damaged or hand-edited file is refused with nothing
    written. Streams under --memory-limit; the step is written under a tmp name and renamed when
    complete. No JAX (except --target).
    """
    from ckpt_cli.core.safetensors.import_ import plan_import
    from ckpt_cli.core.scale import ScaleOptions
    from ckpt_cli.core.write.memory import bound_allocator

    dst, step, item = o.at_step(dst, step, item)
    run = run_context(ctx, json_out, ScaleOptions(threads=threads))
    write = o.write_options(
        run, max_chunk_bytes, memory_limit, zarr3, compression, ocdbt, allow_nonfinite
    )
    bound_allocator()
    plan = plan_import(
        src,
        dst,
        spec=spec,
        mesh=mesh,
        rules=rules,
        step=step,
        target=target,
        allow_unused=allow_unused,
        write=write,
        storage=run.storage,
        item=item,
    )
    _write(run, plan, dry_run)


def _write(run: Run, plan: ImportPlan, dry_run: bool) -> None:
    """Stream the new step; the plan is shown with the result."""
    from ckpt_cli.commands import import_text as render
    from ckpt_cli.commands._write_text import print_written
    from ckpt_cli.core.safetensors.import_run import execute

    def print_result(result: ImportResult) -> None:
        render.print_import_plan(plan)
        print_written(result.path, result.bytes_written, result.seconds)

    write_plan(
        run,
        plan,
        execute,
        dry_run=dry_run,
        print_plan=render.print_import_plan,
        print_result=print_result,
        warnings=() if dry_run else [f"{label} matched no tensor" for label in plan.unused_rules],
        plan_first=False,
    )


def _json() -> JsonOutput:
    """What ``--json`` prints (loaded when asked: ``ckpt --help`` imports no core module)."""
    from ckpt_cli.core.safetensors.import_ import ImportPlan
    from ckpt_cli.core.safetensors.import_run import ImportJSON

    return JsonOutput((ImportJSON,), ImportPlan.SCHEMA_VERSION)


def _renderer() -> ModuleType:
    """The module that renders the text output."""
    from ckpt_cli.commands import import_text as module

    return module


def _writer() -> Writer[ImportPlan, ImportResult]:
    """The plan ``ckpt_cli.execute`` takes, and the executor it hands that plan to."""
    from ckpt_cli.core.safetensors.import_ import ImportPlan
    from ckpt_cli.core.safetensors.import_run import execute

    return Writer(ImportPlan, execute)


COMMAND = Command(
    name="import",
    function=import_,
    summary="safetensors (a file or an HF directory) into a new Orbax step, optionally laid out for a mesh",
    guides=(("guide", "how-to/export.md"),),
    json_output=_json,
    renderer=_renderer,
    writer=_writer,
    examples=(
        "out runs/back --spec pytorch_to_mlp.yaml --step 600",
        "hf runs/llama --spec hf_to_llama.yaml --target model:abstract",
        "model.safetensors runs/x --mesh data=4,model=2 --rules r.yaml",
        "model.safetensors runs/keras --item pytree",
    ),
)
