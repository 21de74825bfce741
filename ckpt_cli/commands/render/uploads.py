"""Text about open uploads: ``ls -v``'s line, and what ``cp`` and ``prune --clean-tmp`` aborted
or left alone (on stderr)."""

from __future__ import annotations

from datetime import datetime, timezone

from ckpt_cli.commands.render.layout import plural
from ckpt_cli.commands.render.units import human_age, human_bytes
from ckpt_cli.core.storage.uploads import Uploads
from ckpt_cli.core.write.claim import WRITE_LOCK
from ckpt_cli.core.write.uploads import UploadCleanup


def uploads_line(uploads: Uploads) -> str:
    """``open uploads: 2 (24.0 MiB), oldest 3m ago`` (S3 multipart uploads never finished)."""
    if not uploads.uploads:
        return "open uploads: none"
    size = "" if uploads.bytes is None else f" ({human_bytes(uploads.bytes)})"
    assert uploads.oldest is not None
    oldest = human_age(datetime.fromtimestamp(uploads.oldest, timezone.utc))
    return (
        f"open uploads: {len(uploads.uploads)}{size}, oldest {oldest} "
        "(left by killed writers; `ckpt prune --clean-tmp` aborts them)"
    )


def cleanup_notes(cleanup: UploadCleanup, *, dry_run: bool = False) -> list[str]:
    """What a cleanup aborted or spared, one line each, for stderr."""
    out = []
    n = plural(len(cleanup.aborted), "open upload")
    if cleanup.aborted:
        verb = "would abort" if dry_run else "aborted"
        out.append(f"{verb} {n} left by a killed writer")
    if cleanup.spared and cleanup.writer:
        out.append(
            f"left {plural(len(cleanup.spared), 'open upload')} alone: a writer that may still "
            f"run holds the root ({cleanup.writer}); if it is surely gone, delete its "
            f"{WRITE_LOCK} and run again"
        )
    return out
