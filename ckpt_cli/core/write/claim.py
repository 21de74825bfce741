"""Who writes into a root: one ckpt writer at a time, and proof that a leftover's owner is gone.

Every writer (``StepWriter``: reshard, migrate, and whatever writes a step through it) first
claims the destination root (``export``, whose output is a directory renamed into place, claims
``.OUT.ckpt-write.lock`` beside it): an exclusive lock on ``ROOT/.ckpt-write.lock``, an ``flock``
locally (the OS drops it when the holder dies, so a killed writer leaves no stale lock), a lock
object put only if absent on buckets (the one prune uses for ``.ckpt-prune.lock``). A second
writer is refused at once and told who holds the root (command, pid, host, start time).

The lock records an ``Owner``; so does every tmp step a writer makes (``.ckpt-owner`` inside
it, or the ``.ckpt-writing`` object of an in-place step). A leftover is removed only when its
owner is provably gone: it carries ckpt's owner record and the remover holds the root's lock
(no ckpt writer of that root can be alive), or, for a lock object left on a bucket, the owner
ran on this host and its process is dead (or the host rebooted since).
"""

from __future__ import annotations

import contextlib

from ckpt_cli.core.format.names import OWNER_FILE, WRITE_LOCK
from ckpt_cli.core.storage import Location, Lock
from ckpt_cli.core.storage.locks import Owner, read_owner
from ckpt_cli.errors import CkptError, LockedError

__all__ = [
    "OWNER_FILE", "WRITE_LOCK", "Owner", "WriteClaim", "claim_lock", "claim_root", "read_owner"
]  # fmt: skip


#: Lock files this process holds now: a lock object naming this very process but not in here is
#: a leftover of an earlier write of the same process that could not remove it (the store went
#: away), as dead as a killed writer's.
_HELD: set[str] = set()


class WriteClaim:
    """A held claim on a destination root; ``release`` gives it up (idempotent)."""

    def __init__(self, lock: Lock, owner: Owner, where: str) -> None:
        self._lock: Lock | None = lock
        self.owner = owner
        self.where = where
        _HELD.add(where)

    def release(self) -> None:
        if self._lock is not None:
            lock, self._lock = self._lock, None
            _HELD.discard(self.where)
            lock.release()


def claim_root(root: Location, command: str, *, record_required: bool = True) -> WriteClaim:
    """Take the root's write lock or raise ``LockedError`` naming the writer that holds it
    (``record_required``: see ``Location.try_lock``)."""
    return claim_lock(root.child(WRITE_LOCK), str(root), command, record_required=record_required)


def claim_lock(
    lock_loc: Location, target: str, command: str, *, record_required: bool = True
) -> WriteClaim:
    """Take the write lock ``lock_loc`` guarding ``target`` (a root, or an export's output
    directory, whose lock lies beside it) or raise ``LockedError`` naming its holder."""
    owner = Owner.me(command)
    lock = lock_loc.try_lock(owner.to_text(), record_required=record_required)
    on_bucket = lock_loc.requires_commit_marker
    if lock is None and on_bucket:
        # A lock object outlives a killed holder: replace it only when that holder is gone.
        holder = read_owner(lock_loc)
        mine_but_stale = (
            holder is not None and holder.is_this_process() and str(lock_loc) not in _HELD
        )
        if holder is not None and (mine_but_stale or holder.provably_gone()):
            with contextlib.suppress(CkptError):
                lock_loc.delete_file()
            lock = lock_loc.try_lock(owner.to_text())
    if lock is None:
        holder = read_owner(lock_loc)
        who = holder.describe() if holder else "holder unknown"
        hint = "wait for it to finish, or write to another destination"
        if on_bucket:
            hint += f"; if that writer is surely gone, delete {lock_loc} and run again"
        raise LockedError(f"another ckpt writer is writing into {target} ({who})", hint=hint)
    return WriteClaim(lock, owner, str(lock_loc))
