"""A step's state from its writer's own evidence, the same for every command.

Orbax finishes a save in one of two ways. Renaming (local disks by default): the step is written
as ``N.orbax-checkpoint-tmp`` and renamed, so a step under its final name is whole whatever files
it holds (releases before 0.12.3 wrote no ``commit_success.txt`` there). Writing in place
(object stores, and commit-file atomicity, the mode GCSFuse mounts get): the step is written
under its final name and ``commit_success.txt``, written last, is the only sign it finished;
before it, ``_CHECKPOINT_METADATA`` gets its ``commit_timestamp_nsecs``. So a step without the
marker is unfinished when its commit timestamp is still null (no renamed step ever has one: the
rename comes after it), or when the root's writer writes in place: its item markers name the
step's final path, where a renamed step's name its tmp path.

Two more records of 0.12: a v1 partial save lives in ``N.partial_save`` until finalized (never a
restorable step), and a deletion leaves ``_CHECKPOINT_DELETION`` naming the item being deleted
(readers skip it; the step restores without it), or, for a whole step stopped mid-way, a
directory holding only its marker files (nothing restorable is left).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ckpt_cli.core.format.metadata import read_step_metadata
from ckpt_cli.core.format.names import (
    COMMIT_MARKER,
    DELETION_RECORD,
    STEP_METADATA,
    TMP_MARKER,
    TREE_METADATA,
    V1_MARKER,
    StepName,
    is_plain_name,
)
from ckpt_cli.core.storage import Entry, Location
from ckpt_cli.errors import CkptError

Status = Literal["committed", "uncommitted", "incomplete", "partial"]

#: What a stopped whole-step deletion keeps until last (Orbax removes the rest first).
_DELETION_KEEPS = frozenset({STEP_METADATA, TREE_METADATA, V1_MARKER})
#: Names Orbax never lets a deletion record name (``RESERVED_CHECKPOINTABLE_KEYS`` and the step
#: metadata itself).
_RESERVED = frozenset({"metrics", "pytree", DELETION_RECORD, STEP_METADATA})
_NEVER_FINISHED = "its save never finished"


@dataclass(frozen=True)
class Verdict:
    """A step's state, why it is not committed (None when it is), and the items a deletion
    record says are being deleted (the step restores without them)."""

    status: Status
    reason: str | None = None
    deleting: tuple[str, ...] = ()
    #: Whole but for its marker: ``verify --mark-committed`` may stamp it once it checks clean
    #: (never a save whose commit timestamp is still null: Orbax never finished it).
    stampable: bool = False


def judge(
    location: Location,
    name: StepName,
    children: Sequence[Entry],
    in_place_writer: str | None = None,
) -> Verdict:
    """The state of the step at ``location`` (its listing: ``children``). ``in_place_writer``:
    the root's evidence that its writer writes steps in place (``root_writes_in_place``)."""
    names = frozenset(e.name for e in children)
    if name.tmp:
        return Verdict(
            "incomplete",
            f"an unfinished save (its name carries {TMP_MARKER}): Orbax removes it on its next "
            "save",
        )
    if name.partial:
        return Verdict(
            "partial",
            "a v1 partial save not finalized: no reader restores it until "
            "ocp.partial.finalize(path) makes it a step",
        )
    if COMMIT_MARKER not in names:
        if leftover := _deletion_leftover(location, children):
            return Verdict("incomplete", leftover)
        if why := _unfinished(location, names, in_place_writer):
            return Verdict("uncommitted", why, stampable=not why.startswith(_NEVER_FINISHED))
    if DELETION_RECORD in names:
        return _with_deletion(location)
    return Verdict("committed")


def _unfinished(location: Location, names: frozenset[str], in_place_writer: str | None) -> str:
    """Why a step without ``commit_success.txt`` is unfinished, or '' when it is whole."""
    if location.requires_commit_marker:
        return (
            f"no {COMMIT_MARKER}: on an object store the marker is the commit (a step copied "
            "without it: `ckpt verify --mark-committed` stamps it once it checks clean)"
        )
    if STEP_METADATA in names:
        try:
            meta = read_step_metadata(location)
        except CkptError:
            meta = None
        started = meta is not None and meta.init_timestamp_nsecs is not None
        if started and meta is not None and meta.commit_timestamp_nsecs is None:
            return (
                f"{_NEVER_FINISHED}: commit_timestamp_nsecs is null in {STEP_METADATA} "
                f"and there is no {COMMIT_MARKER} (written in place, stopped before its commit)"
            )
    if in_place_writer:
        return (
            f"no {COMMIT_MARKER}, which this root's writer writes last ({in_place_writer}): "
            "a reader configured like it refuses the step; if it was saved before the writer "
            "switched to commit-file mode, `ckpt verify ROOT --deep --mark-committed` stamps it"
        )
    return ""


