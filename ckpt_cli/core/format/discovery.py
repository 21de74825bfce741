"""Layout discovery: what a path is (root, step, item), which steps a root holds, and their state.

Locally the final rename is the commit, so a step without ``commit_success.txt`` (written only
since 0.12.3) is still complete; object stores have no rename and need the marker. Names and
markers are in ``names.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ckpt_cli.core.format.evidence import Status as Status
from ckpt_cli.core.format.evidence import Verdict, judge, root_writes_in_place
from ckpt_cli.core.format.items import ItemKind, holds_arrays
from ckpt_cli.core.format.names import (
    COMMIT_MARKER,
    LEGACY_MSGPACK_RE,
    METRICS_ITEM,
    ROOT_METADATA_DIR,
    STEP_METADATA,
    TMP_MARKER,
    TOMBSTONE,
    TREE_METADATA,
    WRITING_MARKER,
    StepName,
    is_plain_name,
    json_item_files,
    looks_like_item,
    parse_step_name,
)
from ckpt_cli.core.storage import Entry, Location
from ckpt_cli.errors import (
    CkptError,
    NotACheckpointError,
    NotFoundError,
    SeveralItemsError,
    UnsupportedError,
)

Kind = Literal["root", "step", "item", "legacy"]


@dataclass(frozen=True)
class StepRef:
    """A step directory of a root, with its commit state read from its listing."""

    step: int
    name: str
    location: Location
    status: Status
    prefix: str | None
    children: tuple[Entry, ...]
    #: Why the step is not committed, from its writer's evidence (``evidence.judge``).
    reason: str | None = None
    #: Items a deletion record names: being deleted, the step restores without them.
    deleting: tuple[str, ...] = ()
    #: Whole but for its commit marker (``Verdict.stampable``).
    stampable: bool = False

    @property
    def committed(self) -> bool:
        return self.status == "committed"

    @property
    def child_names(self) -> frozenset[str]:
        return frozenset(e.name for e in self.children)


@dataclass(frozen=True)
class ItemRef:
    """One item of a step (``default``, ``state``, ``params``...), ready to be read."""

    location: Location
    name: str
    step: int | None
    step_location: Location | None
    root: Location | None


def _looks_like_step(loc: Location, names: frozenset[str], children: list[Entry]) -> bool:
    if STEP_METADATA in names or COMMIT_MARKER in names or WRITING_MARKER in names:
        return True
    if looks_like_item(names):
        return True
    # A step written before _CHECKPOINT_METADATA existed (Orbax 0.4): just `N/` holding its
    # items, recognised by what they hold. Only such steps cost a listing per item here.
    return any(
        e.is_dir
        and (e.name == METRICS_ITEM or _holds_item(loc.child(e.name)))
        and TMP_MARKER not in e.name
        for e in children
    )


def _holds_item(loc: Location) -> bool:
    try:
        return looks_like_item(frozenset(e.name for e in loc.list()), json_items=True)
    except CkptError:
        return False


def step_status(location: Location, name: StepName, names: frozenset[str]) -> Status:
    """The state a step's name and marker alone tell (``evidence.judge`` reads the rest)."""
    if name.tmp:
        return "incomplete"
    if name.partial:
        return "partial"
    if location.requires_commit_marker and COMMIT_MARKER not in names:
        return "uncommitted"
    return "committed"


def _judged(ref: StepRef, parsed: StepName, in_place: str | None) -> StepRef:
    v: Verdict = judge(ref.location, parsed, ref.children, in_place)
    return replace(
        ref, status=v.status, reason=v.reason, deleting=v.deleting, stampable=v.stampable
    )


def list_steps(root: Location, entries: list[Entry] | None = None) -> list[StepRef]:
    """Every step, unfinished save and partial save directly under ``root``, sorted by step
    then name, each with its state from its writer's evidence (``evidence.judge``)."""
    found: list[tuple[StepRef, StepName]] = []
    for entry in entries if entries is not None else root.list():
        if not entry.is_dir or entry.name.startswith("."):
            continue
        parsed = parse_step_name(entry.name)
        if parsed is None:
            continue
        loc = root.child(entry.name)
        try:
            children = loc.list()
        except NotFoundError:
            # Gone since the root was listed (a trainer renamed its save, or its retention
            # removed a step): expected beside a live trainer, not an error.
            continue
        names = frozenset(c.name for c in children)
        if TOMBSTONE in names:
            continue  # a step prune has begun to delete (object stores): trash, not a step
        # A tmp dir may be empty (the save died at once); a finished name must hold a step.
        unfinished = parsed.tmp or parsed.partial
        if not unfinished and not _looks_like_step(loc, names, children):
            continue
        status = step_status(loc, parsed, names)
        ref = StepRef(parsed.step, entry.name, loc, status, parsed.prefix, tuple(children))
        found.append((ref, parsed))
    found.sort(key=lambda f: f[0].step)
    in_place = None
    if not root.requires_commit_marker and any(
        not f[1].tmp and not f[1].partial and COMMIT_MARKER not in f[0].child_names for f in found
    ):
        in_place = root_writes_in_place(
            [(r.location, r.children) for r, p in found if not p.tmp and not p.partial]
        )
    steps = [_judged(r, p, in_place) for r, p in found]
    steps.sort(key=lambda s: (s.step, s.status != "committed", s.name))
    return steps


