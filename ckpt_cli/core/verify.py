"""``verify``: check a root (its committed steps), a step or an item, in layers.

1. structure (always): metadata, arrays, chunk keys, OCDBT trees, files, commit state;
2. ``deep``: decode every chunk, count NaN/Inf, check recorded digests (or ``record`` them);
3. ``sample``: decode a random subset of chunks, check the files that hold them.

Damage is never raised: it becomes problems in the report. Only a path that is no checkpoint at
all (or cannot be listed) raises, which the CLI turns into exit code 3.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ckpt_cli.core.deep import DataResult, SampleSpec, deep_item, item_bytes, sample_items
from ckpt_cli.core.executor import Executor
from ckpt_cli.core.format.digests import DigestRecord, write_digests
from ckpt_cli.core.format.layout import StepRef, detect, list_steps
from ckpt_cli.core.format.metadata import read_step_metadata
from ckpt_cli.core.format.names import (
    COMMIT_MARKER,
    ROOT_METADATA,
    ROOT_METADATA_DIR,
    STEP_METADATA,
    TMP_MARKER,
    TREE_METADATA,
    parse_step_name,
)
from ckpt_cli.core.format.resolve import find_step
from ckpt_cli.core.format.scan import SCAN_BLOCK_BYTES
from ckpt_cli.core.problems import (
    ItemCheck,
    Problem,
    SampleInfo,
    VerifyReport,
    escalate,
    problem,
)
from ckpt_cli.core.scale_verify import DEFAULT_SCAN_UNIT_BYTES, deep_item_scaled
from ckpt_cli.core.storage import Entry, Location
from ckpt_cli.core.structure import ItemFacts, check_item
from ckpt_cli.errors import CkptError, InvalidMetadataError, UnsupportedError, UsageError

#: (phase, done, total): phase "structure" counts items, "data" counts bytes.
ProgressFn = Callable[[str, int, int], None]

_ITEM_MARKERS = frozenset({TREE_METADATA, "manifest.ocdbt", "_sharding", "_strings.json"})
_JSON_ITEM_FILES = frozenset({"metadata", "metrics"})


@dataclass(frozen=True)
class VerifyOptions:
    step: int | None = None
    latest: bool = False
    deep: bool = False
    record: bool = False
    sample: SampleSpec | None = None
    seed: int | None = None
    strict: bool = False
    fail_on_nonfinite: bool = False
    budget: int = SCAN_BLOCK_BYTES
    #: After a clean deep check of the one step, put its ``commit_success.txt`` (a step copied
    #: to an object store without it, Orbax issue #394).
    mark_committed: bool = False


@dataclass(frozen=True)
class _ItemTarget:
    location: Location
    shown_as: str
    step: int | None
    name: str
    is_step: bool = False


def verify_path(
    location: Location,
    options: VerifyOptions,
    on_progress: ProgressFn | None = None,
    executor: Executor | None = None,
    unit_bytes: int = DEFAULT_SCAN_UNIT_BYTES,
) -> VerifyReport:
    """Check ``location``; with ``executor`` the deep pass runs in units on its workers
    (``scale_verify``), everything else stays here."""
    started = time.monotonic()
    if options.record and options.sample is not None:
        raise UsageError("--record needs every chunk: it cannot be combined with --sample")
    if options.sample is not None and options.deep:
        raise UsageError("choose --deep (every chunk) or --sample (some chunks), not both")
    found = detect(location)
    kind, entries = found.kind, found.entries
    names = {e.name for e in entries}
    if kind == "step" and STEP_METADATA not in names and names & _JSON_ITEM_FILES:
        # A JsonSave or metrics item: its commit_success.txt makes it look like a step.
        kind = "item"
    if kind == "legacy":
        raise UnsupportedError(
            f"{location} is a legacy Flax msgpack checkpoint: it has no structure to verify",
            hint="restore it with flax.serialization.msgpack_restore",
        )
    if kind != "root" and (options.step is not None or options.latest):
        raise UsageError(f"--step and --latest apply to a root; {location} is a {kind}")
    if options.mark_committed:
        _check_markable(location, kind, options)
    problems: list[Problem] = []
    targets: list[_ItemTarget] = []
    steps: list[int] = []
    unfinished: list[str] = []
    marked_steps: list[Location] = [location] if kind == "step" else []
    if kind == "root":
        for ref in _select_steps(location, entries, options, problems, unfinished):
            marked_steps.append(ref.location)
            steps.append(ref.step)
            targets.extend(
                _check_step(ref.location, ref.name, ref.step, list(ref.children), problems)
            )
    elif kind == "step":
        parsed = parse_step_name(location.name)
        step = parsed.step if parsed else None
        if parsed is not None and parsed.tmp:
            problems.append(_tmp_problem(location.name, "."))
        steps = [step] if step is not None else []
        targets = _check_step(location, ".", step, entries, problems)
    else:
        parsed = parse_step_name(location.parent.name)
        if TMP_MARKER in location.name:
            problems.append(_tmp_problem(location.name, "."))
        targets = [_ItemTarget(location, ".", parsed.step if parsed else None, location.name)]

    facts = []
    for i, t in enumerate(targets):
        if on_progress:
            on_progress("structure", i, len(targets))
        facts.append(check_item(t.location, t.shown_as, location, t.is_step))
    if on_progress:
        on_progress("structure", len(targets), len(targets))

    level = (
        "sample"
        if options.sample is not None
        else ("deep" if options.deep or options.record or options.mark_committed else "structure")
    )
    results, sample = _data_level(facts, options, level, on_progress, executor, unit_bytes)
    recorded: list[str] = []
    checks = []
    for t, f, r in zip(targets, facts, results, strict=True):
        item_problems = [escalate(p, options.strict, options.fail_on_nonfinite) for p in f.problems]
        digests = _digest_state(f, level)
        if options.record and r is not None:
            if any(p.severity == "error" for p in item_problems):
                digests = "not-recorded"
            else:
                assert f.inventory is not None
                write_digests(f.inventory.base, DigestRecord(r.digests, r.files))
                recorded.append(t.shown_as)
                digests = "recorded"
        checks.append(
            ItemCheck(
                path=t.shown_as,
                step=t.step,
                name=t.name,
                kind=f.kind,
                leaves=tuple(f.leaves),
                arrays=len(f.arrays_seen),
                chunks=f.chunks,
                files=len(f.inventory.sizes) if f.inventory else 0,
                digests=digests,
                problems=tuple(item_problems),
                nonfinite=tuple(r.nonfinite) if r else (),
                bytes_decoded=r.bytes_decoded if r else 0,
                chunks_decoded=r.chunks_decoded if r else 0,
            )
        )
    top = [escalate(p, options.strict, options.fail_on_nonfinite) for p in problems]
    marked: tuple[str, ...] = ()
    clean = not any(p.severity == "error" for c in checks for p in (*top, *c.problems))
    if options.mark_committed and clean and marked_steps:
        marked = tuple(_mark_committed(s) for s in marked_steps)
    return VerifyReport(
        path=str(location),
        kind=kind,
        level=level,
        items=tuple(checks),
        problems=tuple(top) + tuple(p for c in checks for p in c.problems),
        steps=tuple(steps),
        unfinished=tuple(unfinished),
        sample=sample,
        recorded=tuple(recorded),
        marked_committed=marked,
        elapsed_s=time.monotonic() - started,
    )


def _data_level(
    facts: list[ItemFacts],
    options: VerifyOptions,
    level: str,
    on_progress: ProgressFn | None,
    executor: Executor | None = None,
    unit_bytes: int = DEFAULT_SCAN_UNIT_BYTES,
) -> tuple[list[DataResult | None], SampleInfo | None]:
    if level == "structure":
        return [None] * len(facts), None
    done = [0]
    total = 0

    def on_bytes(n: int) -> None:
        done[0] += n
        if on_progress:
            on_progress("data", done[0], total)

    if options.sample is not None:
        total = sum(sum(i.nbytes for i, _ in f.arrays.values()) for f in facts)
        total = (
            int(total * (options.sample.percent or 100) / 100)
            if options.sample.percent
            else min(total, options.sample.bytes or 0)
        )
        results, sample = sample_items(
            facts, options.sample, options.seed, options.budget, on_bytes
        )
        return list(results), sample
    wants = [options.record or f.record is not None for f in facts]
    total = sum(item_bytes(f, w) for f, w in zip(facts, wants, strict=True))
    out: list[DataResult | None] = []
    for f, want in zip(facts, wants, strict=True):
        if executor is None:
            r = deep_item(f, want, options.budget, on_bytes)
        else:
            r = deep_item_scaled(f, want, options.budget, executor, unit_bytes, on_bytes)
        r.chunks_decoded = sum(info.num_chunks for info, _ in f.arrays.values())
        out.append(r)
    return out, None


def _digest_state(f: ItemFacts, level: str) -> str:
    if f.record is None:
        return "absent"
    return {"structure": "sizes-checked", "sample": "sampled"}.get(level, "checked")


def _tmp_problem(name: str, shown: str) -> Problem:
    return problem(
        "tmp-dir",
        f"{name} is an unfinished save (its name carries {TMP_MARKER}): it is not a valid "
        "checkpoint and Orbax deletes it on its next save; delete it, or run `ckpt ls` to "
        "find the last committed step",
        file=shown,
    )


def _select_steps(
    root: Location,
    entries: list[Entry],
    options: VerifyOptions,
    problems: list[Problem],
    unfinished: list[str],
) -> list[StepRef]:
    steps = list_steps(root, entries)
    unfinished.extend(s.name for s in steps if not s.committed)
    step_names = {s.name for s in steps}
    for e in entries:
        if e.name == ROOT_METADATA_DIR and e.is_dir:
            _check_json(
                root.child(ROOT_METADATA_DIR, ROOT_METADATA),
                f"{ROOT_METADATA_DIR}/{ROOT_METADATA}",
                problems,
                optional=True,
            )
        elif e.name not in step_names:
            problems.append(
                problem(
                    "unknown-file",
                    f"{e.name} in the root is neither a step nor Orbax metadata: Orbax ignores "
                    "it; move it out of the checkpoint directory",
                    file=e.name,
                )
            )
    if options.step is not None and options.mark_committed:
        found = [s for s in steps if s.step == options.step and s.status != "incomplete"]
        if found:
            unfinished[:] = [n for n in unfinished if n != found[0].name]
            return found[:1]
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


def _looks_like_item(loc: Location) -> bool:
    try:
        names = {e.name for e in loc.list()}
    except CkptError:
        return False
    return bool(names & (_ITEM_MARKERS | _JSON_ITEM_FILES)) or any(
        n.startswith("ocdbt.process_") for n in names
    )


def _check_step(
    step_loc: Location, shown: str, step: int | None, entries: list[Entry], problems: list[Problem]
) -> list[_ItemTarget]:
    names = {e.name for e in entries}
    meta_file = _join(shown, STEP_METADATA)
    handlers: dict[str, str] | str | None = None
    if STEP_METADATA not in names:
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
    if names & _ITEM_MARKERS or any(n.startswith("ocdbt.process_") for n in names):
        # A single-item Checkpointer writes the item straight into the step directory.
        return [_ItemTarget(step_loc, shown, step, "default", is_step=True)]
    expected = set(handlers) if isinstance(handlers, dict) else set()
    targets = []
    for e in entries:
        rel = _join(shown, e.name)
        if not e.is_dir:
            if e.name not in (STEP_METADATA, COMMIT_MARKER):
                problems.append(
                    problem(
                        "unknown-file",
                        f"{rel} is not a file Orbax writes into a step: Orbax ignores it; "
                        "move it out of the checkpoint",
                        file=rel,
                    )
                )
            continue
        if TMP_MARKER in e.name:
            problems.append(_tmp_problem(rel, rel))
        elif e.name in expected or _looks_like_item(step_loc.child(e.name)):
            targets.append(_ItemTarget(step_loc.child(e.name), rel, step, e.name))
        else:
            problems.append(
                problem(
                    "unknown-file",
                    f"{rel}/ is neither an item of this step nor anything Orbax writes: Orbax "
                    "ignores it; move it out of the checkpoint",
                    file=rel,
                )
            )
    for name in sorted(expected - names):
        problems.append(
            problem(
                "item-missing",
                f"item {name} is listed in {STEP_METADATA} but has no directory: restoring it "
                "fails; restore the step from a copy",
                file=_join(shown, name),
            )
        )
    return targets


def _check_markable(location: Location, kind: str, options: VerifyOptions) -> None:
    if options.sample is not None:
        raise UsageError("--mark-committed needs every chunk checked: drop --sample")
    if (kind == "root" and options.step is None) or kind not in ("root", "step"):
        raise UsageError(
            "--mark-committed marks one step: give a root with --step N, or the step itself",
            hint=f"{location} is a {kind}",
        )
    parsed = parse_step_name(location.name) if kind == "step" else None
    if parsed is not None and parsed.tmp:
        raise UsageError(f"{location} is an unfinished save: it cannot be marked committed")


def _mark_committed(step: Location) -> str:
    """Put the step's ``commit_success.txt`` (Orbax's text); a marker already there is kept."""
    marker = step.child(COMMIT_MARKER)
    if not marker.is_file():
        marker.write_bytes(f"Checkpoint commit was successful to {step}".encode())
    return str(step)
