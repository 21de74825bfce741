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

from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypedDict

from typing_extensions import NotRequired

from ckpt_cli.core.copy.destination import (
    CopyObject,
    StepCopy,
    copied,
    dest_entries,
    dest_state,
    with_dest,
)
from ckpt_cli.core.format.discovery import (
    Detected,
    StepRef,
    detect,
    legacy_msgpack_error,
    list_saves,
    step_ref,
)
from ckpt_cli.core.format.names import (
    COMMIT_MARKER,
    ROOT_METADATA_DIR,
    TMP_MARKER,
    parse_step_name,
)
from ckpt_cli.core.step_ranges import StepSelection, split_at
from ckpt_cli.core.storage import Location, StorageOptions, open_location
from ckpt_cli.errors import (
    CkptError,
    ErrorJSON,
    NotACheckpointError,
    NotFoundError,
    UsageError,
)

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
    """``ROOT@STEPS`` -> (ROOT, STEPS) unless a path of that very name exists (the one rule,
    ``step_ranges.split_at``); a copy takes whole steps, so ``ROOT@STEP:ITEM`` is refused."""
    path, steps, item = split_at(src)
    if item is not None:
        raise UsageError(f"{src} names an item ({item}): cp copies whole steps (ROOT@STEPS)")
    return path, steps


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
    unfinished: bool = False,
) -> CopyPlan:
    """What ``ckpt cp SRC DST`` would copy (reads listings only): ``steps`` by number,
    ``step_ranges`` as ``--steps`` (``"100-300,500"``), ``latest``, or a ``ROOT@STEPS`` source;
    ``verify`` and ``concurrency`` are how ``execute_copy`` will copy. ``unfinished``: also the
    selected steps a save or deletion has not finished (uncommitted, partial), copied as they
    are, never given a commit marker; unfinished saves in tmp dirs never."""
    if concurrency < 1:
        raise UsageError(f"--concurrency {concurrency}: at least 1 file at a time")
    from ckpt_cli.core.copy.select import combine

    path, at = _split_at(src)
    selection = combine(steps, step_ranges, latest, at)
    source = open_location(path, storage)
    destination = open_location(dst, storage)
    if source == destination or destination.is_within(source) or source.is_within(destination):
        raise UsageError(f"{dst} and {path} overlap: copy into a directory outside the source")
    chosen, skipped, root_files, as_is = _sources(source, selection, unfinished)
    warnings = [f"{name}: {why}; copied as it is, without a commit marker" for name, why in as_is]
    entries = dest_entries(destination)
    root_files = [with_dest(o, destination) for o in root_files]
    unmarked = {name for name, _ in as_is}
    planned = tuple(
        dest_state(n, name, loc, destination, entries, marker=name not in unmarked)
        for n, name, loc in chosen
    )
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
    source: Location, selection: StepSelection, unfinished: bool = False
) -> tuple[list[Chosen], list[tuple[str, str]], list[CopyObject], list[tuple[str, str]]]:
    """The steps (or saves) of ``source`` to copy, those selected but not copied and why, the
    root's own metadata files, and the unfinished steps copied as they are (with ``unfinished``)
    and why each is not committed."""
    found = detect(source)
    if found.kind in ("legacy", "item"):
        raise _not_a_run(source, found.kind)
    if found.kind == "step":
        saves = list_saves(source, found.entries)
        if saves:
            return _saves(source, saves, selection), _not_copied(saves, selection), [], []
        if not selection.everything:
            raise UsageError(f"{source} is a step directory: the step options do not apply")
        return [_lone_step(source, found)], [], [], []
    all_steps = found.steps or []
    picked = _choose(source, all_steps, selection, unfinished)
    chosen: list[Chosen] = [(s.step, s.name, s.location) for s in picked]
    as_is = [(s.name, _why_not_copied(s)) for s in picked if not s.committed]
    skipped = [(n, w) for n, w in _not_copied(all_steps, selection) if n not in dict(as_is)]
    return chosen, skipped, _root_files(source), as_is


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
    if parsed is not None and parsed.tmp:
        raise NotACheckpointError(
            f"{source} is an unfinished save", hint="copy only committed steps"
        )
    ref = step_ref(source, found.entries)
    if not ref.committed:
        raise NotACheckpointError(
            f"{source} is {ref.status}: {ref.reason}",
            hint=f"if it is whole, `ckpt verify {source} --mark-committed` first"
            if ref.stampable
            else "copy only committed steps",
        )
    return (parsed.step if parsed else None, source.name, source)


def _not_copied(steps: list[StepRef], selection: StepSelection) -> list[tuple[str, str]]:
    """The selected steps that are not committed, and why they are not copied."""
    return [
        (s.name, _why_not_copied(s))
        for s in steps
        if not s.committed and (selection.everything or selection.matches(s.step))
    ]


def _why_not_copied(s: StepRef) -> str:
    """A skipped step's reason: the two every release has seen in the same words (a tmp dir, an
    object-store step without its marker), else its state and its writer's evidence."""
    if s.status == "incomplete" and TMP_MARKER in s.name:
        return "unfinished save"
    if s.status == "uncommitted" and s.location.requires_commit_marker:
        return f"uncommitted (no {COMMIT_MARKER})"
    return f"{s.status}: {s.reason}" if s.reason else s.status


def _root_files(source: Location) -> list[CopyObject]:
    """The root's own metadata files (``_ROOT_METADATA``), copied with any step."""
    meta = source.child(ROOT_METADATA_DIR)
    if not meta.is_dir():
        return []
    return [
        CopyObject(f"{ROOT_METADATA_DIR}/{rel}", e.size) for rel, e in meta.walk() if copied(rel)
    ]


def _choose(
    root: Location, steps: list[StepRef], sel: StepSelection, unfinished: bool = False
) -> list[StepRef]:
    # With ``unfinished``: the steps a save or deletion left unfinished too, never a tmp dir.
    committed = [
        s for s in steps if s.committed or (unfinished and s.status in ("uncommitted", "partial"))
    ]
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
        if not any(s in committed for s in matches):
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
