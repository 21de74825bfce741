"""``ckpt digest``: the layout-independent ``ld1`` digest of every leaf."""

from __future__ import annotations

from typing import Annotated

import typer

from ckpt_cli.commands._command import Command, JsonOutput
from ckpt_cli.commands._context import run_context
from ckpt_cli.commands._options import (
    MEMORY_LIMIT,
    THREADS,
    JsonOpt,
    MemoryLimitOpt,
    StepOpt,
    ThreadsOpt,
    at_step,
)
from ckpt_cli.commands._output import emit_json, warn
from ckpt_cli.errors import EXIT_PROBLEMS

DigestPathArg = Annotated[
    str,
    typer.Argument(
        help="A root (its latest step, or --step; ROOT@STEP as --step), a step (every item), an "
        "item directory, or a safetensors file, index or directory of shards.",
        show_default=False,
    ),
]


def digest(
    ctx: typer.Context,
    path: DigestPathArg,
    step: StepOpt = None,
    memory_limit: MemoryLimitOpt = MEMORY_LIMIT,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = THREADS,
) -> None:
    """Print the ld1 digest of every leaf: the same however the leaf is stored.

    A leaf's digest depends on its dtype, shape and values only: resharded, rechunked, zarr2 or
    zarr3, in OCDBT or not, exported to safetensors and imported back, it stays the same, so
    two copies compare by their digests. A step prints every item; safetensors prints every
    tensor (named as in the file). Reads every chunk once, in any order, under --memory-limit;
    no JAX. The algorithm: docs/reference/digest-spec.md.

    Exit codes: 0 every leaf digested · 1 a leaf could not be read (its problem is printed) ·
    2 usage · 3 not a checkpoint or unreadable.
    """
    from ckpt_cli.core.digest.safetensors import digest_any
    from ckpt_cli.core.scale import ScaleOptions

    path, step, _ = at_step(path, step, items=False)
    run = run_context(ctx, json_out, ScaleOptions(threads=threads))
    with run.progress() as on_progress:
        report = digest_any(path, step, run.storage, memory_limit, on_progress)
    if json_out:
        emit_json(report)
    else:
        _print(report)
    for leaf in report.problems:
        warn(f"{leaf.name}: {leaf.problem}")
    if report.problems:
        raise typer.Exit(EXIT_PROBLEMS)


def _print(report: object) -> None:
    """One line per leaf: digest, dtype[shape], name; a heading per item when there are several."""
    import sys

    from ckpt_cli.core.digest import DigestReport

    assert isinstance(report, DigestReport)
    lines = []
    for item in report.items:
        if len(report.items) > 1:
            lines.append(f"# {item.name}")
        for leaf in item.leaves:
            shape = ",".join(str(n) for n in leaf.shape)
            lines.append(f"{leaf.digest or '-':<36}  {leaf.dtype}[{shape}]  {leaf.name}")
    sys.stdout.write("\n".join(lines) + ("\n" if lines else ""))


def _json() -> JsonOutput:
    """What ``--json`` prints (loaded when asked: ``ckpt --help`` imports no core module)."""
    from ckpt_cli.core.digest import DigestJSON, DigestReport

    return JsonOutput((DigestJSON,), DigestReport.SCHEMA_VERSION)


COMMAND = Command(
    name="digest",
    function=digest,
    summary="every leaf's `ld1` digest: the same whatever the sharding, chunking, zarr version, OCDBT or safetensors",
    guides=(("spec", "reference/digest-spec.md"),),
    json_output=_json,
    examples=(
        "runs/exp7",
        "runs/exp7 --step 1000 --json",
        "export/model.safetensors.index.json",
    ),
)
