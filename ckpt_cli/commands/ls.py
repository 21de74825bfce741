"""``ckpt ls``: the steps of a checkpoint root."""

from __future__ import annotations

import typer

from ckpt_cli.commands._options import JsonOpt, PathArg, storage_options
from ckpt_cli.commands._output import emit_json, warn


def ls(ctx: typer.Context, path: PathArg, json_out: JsonOpt = False) -> None:
    """List the steps of a checkpoint root: status, commit time, size, items, metrics, format.

    Status is `committed`, `incomplete` (an unfinished save: a *.orbax-checkpoint-tmp dir) or
    `uncommitted` (object storage without commit_success.txt). The latest committed step is
    marked. Reads only metadata: no JAX, no array data.

    Examples:

        $ ckpt ls runs/exp7
        $ ckpt ls s3://bucket/runs/exp7 --json
    """
    from ckpt_cli.commands.render import ls as render
    from ckpt_cli.core.listing import list_root
    from ckpt_cli.core.storage import open_location

    listing = list_root(open_location(path, storage_options(ctx)), from_listing=True)
    if json_out:
        emit_json(listing)
    else:
        render.print_listing(listing)
    for message in render.warnings(listing):
        warn(message)