def _deletion_leftover(location: Location, children: Sequence[Entry]) -> str:
    """Why a step is what a stopped whole-step deletion left (only marker files, its items
    gone), or ''."""
    if any(e.is_dir for e in children) or not children:
        return ""
    names = {e.name for e in children}
    if not names <= _DELETION_KEEPS | {DELETION_RECORD} or STEP_METADATA not in names:
        return ""
    try:
        handlers = read_step_metadata(location).item_handlers
    except CkptError:
        return ""
    if isinstance(handlers, dict) and handlers:
        gone = ", ".join(sorted(handlers))
    elif isinstance(handlers, str) and TREE_METADATA not in names:
        gone = "its data"
    else:
        return ""
    return (
        f"what a stopped deletion left: only {', '.join(sorted(names))}, its items ({gone}) "
        "gone; nothing restorable (`ckpt prune --clean-tmp` removes it)"
    )


def is_deletion_leftover(location: Location) -> bool:
    """Whether ``location`` is, now, what a stopped whole-step deletion left (prune checks it
    again right before removing it)."""
    try:
        return bool(_deletion_leftover(location, location.list()))
    except CkptError:
        return False


def _with_deletion(location: Location) -> Verdict:
    """A step with a deletion record: committed without the item it names, or, when the record
    is not one Orbax accepts, a step Orbax refuses to read at all."""
    try:
        item = read_deletion_record(location)
    except CkptError as e:
        return Verdict(
            "uncommitted",
            f"{e.message}: Orbax refuses to read this step (DeletionRecoveryError); restore "
            f"{DELETION_RECORD} from a copy, or finish the deletion with Orbax",
        )
    return Verdict("committed", None, (item,))


def read_deletion_record(step: Location) -> str:
    """The item a step's ``_CHECKPOINT_DELETION`` names, checked as Orbax checks it
    (``deletion/metadata.py`` ``read_record``); ``InvalidMetadataError`` naming what is wrong."""
    from ckpt_cli.errors import InvalidMetadataError

    where = step.child(DELETION_RECORD)
    raw = where.read_json()

    def bad(what: str) -> InvalidMetadataError:
        return InvalidMetadataError(f"{where} is not a deletion record Orbax accepts: {what}")

    if not isinstance(raw, dict):
        raise bad("not a JSON object")
    name = raw.get("checkpointable_name")
    if not isinstance(name, str) or not is_plain_name(name) or name in _RESERVED:
        raise bad(f"checkpointable_name {name!r} names no item")
    op = raw.get("operation_id")
    if not isinstance(op, str) or len(op) != 32 or any(c not in "0123456789abcdef" for c in op):
        raise bad("operation_id is not 32 hex digits")
    original, updated = raw.get("original_metadata"), raw.get("updated_metadata")
    if not isinstance(original, dict) or updated != _without(original, name):
        raise bad(f"updated_metadata is not original_metadata without {name!r}")
    current = step.child(STEP_METADATA).read_json_if_exists()
    if current not in (original, updated):
        raise bad(f"{STEP_METADATA} is neither the metadata before nor after the deletion")
    return name


def _without(original: dict[str, Any], name: str) -> dict[str, Any] | None:
    handlers = original.get("item_handlers")
    if not isinstance(handlers, dict) or name not in handlers:
        return None
    return {**original, "item_handlers": {k: v for k, v in handlers.items() if k != name}}


def root_writes_in_place(steps: Sequence[tuple[Location, Sequence[Entry]]]) -> str:
    """The evidence that a root's writer writes its steps in place (commit-file atomicity), or
    '': the newest step (``steps`` in step order) with ``commit_success.txt`` whose item's own
    marker names the step's final path. A renamed step's item markers name its tmp path
    (``N.orbax-checkpoint-tmp/x``). One small read for the whole root, asked only when some
    step has no marker."""
    for loc, children in reversed(steps):
        if not any(e.name == COMMIT_MARKER for e in children):
            continue
        for e in children:
            if not e.is_dir or e.is_symlink:
                continue
            try:
                text = loc.child(e.name, COMMIT_MARKER).read_bytes(4096).decode(errors="replace")
            except CkptError:
                continue
            if TMP_MARKER not in text and f"{loc.name}/{e.name}" in text:
                return f"step {loc.name}'s item {e.name} was written in place"
            return ""
    return ""
