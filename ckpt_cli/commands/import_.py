"""``ckpt import``: safetensors files (a file, or a Hugging Face directory) into an Orbax step."""

from __future__ import annotations

from typing import Annotated

import typer

from ckpt_cli.commands._common import JsonOpt, emit_json, warn
from ckpt_cli.commands._write import (
    CompressionOpt,
    MaxChunkBytesOpt,
    MemoryLimitOpt,
    OcdbtOpt,
    with_progress,
    write_limits,
)
from ckpt_cli.errors import UsageError


def import_(
    src: Annotated[
        str,
        typer.Argument(
            help="A .safetensors file, an *.safetensors.index.json, or a directory holding either.",
            show_default=False,
        ),
    ],
    dst: Annotated[
        str,
        typer.Argument(
            help="Destination CheckpointManager root (created if missing).", show_default=False
        ),
    ],
    spec: Annotated[
        str | None,
        typer.Option(
            "--spec",
            help="A migrate spec: rules applied to the tensors first (names are dotted paths).",
            show_default=False,
        ),
    ] = None,
    mesh: Annotated[
        str | None,
        typer.Option(
            "--mesh", help="Lay arrays out for this mesh, e.g. data=8,model=4.", show_default=False
        ),
    ] = None,
    rules: Annotated[
        str | None,
        typer.Option(
            "--rules",
            help="YAML/JSON file: leaf pattern -> partition spec (as reshard). First match "
            "wins; unmatched leaves are replicated.",
            show_default=False,
        ),
    ] = None,
    step: Annotated[int, typer.Option("--step", "-s", help="Step number to write.", min=0)] = 0,
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="MODULE:FUNCTION returning the model's abstract state; the result is checked "
            "against it (names, shapes, dtypes). Imports jax.",
            show_default=False,
        ),
    ] = None,
    allow_unused: Annotated[
        bool,
        typer.Option("--allow-unused", help="Warn, not fail, when a rule matches nothing."),
    ] = False,
    # Smaller than reshard's defaults: blocks come from a file at disk speed, so more of them in
    # flight buy nothing (bench/bench_export.py: 256MiB/16MiB ran faster than 1GiB/64MiB).
    max_chunk_bytes: MaxChunkBytesOpt = "16MiB",
    memory_limit: MemoryLimitOpt = "256MiB",
    zarr3: Annotated[bool, typer.Option("--zarr3/--zarr2", help="Output zarr version.")] = False,
    compression: CompressionOpt = "zstd",
    ocdbt: OcdbtOpt = True,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan per leaf; write nothing.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Import safetensors into a new Orbax step that Orbax restores.

    Tensor names become tree paths (model.layers.0.weight -> model/layers/0/weight), or the
    names a --spec gives; --mesh/--rules lay every array out for a device mesh as reshard does.
    Every header is checked first: a damaged or hand-edited file is refused with nothing
    written. Streams under --memory-limit; the step is written under a tmp name and renamed when
    complete. No JAX (except --target).
    """
    from ckpt_cli.commands import _render_export as render
    from ckpt_cli.commands.reshard import _load_rules
    from ckpt_cli.core import import_ as core
    from ckpt_cli.core.memory import bound_allocator
    from ckpt_cli.core.migrate_spec import load_spec
    from ckpt_cli.core.reshard import MeshSpec, parse_rules
    from ckpt_cli.core.writer import Compression

    if rules and not mesh:
        raise UsageError("--rules needs --mesh: the mesh its partition specs name")
    chunk_limit, mem_limit = write_limits(max_chunk_bytes, memory_limit)
    comp = Compression.parse(compression)
    bound_allocator()
    parsed = load_spec(spec) if spec else None
    target_mesh = MeshSpec.parse(mesh) if mesh else None
    rule_list = parse_rules(_load_rules(rules), target_mesh, rules) if rules and target_mesh else []
    plan = core.plan_import(
        src,
        dst,
        spec=parsed,
        mesh=target_mesh,
        rules=rule_list,
        step=step,
        max_chunk_bytes=chunk_limit,
        allow_unused=allow_unused,
    )
    if target:
        core.check_target(plan, target)
    if dry_run:
        emit_json(plan.to_json()) if json_out else render.print_import_plan(plan)
        return
    for label in plan.unused_rules:
        warn(f"{label} matched no tensor")
    result = with_progress(
        "import",
        plan.total_bytes,
        not json_out,
        lambda on_bytes: core.execute(
            plan,
            memory_limit=mem_limit,
            zarr3=zarr3,
            compression=comp,
            use_ocdbt=ocdbt,
            on_bytes=on_bytes,
        ),
    )
    if json_out:
        emit_json(result.to_json())
    else:
        render.print_import_plan(plan)
        render.print_written(result.path, result.bytes_written, result.seconds)
