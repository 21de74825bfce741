"""Uploads left open under a location: S3 multipart uploads that were begun and neither
completed nor aborted, because the process writing them was killed (SIGKILL, a lost machine).

No object listing shows them, yet their parts are stored, and billed, until someone aborts
them. This module lists them (``ListMultipartUploads`` under the location's prefix), counts
their bytes and aborts them; which of them may be aborted is the callers' question
(``core/write/uploads.py``). Local paths and GCS have none (``ObjectStore.list_uploads``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_cli.core.storage.base import Location
from ckpt_cli.core.storage.objstore import OpenUpload
from ckpt_cli.core.storage.remote import RemoteLocation

__all__ = ["OpenUpload", "Uploads", "abort_uploads", "open_uploads", "summarize_uploads"]

#: Uploads whose parts ``summarize_uploads`` counts at most (one ``ListParts`` request each).
MAX_COUNTED = 100


@dataclass(frozen=True)
class Uploads:
    """The open uploads under a root, for ``ls -v``."""

    uploads: tuple[OpenUpload, ...]
    #: The bytes their parts hold; None when there were too many to count.
    bytes: int | None

    @property
    def oldest(self) -> float | None:
        """When the oldest began (seconds since the epoch, the server's clock)."""
        return min((u.initiated for u in self.uploads), default=None)


def open_uploads(location: Location) -> tuple[OpenUpload, ...]:
    """The open uploads whose keys lie under ``location`` (none off S3)."""
    if not isinstance(location, RemoteLocation):
        return ()
    prefix = f"{location.key}/" if location.key else ""
    try:
        return tuple(location.store.list_uploads(prefix))
    except Exception as e:
        raise location.store.error(f"cannot list the open uploads under {location}", e) from None


def summarize_uploads(location: Location) -> Uploads:
    uploads = open_uploads(location)
    if len(uploads) > MAX_COUNTED or not isinstance(location, RemoteLocation):
        return Uploads(uploads, None if uploads else 0)
    try:
        total = sum(location.store.upload_bytes(u) for u in uploads)
    except Exception as e:
        raise location.store.error(
            f"cannot list the parts of an upload under {location}", e
        ) from None
    return Uploads(uploads, total)


def abort_uploads(location: Location, uploads: tuple[OpenUpload, ...]) -> list[str]:
    """Abort ``uploads`` (open uploads under ``location``); what failed, one line each."""
    if not uploads or not isinstance(location, RemoteLocation):
        return []
    failed = []
    for u in uploads:
        try:
            location.store.abort_upload(u)
        except Exception as e:
            failed.append(
                f"cannot abort the upload of {location.store.url(u.key)}: {location.store.describe(e)}"
            )
    return failed
