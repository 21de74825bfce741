"""Storage: where checkpoint files live (local paths, ``file://``, ``s3://``, ``gs://``).

``open_location`` turns a command-line path or URL into a ``Location``; everything else in the
library lists, reads and writes through that interface (``base.py``). This package knows
nothing of the Orbax format.
"""

from __future__ import annotations

import os

from ckpt_cli.core.storage.base import (
    MAX_METADATA_BYTES,
    Entry,
    Location,
    Lock,
    NotACheckpointDirError,
)
from ckpt_cli.core.storage.local import LocalLocation
from ckpt_cli.core.storage.options import StorageOptions
from ckpt_cli.errors import UnsupportedError

__all__ = [
    "MAX_METADATA_BYTES",
    "Entry",
    "LocalLocation",
    "Location",
    "Lock",
    "NotACheckpointDirError",
    "StorageOptions",
    "open_location",
]


def open_location(
    target: str | os.PathLike[str], options: StorageOptions | None = None
) -> Location:
    """Turn a command-line path or URL into a Location; ``options`` (default: this process's
    environment, ``StorageOptions.from_environment``) say how to reach object stores."""
    target = os.fspath(target)
    if target.startswith("file://"):
        return LocalLocation(target[len("file://") :] or "/", options)
    if target.startswith(("s3://", "gs://")):
        from ckpt_cli.core.storage.remote import open_remote

        return open_remote(target, options)
    if "://" in target:
        scheme = target.split("://", 1)[0]
        raise UnsupportedError(
            f"{scheme}:// locations are not supported",
            hint="use a local path, file://, s3:// or gs://",
        )
    return LocalLocation(os.path.expanduser(target), options)
