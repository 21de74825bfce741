"""``ckpt pin`` / ``ckpt unpin``: protect a step from ``ckpt prune`` (T5X's PINNED file,
restic's ``--keep-tag``)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ckpt_cli.commands import _options as o
from ckpt_cli.commands._command import Command, JsonOutput
from ckpt_cli.commands._context import run_context
from ckpt_cli.commands._output import emit_json

StepArg = Annotated[int, typer.Argument(help="The step (a committed step of ROOT).")]


def pin(
    ctx: typer.Context,
    root: o.RootArg,
    step: StepArg,
    note: Annotated[
        str | None,
        typer.Option(
            "--note", "-m", help="Why the step is kept (shown by ls and prune).", show_default=False
        ),
    ] = None,
    json_out: o.JsonOpt = False,
) -> None:
    """Pin a step: `ckpt prune` always keeps it, whatever the rules, and says why.

    The pin is the file STEP/_CKPT_PINNED.json, which Orbax ignores (locally and in buckets);
    `ckpt ls` shows it. Pinning again replaces the note. Orbax's own retention (max_to_keep) does
    not know pins: give the manager ckpt_cli.core.prune.orbax_policy.PinnedSteps to keep them there too.

    Exit codes: 0 pinned · 2 usage · 3 no such step, an unfinished save, or a prune is running.
    """
    from ckpt_cli.core.format.pins import pin_step
    from ckpt_cli.core.prune.execute import prune_lock
    from ckpt_cli.core.storage import open_location

    location = open_location(root, run_context(ctx, json_out).storage)
    with prune_lock(location, "pin") as found:
        result = pin_step(location, step, note, found.entries)
    if json_out:
        emit_json(result)
        return
    what = f" ({result.pin.note})" if result.pin and result.pin.note else ""
    verb = "pinned" if result.changed else "already pinned"
    sys.stdout.write(f"{verb} step {result.step} of {result.root}{what}\n")


def unpin(ctx: typer.Context, root: o.RootArg, step: StepArg, json_out: o.JsonOpt = False) -> None:
    """Remove a step's pin: `ckpt prune` applies its rules to the step again.

    A step without a pin is left as it is (exit 0), so scripts can unpin unconditionally.

    Exit codes: 0 done · 2 usage · 3 no such step, or a prune is running.
    """
    from ckpt_cli.core.format.pins import unpin_step
    from ckpt_cli.core.prune.execute import prune_lock
    from ckpt_cli.core.storage import open_location

    location = open_location(root, run_context(ctx, json_out).storage)
    with prune_lock(location, "unpin") as found:
        result = unpin_step(location, step, found.entries)
    if json_out:
        emit_json(result)
        return
    verb = "unpinned" if result.changed else "was not pinned:"
    sys.stdout.write(f"{verb} step {result.step} of {result.root}\n")


def _json() -> JsonOutput:
    """What ``--json`` prints (loaded when asked: ``ckpt --help`` imports no core module)."""
    from ckpt_cli.core.format.pins import PinResultJSON
    from ckpt_cli.core.schema import SCHEMA_VERSION

    return JsonOutput((PinResultJSON,), SCHEMA_VERSION)


PIN = Command(
    name="pin",
    function=pin,
    summary="protect a step: `prune` always keeps it and says why; Orbax ignores the pin",
    guides=(("guide", "how-to/retention.md#pinned-steps-ckpt-pin"),),
    json_output=_json,
    examples=("runs/exp7 500 --note 'best eval so far'", "s3://bucket/exp7 1000 --json"),
)

UNPIN = Command(
    name="unpin",
    function=unpin,
    summary="remove a pin",
    json_output=_json,
    examples=("runs/exp7 500", "s3://bucket/exp7 1000 --json"),
)
