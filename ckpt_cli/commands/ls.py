"""``ckpt ls``: the steps of a checkpoint root."""

from __future__ import annotations

from types import ModuleType
from typing import Annotated

import typer

from ckpt_cli.commands._command import Command, JsonOutput
from ckpt_cli.commands._context import run_context
from ckpt_cli.commands._options import JsonOpt, PathArg
from ckpt_cli.commands._output import emit_json, note, warn
from ckpt_cli.errors import CkptError

VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        help="Also say on stderr how a bucket root was listed (in parallel key ranges proven "
        "complete, or as one plain listing, and why), and list what a killed writer left in a "
        "bucket: open multipart uploads under the root (count, bytes, oldest). Text only.",
    ),
]


def ls(
    ctx: typer.Context, path: PathArg, json_out: JsonOpt = False, verbose: VerboseOpt = False
) -> None:
    """List the steps of a checkpoint root: status, commit time, size, items, metrics, format.

    Status is `committed`, `incomplete` (an unfinished save: a *.orbax-checkpoint-tmp dir) or
    `uncommitted` (object storage without commit_success.txt). The latest committed step is
    marked. Reads only metadata: no JAX, no array data. With -v, how a bucket root was
    listed (docs: object storage).
    """
    from ckpt_cli.commands import ls_text as render
    from ckpt_cli.core.listing import list_root
    from ckpt_cli.core.storage import open_location

    run = run_context(ctx, json_out)
    location = open_location(path, run.storage)
    listing = list_root(location, from_listing=True)
    if json_out:
        emit_json(listing)
    else:
        extra = []
        if verbose:
            from ckpt_cli.commands._write_text import uploads_line
            from ckpt_cli.core.storage.uploads import summarize_uploads

            try:
                extra.append(uploads_line(summarize_uploads(location)))
            except CkptError as e:  # a store without ListMultipartUploads: the steps stand
                warn(e.message)
        render.print_listing(listing, extra)
    for message in render.warnings(listing):
        warn(message)
    for message in location.notes() if verbose else ():
        note(message)


def _json() -> JsonOutput:
    """What ``--json`` prints (loaded when asked: ``ckpt --help`` imports no core module)."""
    from ckpt_cli.core.listing import LsJSON, RootListing

    return JsonOutput((LsJSON,), RootListing.SCHEMA_VERSION)


def _renderer() -> ModuleType:
    """The module that renders the text output."""
    from ckpt_cli.commands import ls_text as module

    return module


COMMAND = Command(
    name="ls",
    function=ls,
    summary="the steps of a root: status, commit time, size, items, metrics, format",
    guides=(("guide", "how-to/inspecting.md"),),
    json_output=_json,
    renderer=_renderer,
    examples=(
        "runs/exp7",
        "s3://bucket/runs/exp7 --json",
        "s3://bucket/runs/exp7 -v",
    ),
)
