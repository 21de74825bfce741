"""``ckpt doctor``: why a checkpoint will not restore into your model, and the spec that fixes it."""

from __future__ import annotations

from types import ModuleType
from typing import Annotated

import typer

from ckpt_cli.commands._command import Command, JsonOutput
from ckpt_cli.commands._context import run_context
from ckpt_cli.commands._options import ItemOpt, JsonOpt, StepOpt, StepPathArg, at_step
from ckpt_cli.commands._output import emit_json
from ckpt_cli.errors import EXIT_PROBLEMS

TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="MODULE:FUNCTION returning the abstract state you restore into (jax.eval_shape of "
        "your init, as for migrate --target). Imports jax.",
        show_default=False,
    ),
]
LikeOpt = Annotated[
    str | None,
    typer.Option(
        "--like",
        help="Another checkpoint (its item of the same name) or safetensors file/directory whose "
        "leaves are the ones to restore into. No JAX.",
        show_default=False,
    ),
]
RestoreMeshOpt = Annotated[
    str | None,
    typer.Option(
        "--mesh",
        help="The restore's mesh, e.g. data=4,model=2 (default: the target's shardings, else the "
        "devices jax sees here). A checkpoint saved on more devices than the restore has, "
        "restored into a target without shardings, needs a reshard first.",
        show_default=False,
    ),
]
HostsOpt = Annotated[
    int,
    typer.Option(
        "--hosts",
        help="The restore's processes: its devices split evenly over N hosts in JAX's device "
        "order (device i on host i // (devices / N)); the preflight gives each host's bytes, "
        "reads and predicted peak RAM.",
        metavar="N",
        min=1,
    ),
]
WriteSpecOpt = Annotated[
    str | None,
    typer.Option(
        "--write-spec",
        help="Write the fix to FILE: the migrate spec that closes every difference it can (YAML, "
        "each rule under a comment saying why; what it cannot close is listed at the end), or "
        "for `restores-after-reshard` the reshard rules that keep each leaf's partition spec.",
        metavar="FILE",
        show_default=False,
    ),
]


def doctor(
    ctx: typer.Context,
    path: StepPathArg,
    target: TargetOpt = None,
    like: LikeOpt = None,
    mesh: RestoreMeshOpt = None,
    hosts: HostsOpt = 1,
    write_spec: WriteSpecOpt = None,
    step: StepOpt = None,
    item: ItemOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Say whether a checkpoint restores into your model, why not, and the spec that fixes it.

    Compares the checkpoint's leaves with the state you restore into (--target or --like):
    missing and unexpected leaves, likely renames (scored: same shape, similar names, many
    leaves renamed the same way), shapes named as what they are (transposed, padded or
    truncated on an axis, reshaped, scanned layers stacked or unstacked) and dtypes. The
    verdict is `restores` (as is: a dtype alone is cast by Orbax on restore),
    `restores-after-migrate` (the written spec closes every difference: it is checked by
    planning the migration), `restores-after-reshard` (saved on more devices than the restore
    has, and the target names no shardings) or `cannot` (with the reason). Reads metadata only.

    The preflight (`memory` in the JSON) sizes the restore on its mesh and --hosts: bytes per
    device and per host, the largest array, the predicted peak host RAM of Orbax's restore and
    of `ckpt reshard` to that mesh, and each host's read amplification (bytes read given the
    stored chunking / bytes kept), advising a reshard first when it exceeds 2.

    Exit codes: 0 restores as is · 1 it does not (a spec fixes it, or nothing does) · 2 usage ·
    3 not a checkpoint or the target cannot be loaded.
    """
    from ckpt_cli.commands import doctor_text as render
    from ckpt_cli.core.doctor import diagnose, fix_text

    run = run_context(ctx, json_out)
    path, step, item = at_step(path, step, item)
    diagnosis = diagnose(
        path,
        target=target,
        like=like,
        step=step,
        item=item,
        mesh=mesh,
        hosts=hosts,
        storage=run.storage,
    )
    if write_spec is not None:
        render.write_spec(fix_text(diagnosis), write_spec)
    if json_out:
        emit_json(diagnosis)
    else:
        render.print_diagnosis(diagnosis, write_spec, target=target)
    if diagnosis.verdict != "restores":
        raise typer.Exit(EXIT_PROBLEMS)


def _json() -> JsonOutput:
    """What ``--json`` prints (loaded when asked: ``ckpt --help`` imports no core module)."""
    from ckpt_cli.core.doctor import Diagnosis, DiagnosisJSON

    return JsonOutput((DiagnosisJSON,), Diagnosis.SCHEMA_VERSION)


def _renderer() -> ModuleType:
    """The module that renders the text output."""
    from ckpt_cli.commands import doctor_text as module

    return module


COMMAND = Command(
    name="doctor",
    function=doctor,
    summary="why a checkpoint will not restore into your model (`--target MODULE:FN`, or `--like` another checkpoint or safetensors), the verdict, and `--write-spec` the migrate spec that fixes it",
    guides=(("guide", "how-to/doctor.md"),),
    json_output=_json,
    renderer=_renderer,
    examples=(
        "runs/exp7 --target model:abstract_state",
        "runs/exp7 --like runs/exp8 --write-spec fix.yaml",
        "runs/exp7 --step 1000 --like hf/llama --json",
        "runs/exp7 --target model:abstract_state --hosts 4",
    ),
)
