"""A step of a copy: its files (``CopyObject``: which are copied, in which marker order), and
what the destination holds under its name (``dest_state``): nothing (``new``), a step an earlier
ckpt write left unfinished (``resume``: a local tmp dir holding ckpt's owner record, or an
in-place step holding ``.ckpt-writing``), or a committed step (``present``: checked object by
object, never changed). Anything else there is refused. Listings only, no file contents.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ckpt_cli.core.digest.records import STATE_FILE
from ckpt_cli.core.format.names import (
    COMMIT_MARKER,
    PRUNE_LOCK,
    STEP_METADATA,
    TMP_MARKER,
    TOMBSTONE,
    WRITING_MARKER,
    looks_like_item,
)
from ckpt_cli.core.storage import Location
from ckpt_cli.core.write.claim import OWNER_FILE, WRITE_LOCK, read_owner
from ckpt_cli.errors import (
    RefusedError,
    UsageError,
)

State = Literal["new", "resume", "present"]
#: ckpt's own bookkeeping inside a step or root: never copied.
BOOKKEEPING = frozenset({WRITING_MARKER, OWNER_FILE, TOMBSTONE, STATE_FILE, WRITE_LOCK, PRUNE_LOCK})
#: A file ``write_bytes`` was writing when its process died (``.NAME.tmp-PID``).
_PARTIAL_RE = re.compile(r"^\..+\.tmp-\d+$")
COMMIT_TEXT = "Checkpoint commit was successful to {path}"


def marker_rank(rel: str) -> int | None:
    """Where a step file goes in the marker order (None: a data file, written first)."""
    if rel == STEP_METADATA:
        return 0
    if rel == COMMIT_MARKER:
        return 2
    if rel.rsplit("/", 1)[-1] == COMMIT_MARKER:
        return 1
    return None


def copied(rel: str) -> bool:
    """Whether a file below a step (or the root's metadata) is copied."""
    name = rel.rsplit("/", 1)[-1]
    return name not in BOOKKEEPING and not _PARTIAL_RE.match(name)


@dataclass(frozen=True)
class CopyObject:
    """One file: its path below the step, size, and the size of the file of that path at the
    destination (None: absent)."""

    rel: str
    size: int
    dest_size: int | None = None

    @property
    def marker(self) -> int | None:
        return marker_rank(self.rel)


@dataclass(frozen=True)
class StepCopy:
    step: int | None  # None: a Checkpointer's save, without a step number
    name: str
    source: Location
    target: Location  # the step's final place at the destination
    write_to: Location  # where its files go: a tmp dir (local) or the target itself (buckets)
    state: State
    objects: tuple[CopyObject, ...]
    #: Files at the destination the source lacks: removed before the markers (resume only).
    extra: tuple[str, ...] = ()
    #: The destination needs a commit_success.txt the source step has not.
    add_marker: bool = False
    #: Other leftovers of this step by ckpt writers (local tmp dirs): removed.
    leftovers: tuple[Location, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(o.size for o in self.objects)

    def pending(self) -> tuple[int, int]:
        """Objects and bytes not at the destination in the same size (copied for sure)."""
        todo = [o for o in self.objects if o.dest_size != o.size]
        return len(todo), sum(o.size for o in todo)


def dest_entries(destination: Location) -> dict[str, bool]:
    """Names directly in the destination root (name -> is a directory); refuses a destination
    that is a file, a step or an item."""
    if not destination.exists():
        return {}
    if not destination.is_dir():
        raise UsageError(f"{destination} is a file: the destination is a root directory")
    entries = destination.list()
    names = frozenset(e.name for e in entries)
    if STEP_METADATA in names or COMMIT_MARKER in names or looks_like_item(names):
        raise UsageError(
            f"{destination} is a step or item directory: the destination is a root",
            hint=f"pass its root {destination.parent}",
        )
    return {e.name: e.is_dir for e in entries}


def with_dest(o: CopyObject, destination: Location) -> CopyObject:
    loc = destination.child(*o.rel.split("/"))
    return CopyObject(o.rel, o.size, loc.size() if loc.is_file() else None)


def source_objects(step: Location) -> tuple[CopyObject, ...]:
    out = []
    for rel, entry in step.walk():
        if entry.is_symlink:
            raise RefusedError(
                f"{step}/{rel} is a symlink: cp copies no symlinks (it could lead anywhere)",
                hint="replace it with the file it points to, or copy the steps without it",
            )
        if copied(rel):
            out.append(CopyObject(rel, entry.size))
    return tuple(out)


def dest_state(
    number: int | None,
    name: str,
    source: Location,
    destination: Location,
    entries: dict[str, bool],
    *,
    marker: bool = True,
) -> StepCopy:
    """One source step against what the destination holds under its name; ``marker`` False:
    an unfinished step copied as it is, never given the commit marker it lacks."""
    objects = source_objects(source)
    has_marker = any(o.rel == COMMIT_MARKER for o in objects)
    add_marker = marker and destination.requires_commit_marker and not has_marker
    target = destination.child(name)
    in_place = destination.requires_commit_marker
    leftovers = []
    if not in_place:
        # Tmp dirs of this step that hold ckpt's owner record (under the root's claim their
        # writer cannot be alive): the newest is resumed, the others removed.
        # A save's tmp dir (``state.orbax-checkpoint-tmp-<µs>``) parses as no step: by name.
        for entry_name in sorted(entries):
            if TMP_MARKER not in entry_name or entry_name.split(TMP_MARKER, 1)[0] != name:
                continue
            loc = destination.child(entry_name)
            if entries[entry_name] and read_owner(loc.child(OWNER_FILE)) is not None:
                leftovers.append(loc)
    if name in entries:
        have = {rel: e.size for rel, e in target.walk()}
        names = {rel for rel in have if "/" not in rel}
        if COMMIT_MARKER in names or (not in_place and WRITING_MARKER not in names):
            # A finished step (locally the name alone says so): checked, never changed.
            missing = [o.rel for o in objects if have.get(o.rel) != o.size]
            if missing:
                raise RefusedError(
                    f"{target} already exists and differs from {source} "
                    f"({len(missing)} files missing or of another size, e.g. {missing[0]})",
                    hint="choose another destination; ckpt never overwrites a step",
                )
            return StepCopy(
                number, name, source, target, target, "present",
                tuple(CopyObject(o.rel, o.size, have[o.rel]) for o in objects),
            )  # fmt: skip
        if WRITING_MARKER not in names or read_owner(target.child(WRITING_MARKER)) is None:
            raise RefusedError(
                f"{target} already exists and is not committed (not written by ckpt)",
                hint="choose another destination, or remove it if it is surely abandoned",
            )
        return _resume(number, name, source, target, target, objects, have, add_marker)
    if leftovers:
        newest = leftovers[-1]
        have = {rel: e.size for rel, e in newest.walk()}
        return _resume(
            number, name, source, target, newest, objects, have, add_marker, tuple(leftovers[:-1])
        )
    # Locally the tmp dir is named when the write begins (execute).
    return StepCopy(number, name, source, target, target, "new", objects, add_marker=add_marker)


def _resume(
    number: int | None,
    name: str,
    source: Location,
    target: Location,
    write_to: Location,
    objects: tuple[CopyObject, ...],
    have: dict[str, int],
    add_marker: bool,
    leftovers: tuple[Location, ...] = (),
) -> StepCopy:
    wanted = {o.rel for o in objects} | ({COMMIT_MARKER} if add_marker else set())
    extra = tuple(sorted(r for r in have if r not in wanted and copied(r)))
    return StepCopy(
        number, name, source, target, write_to, "resume",
        tuple(CopyObject(o.rel, o.size, have.get(o.rel)) for o in objects),
        extra, add_marker, leftovers,
    )  # fmt: skip
