"""Deleting what a prune plan removes, safely; and the lock that keeps prunes of a root apart.

``execute_plan`` re-lists the root, re-checks every planned entry (still there, a real directory
resolving inside the root, a tmp dir still idle, a name prune recognises), hides each, then
removes it. Locally hiding is a rename to a hidden trash name inside the root: atomic, Orbax and
``ckpt ls`` stop seeing the step at once, and a crash leaves every kept step intact plus at most
some ``.ckpt-trash-*`` directories that the next prune removes. Object stores have no rename: a
step gets a ``.ckpt-deleting`` tombstone, then loses ``commit_success.txt`` (so it no longer
looks valid), then its objects; a step with a tombstone is trash that the next prune removes.

The lock: an ``flock`` locally; on object stores a lock object put only if absent (conditional
put), deleted on release. A prune that is killed leaves that object behind: the next prune is
refused, names the holder and says to delete the object once that prune is surely gone.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TypedDict

from typing_extensions import NotRequired

from ckpt_cli.core.format.discovery import Detected
from ckpt_cli.core.format.evidence import is_deletion_leftover
from ckpt_cli.core.format.names import (
    COMMIT_MARKER,
    ROOT_METADATA_DIR,
    STEP_METADATA,
    TMP_MARKER,
    TOMBSTONE,
    looks_like_item,
    parse_step_name,
)
from ckpt_cli.core.format.pins import PIN_FILE
from ckpt_cli.core.progress import Progress, ProgressFn
from ckpt_cli.core.prune.plan import (
    LOCK_NAME,
    SYMLINK_KEPT,
    TRASH_PREFIX,
    PrunePlan,
    PrunePlanJSON,
    Removal,
    Untouched,
    UntouchedJSON,
    is_partial_write,
    is_tombstoned,
    modified_at,
    require_root,
)
from ckpt_cli.core.storage import Entry, Location
from ckpt_cli.core.storage.locks import holder_of, read_owner, take_lock
from ckpt_cli.core.write.claim import WRITE_LOCK, WriteClaim, claim_root
from ckpt_cli.core.write.uploads import UploadCleanup, abort_leftovers
from ckpt_cli.errors import (
    CkptError,
    ErrorJSON,
    LockedError,
    NotFoundError,
    StorageError,
    UnreachableError,
    UsageError,
)

#: The prune locks this process holds (``prune_lock``).
_HELD: set[str] = set()


class OutcomeJSON(TypedDict):
    deleted: list[str]
    skipped: list[UntouchedJSON]
    failed: list[UntouchedJSON]
    freed_bytes: int


class PruneJSON(PrunePlanJSON):
    """``ckpt prune --json``: the plan and, unless a dry run or a refusal, its outcome; a refusal
    or a failed deletion carries ``ok: false`` and ``error`` in this same document."""

    dry_run: bool
    outcome: OutcomeJSON | None
    error: NotRequired[ErrorJSON]


@dataclass(frozen=True)
class PruneOutcome:
    deleted: tuple[Removal, ...]
    skipped: tuple[Untouched, ...]  # planned, but found changed at deletion time
    failed: tuple[Untouched, ...]  # the storage refused; a trash dir may remain

    @property
    def freed_bytes(self) -> int:
        return sum(r.size_bytes for r in self.deleted)

    @property
    def failure(self) -> StorageError | None:
        """The error a prune with failed deletions ends in (kept steps are intact), or None."""
        if not self.failed:
            return None
        return StorageError(
            f"{len(self.failed)} deletions failed; every kept step is intact",
            hint="fix the cause and run the prune again: it removes the leftover trash",
        )

    def to_json(self) -> OutcomeJSON:
        return {
            "deleted": [r.name for r in self.deleted],
            "skipped": [u.to_json() for u in self.skipped],
            "failed": [u.to_json() for u in self.failed],
            "freed_bytes": self.freed_bytes,
        }


@dataclass(frozen=True)
class PruneResult:
    """A prune as ``ckpt prune --json`` prints it: the plan, and its outcome unless a dry run
    (or a refusal) stopped before deleting."""

    plan: PrunePlan
    outcome: PruneOutcome | None
    dry_run: bool = False
    #: With --clean-tmp: the multipart uploads a killed writer left under the root (aborted,
    #: or in a dry run those that would be); not part of the JSON document.
    uploads: UploadCleanup | None = field(default=None, compare=False)

    def to_json(self) -> PruneJSON:
        # Key by key, not ``**plan``: mypy cannot tell that the plan's document has no ``error``.
        plan = self.plan.to_json()
        return {
            "schema_version": plan["schema_version"],
            "ok": plan["ok"],
            "root": plan["root"],
            "policy": plan["policy"],
            "keep": plan["keep"],
            "delete": plan["delete"],
            "clean": plan["clean"],
            "untouched": plan["untouched"],
            "freed_bytes": plan["freed_bytes"],
            "warnings": plan["warnings"],
            "dry_run": self.dry_run,
            "outcome": self.outcome.to_json() if self.outcome else None,
        }


def execute(
    plan: PrunePlan, on_progress: ProgressFn | None = None, *, dry_run: bool = False
) -> PruneResult:
    """Carry out a plan of ``plan_prune_root`` under the root's lock (``execute_plan``; already
    held when the caller planned under ``prune_lock``); the entries are checked again, so a plan
    made a while ago deletes only what is still as seen. A plan that cleans unfinished saves
    also aborts the multipart uploads a killed writer left, once idle as long. ``dry_run``:
    nothing deleted, the uploads that would be aborted listed."""
    root = plan.location
    if root is None:
        raise UsageError("this prune plan was not made from a root (use plan_prune_root)")
    if dry_run:
        return PruneResult(plan, None, True, _clean_uploads(root, plan, dry_run=True))
    held = str(root.child(LOCK_NAME)) in _HELD  # planned under prune_lock: still held
    with contextlib.nullcontext() if held else prune_lock(root):
        outcome = PruneOutcome((), (), ())
        if not plan.is_noop:
            outcome = execute_plan(plan, root, on_progress=on_progress)
        return PruneResult(plan, outcome, uploads=_clean_uploads(root, plan))


def _clean_uploads(
    root: Location, plan: PrunePlan, *, dry_run: bool = False
) -> UploadCleanup | None:
    age = plan.tmp_min_age
    return None if age is None else abort_leftovers(root, age.total_seconds(), dry_run=dry_run)


def execute_plan(
    plan: PrunePlan,
    root: Location,
    *,
    on_progress: ProgressFn | None = None,
) -> PruneOutcome:
    """Delete what ``plan`` removes: re-check, rename each to trash, then remove the trash.

    Progress: ``hide`` then ``delete`` events, one per entry, naming it.

    Unfinished saves are removed only under the root's write claim (``.ckpt-write.lock``):
    while a ckpt writer holds it, its tmp step may be the one it is resuming, so every tmp entry
    is skipped, naming that writer; holding it, no writer can begin one meanwhile."""
    claim, writer = _writers_claim(root, plan)
    try:
        root.refresh()  # the root as it is now that the locks are held
        fresh = {e.name: e for e in root.list()}
        real_root = root.resolve()
        order = sorted(plan.clean, key=lambda r: r.kind != "trash") + list(plan.delete)
        skipped: list[Untouched] = []
        failed: list[Untouched] = []
        safe: list[tuple[Removal, Location]] = []
        for r in order:
            loc = root.child(r.name)
            why = _why_unsafe(r, fresh.get(r.name), loc, real_root, plan.tmp_min_age)
            if why is None and r.kind == "tmp" and writer is not None:
                why = f"{writer} holds the root: it may be resuming this save"
            if why:
                skipped.append(Untouched(r.name, r.path, why))
            else:
                safe.append((r, loc))
        return _delete(root, order, safe, skipped, failed, on_progress)
    finally:
        if claim is not None:
            claim.release()


def _writers_claim(root: Location, plan: PrunePlan) -> tuple[WriteClaim | None, str | None]:
    """The root's write claim, taken when the plan removes unfinished saves: (the claim, None),
    or (None, which writer holds it). A plan without tmp entries needs no claim."""
    if not any(r.kind == "tmp" for r in plan.clean):
        return None, None
    try:
        return claim_root(root, "prune", record_required=False), None
    except LockedError:
        lock_file = root.child(WRITE_LOCK)
        owner = read_owner(lock_file)
        who = f"a ckpt writer ({owner.describe()})" if owner else "a ckpt writer"
        if root.requires_commit_marker:  # a lock object outlives a writer killed elsewhere
            who += f" (if it is surely gone, delete {lock_file})"
        return None, who


def _delete(
    root: Location,
    order: list[Removal],
    safe: list[tuple[Removal, Location]],
    skipped: list[Untouched],
    failed: list[Untouched],
    on_progress: ProgressFn | None,
) -> PruneOutcome:
    """Hide then remove the entries found safe to delete."""
    hidden = _hide_all(root, safe, skipped, failed)
    if on_progress:
        for i, (r, _) in enumerate(hidden, 1):
            on_progress(Progress("hide", r.name, i, len(order)))
    deleted: list[Removal] = []
    if root.requires_commit_marker:
        # Every step at once: the commit markers of all, then their other objects, then each
        # tombstone once the rest of its step is gone (batched deletes, one fresh listing).
        gone = root.delete_trees(
            [loc for _, loc in hidden], first=(COMMIT_MARKER,), last=(TOMBSTONE,)
        )
        for i, (r, loc) in enumerate(hidden, 1):
            if str(loc) in gone:
                failed.append(
                    Untouched(r.name, str(loc), f"{gone[str(loc)]} (the next prune retries)")
                )
            else:
                deleted.append(r)
            if on_progress:
                on_progress(Progress("delete", r.name, i, len(hidden)))
        return PruneOutcome(tuple(deleted), tuple(skipped), tuple(failed))
    for i, (r, loc) in enumerate(hidden, 1):
        try:
            _remove(loc)
            deleted.append(r)
        except UnreachableError:
            raise
        except CkptError as e:
            failed.append(Untouched(r.name, str(loc), f"{e.message} (the next prune retries)"))
        if on_progress:
            on_progress(Progress("delete", r.name, i, len(hidden)))
    return PruneOutcome(tuple(deleted), tuple(skipped), tuple(failed))


def _hide_all(
    root: Location,
    entries: list[tuple[Removal, Location]],
    skipped: list[Untouched],
    failed: list[Untouched],
) -> list[tuple[Removal, Location]]:
    """Hide every entry but trash (already hidden); returns (entry, where it now is).

    Object stores, all steps at once: every tombstone put, then every commit marker deleted
    (batched), so the steps stop looking valid in two waves of requests, not two per step."""
    if not root.requires_commit_marker:
        out = []
        for r, loc in entries:
            try:
                out.append((r, loc if r.kind == "trash" else _hide(loc, _trash_name(r.name))))
            except NotFoundError:
                skipped.append(Untouched(r.name, r.path, "gone before deletion"))
            except UnreachableError:
                raise
            except CkptError as e:
                failed.append(Untouched(r.name, r.path, e.message))
        return out
    steps = [(r, loc) for r, loc in entries if r.kind != "trash"]
    tombs = [
        (loc.child(TOMBSTONE), json.dumps({"trash": _trash_name(r.name)}).encode())
        for r, loc in steps
    ]
    try:
        root.write_many(tombs)
    except UnreachableError:
        raise
    except CkptError as e:
        # Some tombstone could not be put: no step of this run is hidden unless it has one.
        bad = {str(r.name) for r, loc in steps if not loc.child(TOMBSTONE).is_file()}
        for r, _ in steps:
            if r.name in bad:
                failed.append(Untouched(r.name, r.path, e.message))
        steps = [(r, loc) for r, loc in steps if r.name not in bad]
    markers = [loc.child(COMMIT_MARKER) for _, loc in steps]
    refused = root.delete_files([m for m in markers if m.is_file()])
    out = []
    for (r, loc), marker in zip(steps, markers, strict=True):
        if str(marker) in refused:
            failed.append(Untouched(r.name, r.path, refused[str(marker)]))
        else:
            out.append((r, loc))
    return [(r, loc) for r, loc in entries if r.kind == "trash"] + out


def _hide(loc: Location, trash_name: str) -> Location:
    """Make a step stop looking valid before its files go; returns where it now is.

    Locally a rename to the trash name, atomic. Object stores have no rename: a tombstone first
    (the next prune finishes an interrupted delete), then the commit marker goes."""
    if not loc.requires_commit_marker:
        return loc.rename(trash_name)
    loc.child(TOMBSTONE).write_bytes(json.dumps({"trash": trash_name}).encode())
    marker = loc.child(COMMIT_MARKER)
    if marker.is_file():
        marker.delete_file()
    return loc


def _remove(loc: Location) -> None:
    """Delete a hidden step. On object stores the commit marker goes first and the tombstone
    last, so that a delete cut short never looks like a valid step and stays trash."""
    if loc.requires_commit_marker:
        loc.delete_tree(first=(COMMIT_MARKER,), last=(TOMBSTONE,))
    else:
        loc.delete_tree()


def _trash_name(name: str) -> str:
    # Without Orbax's tmp marker: Orbax counts any name containing it as its own unfinished save
    # (and a trainer with cleanup_tmp_directories would race us deleting it).
    return f"{TRASH_PREFIX}{name.replace(TMP_MARKER, '.tmp')}-{secrets.token_hex(4)}"


def _why_unsafe(
    r: Removal,
    entry: Entry | None,
    loc: Location,
    real_root: Location,
    tmp_min_age: timedelta | None,
) -> str | None:
    """Why this entry must not be deleted now, or None when it is still what the plan saw."""
    parsed = parse_step_name(r.name)
    recognised = {
        "step": parsed is not None and not parsed.tmp,
        "tmp": parsed is not None
        and (parsed.tmp or is_partial_write(loc) or is_deletion_leftover(loc))
        and tmp_min_age is not None,
        "trash": r.name.startswith(TRASH_PREFIX) or is_tombstoned(loc),
    }[r.kind]
    if not recognised or "/" in r.name or r.name in (ROOT_METADATA_DIR, LOCK_NAME, ".", ".."):
        return "not a step or tmp directory of this root"
    if entry is None:
        return "gone before deletion"
    if entry.is_symlink:
        return SYMLINK_KEPT
    if not entry.is_dir:
        return "no longer a directory"
    resolved = loc.resolve()
    if resolved.parent != real_root:
        return "resolves outside the root"
    if r.kind == "step" and loc.child(PIN_FILE).exists():
        return "pinned since the plan (`ckpt pin`)"
    if r.kind == "tmp" and tmp_min_age is not None:
        age = datetime.now(timezone.utc) - modified_at(loc)
        if age < tmp_min_age:
            return "modified since the plan: a save may be in progress"
    return None


@contextmanager
def prune_lock(root: Location, command: str = "prune") -> Iterator[Detected]:
    """Hold the root's prune lock (``.ckpt-prune.lock``) for ``command`` (prune, or pin/unpin,
    which change what a prune keeps); raise ``LockedError`` when taken. Yields the root's
    detection, made from a listing taken under the lock: the one a prune plans from, and the
    one that tells pin whether its step still exists.

    The lock is an ``flock`` on that file, dropped by the OS when its holder exits or is killed:
    there is no stale lock to clear by hand. The file records pid, host and start time.
    """
    _refuse_plain_non_roots(root)  # never create the lock file inside a step or a stray directory
    lock_file = root.child(LOCK_NAME)
    # Deleting needs no space (locally a rename, then removal): a prune run to free a full disk
    # holds the flock with an empty owner record rather than refusing.
    lock, _ = take_lock(lock_file, command, record_required=command not in ("prune", "unpin"))
    if lock is None:
        raise _locked(root, lock_file, command)
    with lock:
        _HELD.add(str(lock_file))  # ``execute`` of a plan made under it runs under it
        try:
            root.refresh()  # what another holder changed before we got the lock
            yield require_root(root)
        finally:
            _HELD.discard(str(lock_file))


def _locked(root: Location, lock_file: Location, command: str) -> LockedError:
    """The refusal while another process holds the prune lock: who holds it, since when, and
    what to do."""
    owner = read_owner(lock_file)  # a prune, or `verify --record` writing digests
    holder = owner.command if owner is not None else "prune"
    who = owner.describe() if owner is not None else holder_of(lock_file)
    if command == "prune":
        what, hint = (
            f"another {holder} of {root} is running",
            "wait for it to finish and run this prune again",
        )
    else:
        doing = "pruned" if holder == "prune" else f"changed by {holder}"
        what = f"{root} is being {doing} by another process"
        hint = f"retry the {command} when it finishes"
    if root.requires_commit_marker:
        hint += (
            f"; a {holder} that was killed leaves the lock behind: once that one is surely "
            f"gone, delete {lock_file} and run again"
        )
    return LockedError(f"{what} ({who})", hint=hint)


def _refuse_plain_non_roots(root: Location) -> None:
    """One listing before the lock: a path that is plainly no root (a step, an item, nothing
    that holds steps) gets the full detection and its error. A root detected under the lock
    is then the only detection; the rare old step without metadata whose items are named like
    steps is refused there, and the lock file it briefly held goes with the lock."""
    try:
        entries = root.list()
    except CkptError:
        entries = None
    names = {e.name for e in entries or ()}
    holds_steps = any(
        e.is_dir and (e.name == ROOT_METADATA_DIR or parse_step_name(e.name)) for e in entries or ()
    )
    if not holds_steps or looks_like_item(names) or names & {STEP_METADATA, COMMIT_MARKER}:
        require_root(root)
