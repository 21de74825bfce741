"""Which open uploads under a root a ckpt process may abort: only those a killed ckpt writer
left, never a live writer's.

Every ckpt writer uploads into a root only while it holds the root's write claim
(``claim.py``: ``ROOT/.ckpt-write.lock``). So:

* a writer that holds the claim itself (``cp`` rerun into the same destination) aborts the
  uploads under the root that began no later than its own lock object was written (both times
  by the server's clock): their writer had lost the claim, so it is gone;
* a command without the claim (``prune --clean-tmp``) aborts nothing while the lock names a
  writer that is not provably gone (``Owner.provably_gone``), and otherwise only the uploads
  that began longer ago than the minimum age it is given (``--tmp-min-age``), which also
  spares an upload a new writer began after the lock was looked at.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ckpt_cli.core.storage import Location
from ckpt_cli.core.storage.uploads import OpenUpload, abort_uploads, open_uploads
from ckpt_cli.core.write.claim import WRITE_LOCK, WriteClaim, read_owner
from ckpt_cli.errors import CkptError


@dataclass(frozen=True)
class UploadCleanup:
    """What a cleanup of open uploads did (or, planned only, would do)."""

    aborted: tuple[OpenUpload, ...] = ()
    #: Open uploads left alone: a writer that may still run holds the root, or they are too
    #: young (or began after this process's claim).
    spared: tuple[OpenUpload, ...] = ()
    #: The writer holding the root, when that is why uploads were spared.
    writer: str | None = None
    failed: tuple[str, ...] = ()


def abort_under_claim(root: Location, claim: WriteClaim) -> UploadCleanup:
    """Under this process's held ``claim`` on ``root``: abort the uploads left by earlier
    writers (begun no later than the claim's lock object was written)."""
    uploads = _listed(root)
    if isinstance(uploads, UploadCleanup):
        return uploads
    lock = root.child(WRITE_LOCK)
    lock.refresh()
    try:
        claimed_at = lock.mtime()
    except CkptError:
        return UploadCleanup(spared=uploads)
    old = tuple(u for u in uploads if u.initiated <= claimed_at)
    spared = tuple(u for u in uploads if u.initiated > claimed_at)
    return UploadCleanup(old, spared, None, tuple(abort_uploads(root, old)))


def abort_leftovers(root: Location, min_age_s: float, *, dry_run: bool = False) -> UploadCleanup:
    """Without the root's claim: abort the uploads older than ``min_age_s`` seconds unless a
    writer that is not provably gone holds ``.ckpt-write.lock`` (then none)."""
    uploads = _listed(root)
    if isinstance(uploads, UploadCleanup):
        return uploads
    lock = root.child(WRITE_LOCK)
    lock.refresh()
    if lock.is_file():
        owner = read_owner(lock)
        if owner is None or not owner.provably_gone():
            who = owner.describe() if owner else "holder unknown"
            return UploadCleanup(spared=uploads, writer=who)
    now = time.time()
    old = tuple(u for u in uploads if now - u.initiated >= min_age_s)
    young = tuple(u for u in uploads if now - u.initiated < min_age_s)
    failed = () if dry_run else tuple(abort_uploads(root, old))
    return UploadCleanup(old, young, None, failed)


def _listed(root: Location) -> tuple[OpenUpload, ...] | UploadCleanup:
    """The open uploads under ``root``, or the cleanup that ends here: none, or a store that
    cannot list them (some S3-compatible ones: a cleanup never fails the command)."""
    try:
        uploads = open_uploads(root)
    except CkptError as e:
        return UploadCleanup(failed=(e.message,))
    return uploads or UploadCleanup()