def step_ref(location: Location, entries: Sequence[Entry]) -> StepRef:
    """A step directory, or a save without a step number, given by itself as one entry of a
    listing (a name that is no step name: step 0, no prefix). On an object store it is
    committed only with its ``commit_success.txt``: Orbax writes that marker into a
    Checkpointer's save directory as into a manager's step (``CommitFileTemporaryPath``)."""
    parsed = parse_step_name(location.name) or StepName(0, None, False)
    names = frozenset(e.name for e in entries)
    status = step_status(location, parsed, names)
    ref = StepRef(parsed.step, location.name, location, status, parsed.prefix, tuple(entries))
    in_place = None
    if status == "committed" and COMMIT_MARKER not in names and not parsed.tmp:
        in_place = _siblings_in_place(location)
    return _judged(ref, parsed, in_place)


def _siblings_in_place(step: Location) -> str | None:
    """The evidence that the root holding ``step`` writes in place (``root_writes_in_place``),
    from the nearest steps with a marker: asked only of a step given by its path that has
    no marker of its own."""
    root = step.parent
    try:
        siblings = [
            (parsed.step, e.name)
            for e in root.list()
            if e.is_dir
            and e.name != step.name
            and (parsed := parse_step_name(e.name)) is not None
            and not parsed.tmp
            and not parsed.partial
        ]
        # The newest few: a root whose writer writes in place has markers there (a root of
        # an older release has none anywhere, and is not listed step by step).
        for _, name in sorted(siblings, reverse=True)[:3]:
            loc = root.child(name)
            children = loc.list()
            if any(c.name == COMMIT_MARKER for c in children):
                return root_writes_in_place([(loc, children)]) or None
    except CkptError:
        return None
    return None


def list_saves(location: Location, entries: Sequence[Entry]) -> list[StepRef] | None:
    """The single-item Checkpointer saves a directory holds side by side (the NNX guide's
    ``ckpt_dir/state``), sorted by name, when every subdirectory is one or an unfinished save
    (``state.orbax-checkpoint-tmp``, ``incomplete``), at least one is finished, and the
    directory itself is no step (it has no step metadata or marker of its own); else None."""
    names = {e.name for e in entries}
    dirs = [e for e in entries if e.is_dir and not e.name.startswith(".")]
    if STEP_METADATA in names or COMMIT_MARKER in names or not dirs:
        return None
    saves = []
    for e in sorted(dirs, key=lambda e: e.name):
        loc = location.child(e.name)
        children = loc.list()
        child_names = frozenset(c.name for c in children)
        if TMP_MARKER in e.name:
            saves.append(StepRef(0, e.name, loc, "incomplete", None, tuple(children)))
        elif STEP_METADATA not in child_names or not looks_like_item(child_names):
            return None
        else:
            saves.append(step_ref(loc, children))
    return saves if any(s.status != "incomplete" for s in saves) else None


def latest_committed(steps: list[StepRef]) -> StepRef | None:
    committed = [s for s in steps if s.committed]
    return committed[-1] if committed else None


@dataclass(frozen=True)
class Detected:
    """What a path is, with the listings already made to find out (so nobody lists twice)."""

    kind: Kind
    entries: list[Entry]
    steps: list[StepRef] | None = None  # for roots


def detect(location: Location) -> Detected:
    """Classify a path; raises a one-line error saying what it holds when it is no checkpoint."""
    if not location.exists():
        raise NotFoundError(f"{location} does not exist", hint="check the path")
    if not location.is_dir():
        if LEGACY_MSGPACK_RE.match(location.name):
            return Detected("legacy", [])
        raise NotACheckpointError(
            f"{location} is a file, not a checkpoint directory",
            hint="point ckpt at a CheckpointManager root, a step or an item directory",
        )
    entries = location.list()
    names = frozenset(e.name for e in entries)
    parsed = parse_step_name(location.name)
    if parsed is not None and parsed.partial:
        raise NotACheckpointError(
            f"{location} is a v1 partial save not finalized: no reader restores it until "
            "ocp.partial.finalize makes it a step",
            hint=f"finalize it with Orbax, or see it with `ckpt ls {location.parent}`",
        )
    if looks_like_item(names):
        # A single-item Checkpointer writes _CHECKPOINT_METADATA into the item itself.
        return Detected("step" if STEP_METADATA in names else "item", entries)
    if json_item_files(names) and STEP_METADATA not in names and not any(e.is_dir for e in entries):
        # A JsonSave item (`metadata`) or a step's `metrics`, its commit_success.txt aside.
        return Detected("item", entries)
    if STEP_METADATA in names or COMMIT_MARKER in names:
        return Detected("step", entries)
    subdirs = [e.name for e in entries if e.is_dir and not e.name.startswith(".")]
    step_dirs = [n for n in subdirs if parse_step_name(n) is not None]
    # A step from before _CHECKPOINT_METADATA: no marker file, but item directories inside.
    if any(
        looks_like_item(frozenset(c.name for c in location.child(n).list()))
        for n in subdirs
        if n not in step_dirs
    ):
        return Detected("step", entries)
    steps = list_steps(location, entries) if step_dirs else []
    if ROOT_METADATA_DIR in names or steps:
        return Detected("root", entries, steps)
    if any(not e.is_dir and LEGACY_MSGPACK_RE.match(e.name) for e in entries):
        return Detected("legacy", entries)
    raise NotACheckpointError(_describe_non_checkpoint(location, entries))


