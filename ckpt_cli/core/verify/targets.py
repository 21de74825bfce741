"""What one ``verify`` run checks: the items of a root's selected steps, of a step or an item,
and the problems found on the way there (unknown files, unfinished saves, missing items).

Item detection is the format's (``names.looks_like_item``), JsonSave and metrics items
included: a step subdirectory that holds none of an item's files is reported, not checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ckpt_cli.core.format.discovery import (
    StepRef,
    detect,
    legacy_msgpack_error,
    list_saves,
    list_steps,
    step_ref,
)
from ckpt_cli.core.format.emergency import LocalTier, is_local_root_entry
from ckpt_cli.core.format.items import is_noop_handler, step_handler
from ckpt_cli.core.format.metadata import read_step_metadata
from ckpt_cli.core.format.names import (
    CKPT_ROOT_FILES,
    CKPT_STEP_FILES,
    COMMIT_MARKER,
    DELETION_RECORD,
    ROOT_METADATA,
    ROOT_METADATA_DIR,
    STEP_METADATA,
    TMP_MARKER,
    TREE_METADATA,
    V1_MARKER,
    is_plain_name,
    json_item_files,
    looks_like_item,
    parse_step_name,
)
from ckpt_cli.core.format.pins import PIN_FILE
from ckpt_cli.core.format.resolve import find_step
from ckpt_cli.core.format.tiers import step_local_tier, tier_of_step_dir
from ckpt_cli.core.storage import Entry, Location
from ckpt_cli.core.verify.problems import Problem, problem
from ckpt_cli.core.verify.types import CheckedKind, VerifyOptions
from ckpt_cli.errors import CkptError, InvalidMetadataError, NotFoundError, UsageError


@dataclass(frozen=True)
class ItemTarget:
    """One item to check, and how the report names it (relative to the checked path)."""

    location: Location
    shown_as: str
    step: int | None
    name: str
    is_step: bool = False
    #: The handler the step recorded for the item (``_CHECKPOINT_METADATA``), if any.
    handler: str | None = None
    #: The local tier of Orbax's emergency checkpointing the item's step is (or may be).
    tier: LocalTier | None = None


@dataclass
class Targets:
    """What a path holds to check, and what was found wrong on the way to its items."""

    kind: CheckedKind
    items: list[ItemTarget] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    #: Why each unfinished entry is skipped: its state and the writer's evidence.
    why_unfinished: dict[str, str] = field(default_factory=dict)
    #: The steps ``--mark-committed`` marks once the check is clean.
    step_locations: list[Location] = field(default_factory=list)


def find_targets(location: Location, options: VerifyOptions) -> Targets:
    """Classify ``location`` and list the items to check; refuses options that do not apply."""
    found = detect(location)
    kind, entries = found.kind, found.entries
    names = {e.name for e in entries}
    if kind == "step" and STEP_METADATA not in names and json_item_files(names):
        # A JsonSave or metrics item: its commit_success.txt makes it look like a step.
        kind = "item"
    if kind == "legacy":
        raise legacy_msgpack_error(location)
    if kind != "root" and (options.step is not None or options.latest):
        raise UsageError(f"--step and --latest apply to a root; {location} is a {kind}")
    if options.mark_committed:
        _check_markable(location, kind, options, entries)
    out = Targets(kind)
    if kind == "root":
        selected = _select_steps(location, entries, options, out)
        if location.parallel_reads > 1 and len(selected) > 1:  # one round of requests, not N
            location.prefetch([ref.location.child(STEP_METADATA) for ref in selected])
        for ref in selected:
            out.step_locations.append(ref.location)
            out.steps.append(ref.step)
            out.items.extend(
                _check_step(
                    ref.location,
                    ref.name,
                    ref.step,
                    list(ref.children),
                    out.problems,
                    ref.deleting,
                )
            )
    elif kind == "step":
        parsed = parse_step_name(location.name)
        step = parsed.step if parsed else None
        if parsed is not None and parsed.tmp:
            out.problems.append(_tmp_problem(location.name, "."))
        out.steps = [step] if step is not None else []
        out.step_locations = [location]
        out.items = _check_lone_step(location, entries, options, out.problems)
    else:
        parsed = parse_step_name(location.parent.name)
        if TMP_MARKER in location.name:
            out.problems.append(_tmp_problem(location.name, "."))
        tier = tier_of_step_dir(location.parent) if parsed is not None else None
        out.items = [
            ItemTarget(location, ".", parsed.step if parsed else None, location.name, tier=tier)
        ]
    if options.item is not None:
        out.items = _only_item(location, kind, out.items, options.item)
    return out


def _only_item(
    location: Location, kind: CheckedKind, items: list[ItemTarget], item: str
) -> list[ItemTarget]:
    """``--item``: the targets of that name (one per step checked); none is an error naming
    the items there are (the step's own findings are still reported)."""
    if kind == "item":
        raise UsageError(f"--item applies to a root or a step; {location} is an item")
    kept = [t for t in items if t.name == item]
    if not kept:
        names = sorted({t.name for t in items})
        raise NotFoundError(
            f"item {item!r} not found in {location}",
            hint=f"its items: {', '.join(names)}" if names else "run `ckpt ls` on it",
        )
    return kept


def _tmp_problem(name: str, shown: str) -> Problem:
    return problem(
        "tmp-dir",
        f"{name} is an unfinished save (its name carries {TMP_MARKER}): it is not a valid "
        "checkpoint and Orbax deletes it on its next save; delete it, or run `ckpt ls` to "
        "find the last committed step",
        file=shown,
    )


def _select_steps(
    root: Location, entries: list[Entry], options: VerifyOptions, out: Targets
) -> list[StepRef]:
    problems, unfinished = out.problems, out.unfinished
    steps = list_steps(root, entries)
    unfinished.extend(s.name for s in steps if not s.committed)
    out.why_unfinished.update(
        {s.name: f"{s.status}: {s.reason or 'not committed'}" for s in steps if not s.committed}
    )
    step_names = {s.name for s in steps}
    for e in entries:
        if e.name == ROOT_METADATA_DIR and e.is_dir:
            _check_json(
                root.child(ROOT_METADATA_DIR, ROOT_METADATA),
                f"{ROOT_METADATA_DIR}/{ROOT_METADATA}",
                problems,
                optional=True,
            )
        elif (
            e.name not in step_names
            and not (e.name in CKPT_ROOT_FILES and not e.is_dir)
            # the MTC replicator's files and the p2p manager's restore directory, beside the
            # steps of a local tier (``format/emergency``)
            and not is_local_root_entry(e.name)
        ):
            problems.append(
                problem(
                    "unknown-file",
                    f"{e.name} in the root is neither a step nor Orbax metadata: Orbax ignores "
                    "it; move it out of the checkpoint directory",
                    file=e.name,
                )
            )
    if options.mark_committed:
        # The committed steps, and those a marker would make whole: every one of them (the
        # one-time stamp older steps need when a writer switches to commit-file mode), or --step.
        found = [
            s for s in steps if (s.committed or s.stampable) and options.step in (None, s.step)
        ]
        if options.step is not None and not found:
            _refuse_unstampable(find_any(root, steps, options.step))
        if found:
            unfinished[:] = [n for n in unfinished if n not in {s.name for s in found}]
            return found if options.step is None else found[:1]
    if options.step is not None:
        return [find_step(root, steps, options.step)]
    if options.latest:
        return [find_step(root, steps, None)]
    committed = [s for s in steps if s.committed]
    if not committed:
        find_step(root, steps, None)  # raises: no committed step
    return committed


def _check_json(
    loc: Location, shown: str, problems: list[Problem], optional: bool = False
) -> object:
    if optional and not loc.is_file():
        return None
    try:
        return loc.read_json()
    except CkptError as e:
        code = "json-invalid" if isinstance(e, InvalidMetadataError) else "unreadable"
        problems.append(
            problem(code, f"{e.message}: restore it from a copy of this step", file=shown)
        )
        return None


def _join(prefix: str, rel: str) -> str:
    return rel if prefix in ("", ".") else f"{prefix}/{rel}"


def _is_save(loc: Location) -> bool:
    """Whether ``loc`` is a single-item Checkpointer save: an item with its step metadata."""
    try:
        names = [e.name for e in loc.list()]
    except CkptError:
        return False
    return STEP_METADATA in names and looks_like_item(names)


def _holds_an_item(loc: Location) -> bool:
    try:
        names = [e.name for e in loc.list()]
    except CkptError:
        return False
    return looks_like_item(names, json_items=True)


def _before_step_metadata(step_loc: Location, entries: list[Entry]) -> bool:
    """Whether the step's items were written by Orbax 0.4, which wrote no _CHECKPOINT_METADATA:
    their _METADATA holds only the tree (``use_zarr3`` appeared with 0.5)."""
    found = False
    for e in entries:
        if not e.is_dir or TMP_MARKER in e.name:
            continue
        loc = step_loc.child(e.name, TREE_METADATA)
        try:
            raw = loc.read_json_if_exists()
        except CkptError:
            return False
        if raw is None:
            continue
        if not isinstance(raw, dict) or "use_zarr3" in raw:
            return False
        found = True
    return found


def _check_lone_step(
    location: Location, entries: list[Entry], options: VerifyOptions, problems: list[Problem]
) -> list[ItemTarget]:
    """A step given by its path: its state first (a step no reader restores is an error, whatever
    its files say), then its items."""
    parsed = parse_step_name(location.name)
    ref = step_ref(location, entries)
    stamping = options.mark_committed and ref.stampable
    # A directory of saves side by side has no state of its own: each save is checked.
    saves = bool(list_saves(location, entries))
    tmp = parsed is not None and parsed.tmp
    if not ref.committed and not stamping and not tmp and not saves:
        problems.append(_not_committed_problem(ref))
    # What a stopped deletion left holds no item by design: its missing items are not
    # problems of their own (the cause is reported above).
    leftover = ref.status == "incomplete"
    step = parsed.step if parsed else None
    return _check_step(
        location, ".", step, entries, problems, ref.deleting, expect_items=not leftover
    )


def _not_committed_problem(ref: StepRef) -> Problem:
    """A step given by its path that no reader configured like its writer restores: an error,
    whatever its files say."""
    return problem(
        "uncommitted",
        f"step {ref.name} is {ref.status}: {ref.reason}",
        file=".",
    )


def _check_step(
    step_loc: Location,
    shown: str,
    step: int | None,
    entries: list[Entry],
    problems: list[Problem],
    deleting: tuple[str, ...] = (),
    *,
    expect_items: bool = True,
) -> list[ItemTarget]:
    names = {e.name for e in entries}
    # Checkpointer saves side by side (``ckpt_dir/state``, ``ckpt_dir/other``): each save is a
    # single-item step with its own _CHECKPOINT_METADATA, and the directory holding them has none.
    saves = (
        set()
        if STEP_METADATA in names
        else {e.name for e in entries if e.is_dir and _is_save(step_loc.child(e.name))}
    )
    handlers = _step_handlers(step_loc, shown, names, entries, problems, bool(saves))
    if looks_like_item(names):
        # A single-item Checkpointer writes the item straight into the step directory.
        return [ItemTarget(step_loc, shown, step, "default", is_step=True)]
    # An item being deleted (Orbax's deletion record): readers skip it, and so does the check.
    expected = (set(handlers) if isinstance(handlers, dict) else set()) - set(deleting)
    tier = step_local_tier(step_loc, entries, handlers)
    targets = []
    for e in entries:
        if e.name in deleting:
            continue
        rel = _join(shown, e.name)
        if not e.is_dir:
            _check_step_file(e.name, rel, problems)
        elif e.is_symlink or TMP_MARKER in e.name:
            problems.append(_symlink_problem(rel) if e.is_symlink else _tmp_problem(rel, rel))
        elif e.name in expected or _holds_an_item(step_loc.child(e.name)):
            handler = step_handler(handlers, e.name) if isinstance(handlers, dict) else None
            item = ItemTarget(step_loc.child(e.name), rel, step, e.name, e.name in saves, handler)
            targets.append(replace(item, tier=tier))
        else:
            problems.append(
                problem(
                    "unknown-file",
                    f"{rel}/ is neither an item of this step nor anything Orbax writes: Orbax "
                    "ignores it; move it out of the checkpoint",
                    file=rel,
                )
            )
    # An empty item (a no-op handler's) is no object on an object store: not missing there,
    # checked (and noted) as the empty item it is.
    empty = set()
    if step_loc.requires_commit_marker:
        empty = {n for n in expected - names if is_noop_handler(step_handler(handlers, n))}
    for name in sorted(empty):
        handler = step_handler(handlers, name)
        targets.append(
            ItemTarget(step_loc.child(name), _join(shown, name), step, name, False, handler)
        )
    if expect_items:
        _check_listed_items(shown, expected - names - empty, problems)
    return targets


def _symlink_problem(rel: str) -> Problem:
    return problem(
        "symlink-outside",
        f"{rel} is a symlink: ckpt does not read an item through a link (it may lead out of "
        "the checkpoint), a writer refuses it; replace it by the directory",
        file=rel,
    )


def _step_handlers(
    step_loc: Location,
    shown: str,
    names: set[str],
    entries: list[Entry],
    problems: list[Problem],
    holds_saves: bool = False,
) -> dict[str, str] | str | None:
    """The step's item handlers from its step metadata (None: missing or unreadable, reported
    unless the step predates step metadata or is a directory of saves, ``holds_saves``)."""
    meta_file = _join(shown, STEP_METADATA)
    handlers: dict[str, str] | str | None = None
    if STEP_METADATA not in names:
        # Orbax 0.4 wrote none; a directory of saves has its metadata in each save.
        if not holds_saves and not _before_step_metadata(step_loc, entries):
            problems.append(
                problem(
                    "step-metadata-missing",
                    f"{shown if shown != '.' else step_loc.name} has no {STEP_METADATA}: Orbax "
                    "writes it with every step since 0.5; if this step is that recent, its save "
                    "did not finish; run `ckpt inspect` on it and compare with the step before",
                    file=meta_file,
                )
            )
    elif _check_json(step_loc.child(STEP_METADATA), meta_file, problems) is not None:
        try:
            handlers = read_step_metadata(step_loc).item_handlers
        except InvalidMetadataError as err:
            problems.append(
                problem(
                    "metadata-invalid", f"{err.message}: restore it from a copy", file=meta_file
                )
            )
    return handlers


def find_any(root: Location, steps: list[StepRef], step: int) -> StepRef:
    """Step ``step`` of a root whatever its state (the one ``find_step`` names when it
    refuses); ``find_step``'s error when there is none."""
    matches = [s for s in steps if s.step == step]
    return matches[0] if matches else find_step(root, steps, step)


def _check_step_file(name: str, rel: str, problems: list[Problem]) -> None:
    """A file in a step directory: one Orbax or ckpt writes, or an unknown one."""
    # PIN_FILE: ckpt pin; V1_MARKER: the v1 API's own file; DELETION_RECORD: Orbax's
    # record of an item being deleted (readers skip that item)
    known = (STEP_METADATA, COMMIT_MARKER, PIN_FILE, V1_MARKER, DELETION_RECORD, *CKPT_STEP_FILES)
    if name not in known:
        problems.append(
            problem(
                "unknown-file",
                f"{rel} is not a file Orbax writes into a step: Orbax ignores it; "
                "move it out of the checkpoint",
                file=rel,
            )
        )


def _check_listed_items(shown: str, missing: set[str], problems: list[Problem]) -> None:
    """Items the step metadata lists that have no directory."""
    for name in sorted(missing):
        if not is_plain_name(name):
            problems.append(
                problem(
                    "metadata-invalid",
                    f"item name {name!r} in {STEP_METADATA} is not a plain directory name "
                    "(damaged or hostile): ckpt never reads it as a path, Orbax would; "
                    "restore the step from a copy",
                    file=_join(shown, STEP_METADATA),
                )
            )
            continue
        problems.append(
            problem(
                "item-missing",
                f"item {name} is listed in {STEP_METADATA} but has no directory: restoring it "
                "fails; restore the step from a copy",
                file=_join(shown, name),
            )
        )


def _check_markable(
    location: Location, kind: str, options: VerifyOptions, entries: list[Entry]
) -> None:
    if options.sample is not None:
        raise UsageError("--mark-committed needs every chunk checked: drop --sample")
    if kind not in ("root", "step") or (kind == "root" and options.latest):
        raise UsageError(
            "--mark-committed marks the steps of a root (or one with --step N), or the step "
            "given itself",
            hint=f"{location} is a {kind}",
        )
    saves = list_saves(location, entries) if kind == "step" else None
    if saves:
        # Orbax writes a save's commit_success.txt into the save: one here would be stray.
        target = next((s for s in saves if not s.committed), saves[0])
        raise UsageError(
            f"{location} holds {len(saves)} saves side by side "
            f"({', '.join(s.name for s in saves)}): --mark-committed marks one save",
            hint=f"give the save itself: `ckpt verify {target.location} --mark-committed`",
        )
    parsed = parse_step_name(location.name) if kind == "step" else None
    if parsed is not None and parsed.tmp:
        raise UsageError(f"{location} is an unfinished save: it cannot be marked committed")
    if kind == "step":
        _refuse_unstampable(step_ref(location, entries))


def _refuse_unstampable(ref: StepRef) -> None:
    """A step a marker must not make restorable: its save never finished, it is a partial
    save, or a deletion's leftover (``--mark-committed`` stamps a whole step only)."""
    if ref.status in ("committed",) or ref.stampable:
        return
    from ckpt_cli.errors import RefusedError

    raise RefusedError(
        f"step {ref.name} is {ref.status}: {ref.reason}",
        hint="--mark-committed stamps a whole step that lacks only its commit_success.txt",
    )
