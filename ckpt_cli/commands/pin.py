"""``ckpt pin`` / ``ckpt unpin``: protect a step from ``ckpt prune`` (T5X's PINNED file,
restic's ``--keep-tag``)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from ckpt_cli.commands import _options as o
from ckpt_cli.commands._command import Command, JsonOutput
from ckpt_cli.commands._context import run_context
from ckpt_cli.commands._output import emit_json
from ckpt_cli.commands._output import note as note_line

if TYPE_CHECKING:
    from ckpt_cli.core.format.pins import Pin

StepArg = Annotated[
    int | None,
    typer.Argument(
        help="The step (a committed step of ROOT); or name it as ROOT@STEP.", show_default=False
    ),
]


def _root_step(root: str, step: int | None) -> tuple[str, int]:
    """ROOT and STEP, or ROOT@STEP (the same step both ways, ``_options.at_step``)."""
    from ckpt_cli.errors import UsageError

    root, step, _ = o.at_step(root, step, items=False, flag="STEP")
    if step is None:
        raise UsageError("no step given", hint="name it: ROOT STEP or ROOT@STEP")
    return root, step


def pin(
    ctx: typer.Context,
    root: o.RootArg,
    step: StepArg = None,
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
    `ckpt ls` shows it. Pinning a pinned step again with another --note replaces its pin and says
    which note, by whom and when, it replaced (on stderr; `previous` in --json); without --note
    the pin stays as it is. Orbax's own retention (max_to_keep) does not know pins: give the
    manager ckpt_cli.core.prune.orbax_policy.PinnedSteps to keep them there too.

    Exit codes: 0 pinned · 2 usage · 3 no such step, an unfinished save, or a prune is running.
    """
    from ckpt_cli.core.format.pins import pin_step
    from ckpt_cli.core.prune.execute import prune_lock
    from ckpt_cli.core.storage import open_location

    root, step = _root_step(root, step)
    location = open_location(root, run_context(ctx, json_out).storage)
    with prune_lock(location, "pin") as found:
        result = pin_step(location, step, note, found.entries)
    if result.replaced is not None:
        note_line(f"replaced {_described(result.replaced)}")
    if json_out:
        emit_json(result)
        return
    what = f" ({result.pin.note})" if result.pin and result.pin.note else ""
    verb = "pinned" if result.changed else "already pinned"
    sys.stdout.write(f"{verb} step {result.step} of {result.root}{what}\n")


def _described(pin: Pin) -> str:
    """``note "best eval" (pinned by ann@host at 2026-05-01T10:00:00+00:00)``."""
    from ckpt_cli.core.format.pins import UNREADABLE_NOTE

    if pin.note == UNREADABLE_NOTE:
        return "a pin file that could not be read"
    what = (
        f"note {json.dumps(pin.note, ensure_ascii=False)}" if pin.note else "a pin without a note"
    )
    by = f" by {pin.by}" if pin.by else ""
    at = f" at {pin.pinned_at}" if pin.pinned_at else ""
    return f"{what} (pinned{by}{at})" if by or at else what


def unpin(
    ctx: typer.Context, root: o.RootArg, step: StepArg = None, json_out: o.JsonOpt = False
) -> None:
    """Remove a step's pin: `ckpt prune` applies its rules to the step again.

    A step without a pin is left as it is (exit 0), so scripts can unpin unconditionally.

    Exit codes: 0 done · 2 usage · 3 no such step, or a prune is running.
    """
    from ckpt_cli.core.format.pins import unpin_step
    from ckpt_cli.core.prune.execute import prune_lock
    from ckpt_cli.core.storage import open_location

    root, step = _root_step(root, step)
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
    from ckpt_cli.core.format.pins import PinResult, PinResultJSON

    return JsonOutput((PinResultJSON,), PinResult.SCHEMA_VERSION)


PIN = Command(
    name="pin",
    function=pin,
    summary="protect a step: `prune` always keeps it and says why; Orbax ignores the pin",
    guides=(("guide", "how-to/retention.md#pinned-steps-ckpt-pin"),),
    json_output=_json,
    examples=(
        "runs/exp7 500 --note 'best eval so far'",
        "runs/exp7@500",
        "s3://bucket/exp7 1000 --json",
    ),
)

UNPIN = Command(
    name="unpin",
    function=unpin,
    summary="remove a pin",
    json_output=_json,
    examples=("runs/exp7 500", "runs/exp7@500", "s3://bucket/exp7 1000 --json"),
)
