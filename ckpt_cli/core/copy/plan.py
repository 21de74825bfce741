"""``plan_copy``: the steps and objects ``ckpt cp`` copies, and what the destination holds already.

A plan reads listings only (no file contents): the source's committed steps in the selection
with every file's size, and for each step what is at the destination: nothing (``new``), a
step an earlier ckpt write left unfinished (``resume``: a local tmp dir holding ckpt's owner
record, or an in-place step holding ``.ckpt-writing``), or a committed step (``present``:
checked object by object, never changed). Anything else there is refused.

Markers. The files that make a step look finished are written last, in this order:
``_CHECKPOINT_METADATA``, the items' ``commit_success.txt``, the step's ``commit_success.txt``;
locally the rename of the tmp dir comes after them. A bucket step whose source has no
``commit_success.txt`` (local steps of Orbax before 0.12.3, where the rename was the commit)
gets one, as Orbax writes on GCS: without it the copy is uncommitted (Orbax #394).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypedDict

from typing_extensions import NotRequired

from ckpt_cli.core.copy.select import StepSelection
from ckpt_cli.core.digest.records import STATE_FILE
from ckpt_cli.core.format.discovery import (
    Detected,
    StepRef,
    detect,
    legacy_msgpack_error,
    list_saves,
)
from ckpt_cli.core.format.names import (
    COMMIT_MARKER,
    PRUNE_LOCK,
    ROOT_METADATA_DIR,
    STEP_METADATA,
    TMP_MARKER,
    TOMBSTONE,
    WRITING_MARKER,
    looks_like_item,
    parse_step_name,
)
from ckpt_cli.core.storage import Location, StorageOptions, open_location
from ckpt_cli.core.write.claim import OWNER_FILE, WRITE_LOCK, read_owner
from ckpt_cli.errors import (
    CkptError,
    ErrorJSON,
    NotACheckpointError,
    NotFoundError,
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


#: How one step's copy ended.
StepStatus = Literal["copied", "already-there", "failed"]


class CpStepJSON(TypedDict):
    """One step: where it goes, what the destination held (``new``, ``resume``: an unfinished
    ckpt write, ``present``: a committed step, checked), objects to copy and to check.
    ``step`` is null for a save without a step number (a Checkpointer's, by its name)."""

    step: int | None
    name: str
    source: str
    destination: str
    state: Literal["new", "resume", "present"]
    objects: int
    bytes: int
    to_copy_objects: int
    to_copy_bytes: int
    to_check_objects: int
    adds_commit_marker: bool


class CpSkippedJSON(TypedDict):
    name: str
    reason: str


class CpStepOutcomeJSON(TypedDict):
    name: str
    status: StepStatus
    copied_objects: int
    copied_bytes: int
    skipped_objects: int
    skipped_bytes: int
    problem: str | None


class CpOutcomeJSON(TypedDict):
    """What the copy did: objects written, objects found whole at the destination and kept."""

    copied_objects: int
    copied_bytes: int
    skipped_objects: int
    skipped_bytes: int
    verified_objects: int
    unverified_items: list[str]
    seconds: float
    steps: list[CpStepOutcomeJSON]


class CpJSON(TypedDict):
    """``ckpt cp --json``: the plan (steps, objects, bytes) and, unless --dry-run, the outcome;
    a step that failed ``--verify`` or was refused carries ``ok: false`` and ``error`` here."""

    schema_version: int
    ok: bool
    source: str
    destination: str
    selection: str
    verify: bool
    total_objects: int
    total_bytes: int
    root_files: list[str]
    steps: list[CpStepJSON]
    skipped: list[CpSkippedJSON]
    warnings: list[str]
    outcome: NotRequired[CpOutcomeJSON]
    error: NotRequired[ErrorJSON]


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


@dataclass(frozen=True)
class CopyPlan:
    #: 2: a save without a step number (a Checkpointer's, copied by its name) has
    #: ``"step": null`` (1 printed 0 for it).
    SCHEMA_VERSION: ClassVar[int] = 2

    source: Location
    destination: Location
    selection: StepSelection
    steps: tuple[StepCopy, ...]
    #: Root-level files (``metadata/``): copied first when absent at the destination.
    root_files: tuple[CopyObject, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()  # source steps not copied, and why
    warnings: tuple[str, ...] = ()
    #: Check files against their recorded digests as they stream (``--verify``).
    verify: bool = False
    #: Files copied at once (``--concurrency``).
    concurrency: int = 16
    storage: StorageOptions | None = field(default=None, compare=False)

    @property
    def total_objects(self) -> int:
        return sum(len(s.objects) for s in self.steps) + len(self.root_files)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.steps) + sum(o.size for o in self.root_files)

    def to_json(self, outcome: CpOutcomeJSON | None = None, ok: bool = True) -> CpJSON:
        steps: list[CpStepJSON] = []
        for s in self.steps:
            n, b = s.pending()
            steps.append(
                {
                    "step": s.step,
                    "name": s.name,
                    "source": str(s.source),
                    "destination": str(s.target),
                    "state": s.state,
                    "objects": len(s.objects),
                    "bytes": s.bytes,
                    "to_copy_objects": n,
                    "to_copy_bytes": b,
                    "to_check_objects": len(s.objects) - n,
                    "adds_commit_marker": s.add_marker,
                }
            )
        skipped: list[CpSkippedJSON] = [{"name": n, "reason": r} for n, r in self.skipped]
        body: CpJSON = {
            "schema_version": self.SCHEMA_VERSION,
            "ok": ok,
            "source": str(self.source),
            "destination": str(self.destination),
            "selection": self.selection.describe(),
            "verify": self.verify,
            "total_objects": self.total_objects,
            "total_bytes": self.total_bytes,
            "root_files": [o.rel for o in self.root_files if o.dest_size is None],
            "steps": steps,
            "skipped": skipped,
            "warnings": list(self.warnings),
        }
        if outcome is not None:
            body["outcome"] = outcome
        return body


def _split_at(src: str) -> tuple[str, str | None]:
    """``ROOT@STEPS`` -> (ROOT, STEPS) unless a path of that very name exists."""
    import os

    path, at, tail = src.rpartition("@")
    if at and path and re.fullmatch(r"[\d,\-\s]+", tail) and not os.path.exists(src):
        return path, tail
    return src, None


def plan_copy(
    src: str,
    dst: str,
    *,
    steps: list[int] | None = None,
    step_ranges: str | None = None,
    latest: bool = False,
    verify: bool = False,
    concurrency: int = 16,
    storage: StorageOptions | None = None,
) -> CopyPlan:
    """What ``ckpt cp SRC DST`` would copy (reads listings only): ``steps`` by number,
    ``step_ranges`` as ``--steps`` (``"100-300,500"``), ``latest``, or a ``ROOT@STEPS`` source;
    ``verify`` and ``concurrency`` are how ``execute_copy`` will copy."""
    if concurrency < 1:
        raise UsageError(f"--concurrency {concurrency}: at least 1 file at a time")
    from ckpt_cli.core.copy.select import combine

    path, at = _split_at(src)
    selection = combine(steps, step_ranges, latest, at)
    source = open_location(path, storage)
    destination = open_location(dst, storage)
    if source == destination or destination.is_within(source) or source.is_within(destination):
        raise UsageError(f"{dst} and {path} overlap: copy into a directory outside the source")
    chosen, skipped, root_files = _sources(source, selection)
    warnings: list[str] = []
    entries = dest_entries(destination)
    root_files = [_with_dest(o, destination) for o in root_files]
    planned = tuple(dest_state(n, name, loc, destination, entries) for n, name, loc in chosen)
    for o in root_files:
        if o.dest_size is not None and o.dest_size != o.size:
            warnings.append(f"{destination}/{o.rel} differs from the source's: kept as it is")
    return CopyPlan(
        source, destination, selection, planned, tuple(root_files), tuple(skipped),
        tuple(warnings), verify, concurrency, storage,
    )  # fmt: skip


#: A step of the source to copy: its number (None: a save without one), name and place.
Chosen = tuple[int | None, str, Location]


def _sources(
    source: Location, selection: StepSelection
) -> tuple[list[Chosen], list[tuple[str, str]], list[CopyObject]]:
    """The steps (or saves) of ``source`` to copy, those selected but not copied and why, and
    the root's own metadata files."""
    found = detect(source)
    if found.kind in ("legacy", "item"):
        raise _not_a_run(source, found.kind)
    if found.kind == "step":
        saves = list_saves(source, found.entries)
        if saves:
            return _saves(source, saves, selection), _not_copied(saves, selection), []
        if not selection.everything:
            raise UsageError(f"{source} is a step directory: the step options do not apply")
        return [_lone_step(source, found)], [], []
    all_steps = found.steps or []
    chosen: list[Chosen] = [
        (s.step, s.name, s.location) for s in _choose(source, all_steps, selection)
    ]
    return chosen, _not_copied(all_steps, selection), _root_files(source)


def _saves(source: Location, saves: list[StepRef], selection: StepSelection) -> list[Chosen]:
    """Checkpointer saves side by side (the NNX guide's ``ckpt_dir/state``): each is copied as
    its own entry, as a step of a root is. They have no step number to select them by."""
    names = ", ".join(s.name for s in saves)
    if not selection.everything:
        raise UsageError(
            f"{source} holds saves without step numbers ({names}): the step options do not apply",
            hint=f"copy every save, or one save by its directory, e.g. {saves[0].location}",
        )
    committed: list[Chosen] = [(None, s.name, s.location) for s in saves if s.committed]
    if not committed:
        raise NotACheckpointError(
            f"{source} holds no committed save: {names} have no {COMMIT_MARKER}, which Orbax "
            "writes into a save when it is done",
            hint="if no save is writing them and they are whole, mark each save: "
            f"`ckpt verify {saves[0].location} --mark-committed`",
        )
    return committed


def _not_a_run(source: Location, kind: str) -> CkptError:
    if kind == "legacy":
        return legacy_msgpack_error(source, hint="copy the file itself")
    return UsageError(
        f"{source} is an item directory: cp copies runs and steps",
        hint=f"pass its step {source.parent}",
    )


def _lone_step(source: Location, found: Detected) -> Chosen:
    """A step directory given as the source: copied when committed."""
    parsed = parse_step_name(source.name)
    names = frozenset(e.name for e in found.entries)
    if parsed is not None and parsed.tmp:
        raise NotACheckpointError(
            f"{source} is an unfinished save", hint="copy only committed steps"
        )
    if source.requires_commit_marker and COMMIT_MARKER not in names:
        raise NotACheckpointError(
            f"{source} is uncommitted (no {COMMIT_MARKER})",
            hint=f"if it is whole, `ckpt verify {source} --mark-committed` first",
        )
    return (parsed.step if parsed else None, source.name, source)


def _not_copied(steps: list[StepRef], selection: StepSelection) -> list[tuple[str, str]]:
    """The selected steps that are not committed, and why they are not copied."""
    return [
        (
            s.name,
            "unfinished save" if s.status == "incomplete" else f"uncommitted (no {COMMIT_MARKER})",
        )
        for s in steps
        if not s.committed and (selection.everything or selection.matches(s.step))
    ]


def _root_files(source: Location) -> list[CopyObject]:
    """The root's own metadata files (``_ROOT_METADATA``), copied with any step."""
    meta = source.child(ROOT_METADATA_DIR)
    if not meta.is_dir():
        return []
    return [
        CopyObject(f"{ROOT_METADATA_DIR}/{rel}", e.size) for rel, e in meta.walk() if copied(rel)
    ]


def _choose(root: Location, steps: list[StepRef], sel: StepSelection) -> list[StepRef]:
    committed = [s for s in steps if s.committed]
    if sel.everything:
        if not committed:
            raise NotACheckpointError(
                f"{root} has no committed step", hint="run `ckpt ls` on it to see what is there"
            )
        return committed
    if sel.latest:
        if not committed:
            raise NotACheckpointError(f"{root} has no committed step")
        return committed[-1:]
    have = ", ".join(str(s.step) for s in committed) or "none"
    for n in sel.singles:
        matches = [s for s in steps if s.step == n]
        if not matches:
            raise NotFoundError(f"step {n} not found in {root}", hint=f"committed steps: {have}")
        if not any(s.committed for s in matches):
            raise NotACheckpointError(
                f"step {n} of {root} is {matches[0].status} ({matches[0].name})",
                hint="cp copies committed steps only",
            )
    out = [s for s in committed if sel.matches(s.step)]
    if not out:
        raise NotFoundError(
            f"no committed step of {root} in {sel.describe()}", hint=f"committed steps: {have}"
        )
    return out


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


def _with_dest(o: CopyObject, destination: Location) -> CopyObject:
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
) -> StepCopy:
    """One source step against what the destination holds under its name."""
    objects = source_objects(source)
    has_marker = any(o.rel == COMMIT_MARKER for o in objects)
    add_marker = destination.requires_commit_marker and not has_marker
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
