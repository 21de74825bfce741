"""The context every command builds from the app's global flags: the storage options.

Apart from ``_options`` so that shell completion (``_complete``), which ``_options`` imports,
reaches the same options without an import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from ckpt_cli.core.storage import StorageOptions


def storage_options(ctx: typer.Context) -> StorageOptions:
    """The storage options of this run (set from ``--s3-endpoint`` and the environment by the
    app's callback; while the shell completes a line that callback does not run: from the
    flags parsed so far)."""
    from ckpt_cli.core.storage import StorageOptions

    root = ctx.find_root()
    if isinstance(root.obj, StorageOptions):
        return root.obj
    params = root.params or {}
    endpoint, limit = params.get("s3_endpoint"), params.get("max_requests")
    return StorageOptions.from_environment(
        s3_endpoint=endpoint if isinstance(endpoint, str) else None,
        max_requests=limit if isinstance(limit, int) else None,
    )