def legacy_msgpack_error(location: Location, hint: str | None = None) -> UnsupportedError:
    """The one error every command raises for a legacy Flax msgpack checkpoint: it is a
    checkpoint, of a format ckpt does not read (``unsupported``, exit 3)."""
    return UnsupportedError(
        f"{location} is a legacy Flax msgpack checkpoint (flax.training.checkpoints), "
        "a format ckpt does not read",
        hint=hint
        or "restore it with flax.training.checkpoints.restore_checkpoint and save it with Orbax",
    )


def _describe_non_checkpoint(location: Location, entries: list[Entry]) -> str:
    if not entries:
        return f"{location} is an empty directory, not a checkpoint"
    dirs = [e.name + "/" for e in entries if e.is_dir]
    files = [e.name for e in entries if not e.is_dir]
    parts = []
    for label, group in (("directories", dirs), ("files", files)):
        if group:
            shown = ", ".join(group[:4]) + (", ..." if len(group) > 4 else "")
            parts.append(f"{len(group)} {label} ({shown})")
    return (
        f"{location} is not an Orbax checkpoint: it holds {' and '.join(parts)}; expected step "
        f"directories such as 100/, or an item with {TREE_METADATA}"
    )


def step_items(
    step_loc: Location,
    children: list[Entry] | tuple[Entry, ...],
    handlers: dict[str, str] | str | None,
) -> list[str]:
    """Item names of a step: the handler map's keys plus item-like subdirectories, sorted."""
    names = frozenset(e.name for e in children)
    if isinstance(handlers, str) or (handlers is None and looks_like_item(names)):
        return ["default"] if looks_like_item(names) else []
    # A name that is no plain directory entry ('..', '/abs', 'a/b') never becomes a path.
    found = {n for n in handlers or {} if is_plain_name(n)}
    # An item dir still named `<item>.orbax-checkpoint-tmp` is a save that died mid-way.
    found.update(
        e.name
        for e in children
        if e.is_dir and not e.name.startswith(".") and TMP_MARKER not in e.name
    )
    # An item that is a symlink is never read through (verify reports it): it may lead anywhere.
    linked = {e.name for e in children if e.is_symlink}
    return sorted(found - linked)


def item_location(step_loc: Location, item: str, items: list[str]) -> Location:
    """Where an item lives: its subdirectory, or the step itself for single-item Checkpointers."""
    if item == "default" and "default" in items:
        sub = step_loc.child("default")
        return sub if sub.is_dir() else step_loc
    return step_loc.child(item)


def choose_item(
    items: list[str],
    requested: str | None,
    where: Location,
    kind_of: Callable[[str], ItemKind] | None = None,
) -> str:
    """Pick the item to read: the requested one, else the one state item: the only item besides
    ``metrics``, or the only PyTree item among JSON, ArraySave, empty and unknown ones
    (``kind_of``), or the only PyTree item that holds arrays."""
    if requested is not None:
        if requested not in items:
            raise NotFoundError(
                f"item {requested!r} not found in {where}",
                hint=f"items: {', '.join(items) or 'none'}",
            )
        return requested
    candidates = [i for i in items if i != METRICS_ITEM] or items
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise NotACheckpointError(f"{where} holds no items")
    if kind_of is not None:
        trees = [i for i in candidates if kind_of(i) == "pytree"]
        if len(trees) == 1:
            return trees[0]
        # A tree of strings alone (Keras's `model_config`) is the run's configuration, not its
        # state: with one tree that holds arrays beside it, that one is the state item.
        stored = [i for i in trees if _holds_arrays(where.child(i))]
        if len(stored) == 1:
            return stored[0]
    raise SeveralItemsError(
        f"{where} holds several items ({', '.join(candidates)})",
        hint="choose one with --item NAME",
        items=tuple(candidates),
    )


def _holds_arrays(item: Location) -> bool:
    try:
        return holds_arrays([e.name for e in item.list()])
    except CkptError:
        return False
