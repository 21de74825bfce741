"""The text every writer shares: a written step (reshard, migrate: what was written and how
fast; the plan is printed before the writing starts), written files (export, import), and open
uploads (``ls -v``'s line, and what ``cp`` and ``prune --clean-tmp`` aborted or left alone, on
stderr)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

from ckpt_cli.commands._output import stdout_console
from ckpt_cli.commands._text import human_age, human_bytes, plural, say, use_color
from ckpt_cli.core.storage.uploads import Uploads
from ckpt_cli.core.write.claim import WRITE_LOCK
from ckpt_cli.core.write.rewrite import WriteResult
from ckpt_cli.core.write.uploads import UploadCleanup


def print_written_step(result: WriteResult) -> None:
    out = result.output
    console = stdout_console()
    console.print(
        f"wrote step {out.step} to {out.path}"
        + (f" (items {', '.join(out.items)})" if len(out.items) > 1 else "")
        + ": "
        f"{human_bytes(out.bytes_written)} in {result.seconds:.1f} s "
        f"({human_bytes(int(result.rate))}/s)"
    )
    if out.scale is not None and not out.scale.split:
        console.print(f"not split: {out.scale.reason}")
    elif out.scale is not None:
        s = out.scale
        console.print(
            f"{s.units} units on {s.workers} {s.executor} workers "
            f"({s.databases} worker databases merged in {s.merge_seconds:.2f} s)"
        )
    if out.unchecked:
        several = len(out.items) > 1
        names = [f"{item}/{leaf}" if several else leaf for item, leaf in out.unchecked]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        console.print(
            f"{len(names)} version-1 (SHA-256) digests carried unchecked (not written as one "
            f"C-order stream): {shown}; `ckpt verify --deep {out.path}` checks them"
        )
    if result.digests is not None:
        console.print(f"digests: {result.digests}")


def print_written(path: str, nbytes: int, seconds: float, files: Sequence[str] = ()) -> None:
    """``wrote PATH/FILE`` (one file), ``wrote N files to PATH (first, ..., last)``, or ``wrote PATH``
    (a step), then the bytes, the time and the rate."""
    rate = nbytes / seconds if seconds > 0 else 0
    if len(files) == 1:
        what = f"{path.rstrip('/')}/{files[0]}"
    elif files:
        shown = ", ".join(files) if len(files) <= 3 else f"{files[0]}, ..., {files[-1]}"
        what = f"{len(files)} files to {path} ({shown})"
    else:
        what = path
    say(
        f"wrote {what}: {human_bytes(nbytes)} in {seconds:.1f} s ({human_bytes(int(rate))}/s)",
        use_color(),
    )


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
