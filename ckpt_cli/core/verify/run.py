"""``verify``: check a root (its committed steps), a step or an item, in layers.

1. structure (always): metadata, arrays, chunk keys, OCDBT trees, files, commit state;
2. ``deep``: decode every chunk, count NaN/Inf, check recorded digests (or ``record`` them);
3. ``sample``: decode a random subset of chunks, check the files that hold them.

Damage is never raised: it becomes problems in the report. Only a path that is no checkpoint at
all (or cannot be listed) raises, which the CLI turns into exit code 3.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace

from ckpt_cli.core.digest.records import record_of, wanted, write_digests
from ckpt_cli.core.executor import Executor, ExecutorSpec, decline, open_executor
from ckpt_cli.core.format.discovery import detect
from ckpt_cli.core.format.names import COMMIT_MARKER, PRUNE_LOCK
from ckpt_cli.core.progress import ByteProgress, Progress, ProgressFn
from ckpt_cli.core.scale import Scale
from ckpt_cli.core.split import should_split
from ckpt_cli.core.storage import Location
from ckpt_cli.core.storage.locks import holder_command, holder_of, take_lock
from ckpt_cli.core.verify.deep import deep_item, item_bytes, sample_items
from ckpt_cli.core.verify.distributed import DEFAULT_SCAN_UNIT_BYTES, deep_item_scaled
from ckpt_cli.core.verify.problems import Problem, escalate
from ckpt_cli.core.verify.structure import check_item, item_metadata_files
from ckpt_cli.core.verify.targets import ItemTarget, Targets, find_targets
from ckpt_cli.core.verify.tier import tier_check
from ckpt_cli.core.verify.timebox import budgeted_deep
from ckpt_cli.core.verify.types import (
    Coverage,
    DataResult,
    ItemCheck,
    ItemFacts,
    Level,
    Rotation,
    SampleInfo,
    VerifyOptions,
    VerifyReport,
)
from ckpt_cli.errors import CkptError, LockedError, NotFoundError, UsageError


def verify_path(
    location: Location,
    options: VerifyOptions,
    on_progress: ProgressFn | None = None,
    executor: Executor | ExecutorSpec | None = None,
    unit_bytes: int = DEFAULT_SCAN_UNIT_BYTES,
) -> VerifyReport:
    """Check ``location``; with ``executor`` the deep pass runs in units on its workers
    (``distributed``), everything else stays here. An ``ExecutorSpec`` that scales out is
    used for a deep pass or ``record`` only, and only when the split pays (``should_split``:
    the bytes to read against the workers' start-up; the report's ``scale`` says which): it is
    opened (and closed) here, or declined (its early-started workers released). An
    ``Executor`` given is always used.

    Progress: ``structure`` counts items, ``data`` bytes decoded (and checksummed).
    """
    if isinstance(executor, ExecutorSpec) and not (
        executor.scaled and (options.deep or options.record)
    ):
        executor = None
    started = options.clock()
    if options.upgrade and not options.record:
        raise UsageError("--upgrade converts a record: use it with --record")
    if options.record and options.sample is not None:
        raise UsageError("--record needs every chunk: it cannot be combined with --sample")
    if options.sample is not None and options.deep:
        raise UsageError("choose --deep (every chunk) or --sample (some chunks), not both")
    _check_budget(options, executor)
    with _record_lock(location, options.record):
        return _verify(location, options, on_progress, executor, unit_bytes, started)


@contextlib.contextmanager
def _record_lock(location: Location, record: bool) -> Iterator[None]:
    """``--record`` writes into the steps of a root: it holds the root's prune lock meanwhile,
    so a prune is refused (naming it) instead of deleting a step the recorder then re-creates;
    a running prune makes the recorder wait for nothing: it is refused the same way."""
    if not record:
        yield
        return
    root = _root_of(location)
    if root is None:
        yield
        return
    lock, _ = take_lock(root.child(PRUNE_LOCK), "verify --record")
    if lock is None:
        lock_file = root.child(PRUNE_LOCK)
        what = holder_command(lock_file, "prune")
        raise LockedError(
            f"{what} of {root} is running ({holder_of(lock_file)}): not recording now",
            hint="run `ckpt verify --record` again when it is done",
        )
    with lock:
        root.refresh()  # what a prune deleted before we got the lock is not recorded into
        yield


def _root_of(location: Location) -> Location | None:
    """The CheckpointManager root a path is, or whose step it is (None: a lone step/item)."""
    for candidate in (location, location.parent):
        try:
            if detect(candidate).kind == "root":
                return candidate
        except CkptError:
            return None
    return None


def _verify(
    location: Location,
    options: VerifyOptions,
    on_progress: ProgressFn | None,
    executor: Executor | ExecutorSpec | None,
    unit_bytes: int,
    started: float,
) -> VerifyReport:
    found = find_targets(location, options)
    kind, targets, problems = found.kind, found.items, found.problems

    facts = _check_items(location, targets, on_progress)

    level = _level(options)
    names = [t.name for t in targets]
    coverage: Coverage | None = None
    rotation: Rotation | None = None
    scale: Scale | None = None
    notes: list[str] = []
    if options.max_duration is not None and level == "deep":
        wants = [wanted(f.record, options.record, options.upgrade) for f in facts]
        total = sum(item_bytes(f, w) for f, w in zip(facts, wants, strict=True))
        on_bytes = ByteProgress(on_progress, "data", total)
        results, coverage, rotation, notes = budgeted_deep(
            facts, options, on_bytes, started, options.clock
        )
        sample = None
    else:
        results, sample, scale = _data_level(
            facts, options, level, on_progress, _Scaling(executor, location, unit_bytes), names
        )
        if level != "structure":
            coverage = _full_coverage(facts, results, sample, options.clock() - started)
    recorded: list[str] = []
    checks = [
        _item_check(t, f, r, level, options, recorded)
        for t, f, r in zip(targets, facts, results, strict=True)
    ]
    top = [escalate(p, options.strict, options.fail_on_nonfinite) for p in problems]
    marked: tuple[str, ...] = ()
    if options.mark_committed:
        marked = tuple(_mark_committed(s) for s in _clean_steps(found, checks, top))
    return VerifyReport(
        path=str(location),
        kind=kind,
        level=level,
        items=tuple(checks),
        problems=_with_steps(found, top, checks),
        steps=tuple(found.steps),
        unfinished=tuple(found.unfinished),
        unfinished_why=dict(found.why_unfinished),
        sample=sample,
        coverage=coverage,
        rotation=rotation,
        recorded=tuple(recorded),
        marked_committed=marked,
        elapsed_s=options.clock() - started,
        extra={"warnings": notes} if notes else {},
        scale=scale,
    )


def _level(options: VerifyOptions) -> Level:
    """How far the check reads: a sample, every chunk, or metadata and sizes only."""
    if options.sample is not None:
        return "sample"
    return "deep" if options.deep or options.record or options.mark_committed else "structure"


def _item_check(
    t: ItemTarget,
    f: ItemFacts,
    r: DataResult | None,
    level: Level,
    options: VerifyOptions,
    recorded: list[str],
) -> ItemCheck:
    """One item's result; with ``--record``, its digests written unless it has errors (what was
    recorded is added to ``recorded``)."""
    item_problems = [escalate(p, options.strict, options.fail_on_nonfinite) for p in f.problems]
    digests = _digest_state(f, level)
    if f.kind in ("empty", "unknown"):
        # Nothing ckpt reads: nothing recorded into it either (carried as it is).
        digests = "not-read"
    elif options.record and r is not None:
        if any(p.severity == "error" for p in item_problems):
            digests = "not-recorded"
        else:
            assert f.inventory is not None
            try:
                ld1 = wanted(f.record, True, options.upgrade).ld1
                write_digests(f.inventory.base, record_of(r.digests, r.files, ld1))
                recorded.append(t.shown_as)
                digests = "recorded"
            except NotFoundError:
                digests = "not-recorded"  # the item was removed meanwhile: nothing to record
    return ItemCheck(
        path=t.shown_as,
        step=t.step,
        name=t.name,
        kind=f.kind,
        leaves=tuple(f.leaves),
        arrays=len(f.arrays_seen),
        chunks=f.chunks,
        files=len(f.inventory.sizes) if f.inventory else 0,
        digests=digests,
        problems=tuple(replace(p, step=t.step) for p in item_problems),
        nonfinite=tuple(r.nonfinite) if r else (),
        bytes_decoded=r.bytes_decoded if r else 0,
        chunks_decoded=r.chunks_decoded if r else 0,
        handler=f.handler,
        tier=tier_check(f, level, digests == "recorded"),
        unreferenced=tuple(f.unreferenced),
    )


def _check_items(
    location: Location, targets: list[ItemTarget], on_progress: ProgressFn | None
) -> list[ItemFacts]:
    """``check_item`` of every target. On object stores the items' metadata files are fetched
    first, all at once, and the items are checked ``ITEM_WORKERS`` at a time (each check waits
    on a chain of requests: the OCDBT manifest, its tree nodes, the headers)."""
    total = len(targets)
    if location.parallel_reads <= 1 or total <= 1:
        facts = []
        for i, t in enumerate(targets):
            if on_progress:
                on_progress(Progress("structure", t.shown_as, i, total))
            facts.append(check_item(t.location, t.shown_as, location, t.is_step, t.handler, t.tier))
        if on_progress:
            on_progress(Progress("structure", None, total, total))
        return facts
    from concurrent.futures import ThreadPoolExecutor, as_completed

    location.prefetch([f for t in targets for f in item_metadata_files(t.location)])
    workers = max(1, min(total, location.parallel_reads // 4))
    with ThreadPoolExecutor(workers) as pool:
        futures = {
            pool.submit(
                check_item, t.location, t.shown_as, location, t.is_step, t.handler, t.tier
            ): i
            for i, t in enumerate(targets)
        }
        out: dict[int, ItemFacts] = {}
        for done in as_completed(futures):
            out[futures[done]] = done.result()
            if on_progress:
                on_progress(Progress("structure", targets[futures[done]].shown_as, len(out), total))
    return [out[i] for i in range(total)]


def _check_budget(options: VerifyOptions, executor: object) -> None:
    if options.rotate and options.max_duration is None:
        raise UsageError("--rotate needs --max-duration: it continues a budgeted run")
    if options.max_duration is None:
        return
    if options.max_duration <= 0:
        raise UsageError("--max-duration must be longer than zero")
    if options.record or options.mark_committed:
        flag = "--record" if options.record else "--mark-committed"
        raise UsageError(f"{flag} needs every chunk: it cannot be combined with --max-duration")
    if not (options.deep or options.sample is not None):
        raise UsageError(
            "--max-duration budgets the data level: give --deep or --sample",
            hint="for example ckpt verify ROOT --latest --deep --max-duration 10m --rotate",
        )
    if options.sample is not None:
        raise UsageError("--max-duration applies to --deep; a --sample run is bounded already")
    if executor is not None:
        raise UsageError("--max-duration runs in this process: drop --executor/--workers")


def _full_coverage(
    facts: list[ItemFacts],
    results: list[DataResult | None],
    sample: SampleInfo | None,
    elapsed: float,
) -> Coverage:
    sizes = sum(sum(f.array_bytes(n) for n in f.arrays) for f in facts)
    done = sum(r.bytes_decoded for r in results if r)
    whole = sum(len(f.arrays) for f in facts)
    leaves = sum(r.leaves_complete for r in results if r) if sample is None else 0
    return Coverage(done, sizes, leaves, whole, None, None, elapsed)


@dataclass(frozen=True)
class _Scaling:
    """What a deep pass may scale out on: an executor (always used), a spec (used when the
    split pays) or None, and where it reads (``location``: a bucket or a file system)."""

    executor: Executor | ExecutorSpec | None = None
    location: Location | None = None
    unit_bytes: int = DEFAULT_SCAN_UNIT_BYTES


def _data_level(
    facts: list[ItemFacts],
    options: VerifyOptions,
    level: str,
    on_progress: ProgressFn | None,
    scaling: _Scaling | None = None,
    names: list[str] | None = None,
) -> tuple[list[DataResult | None], SampleInfo | None, Scale | None]:
    if level == "structure":
        return [None] * len(facts), None, None
    if options.sample is not None:
        total = sum(sum(f.array_bytes(n) for n in f.arrays) for f in facts)
        if options.sample.subset is not None:
            total //= options.sample.subset[1]
        elif options.sample.percent:
            total = int(total * options.sample.percent / 100)
        else:
            total = min(total, options.sample.bytes or 0)
        on_bytes = ByteProgress(on_progress, "data", total)
        results, sample = sample_items(
            facts, options.sample, options.seed, options.budget, on_bytes, names
        )
        return list(results), sample, None
    scaling = scaling or _Scaling()
    wants = [wanted(f.record, options.record, options.upgrade) for f in facts]
    total = sum(item_bytes(f, w) for f, w in zip(facts, wants, strict=True))
    on_bytes = ByteProgress(on_progress, "data", total)
    out: list[DataResult | None] = []
    with contextlib.ExitStack() as stack:
        executor, scale = _deep_executor(stack, scaling, total)
        for f, want in zip(facts, wants, strict=True):
            if executor is None or f.partial:  # a local tier's partial leaves: read here
                r = deep_item(f, want, options.budget, on_bytes)
            else:
                r = deep_item_scaled(
                    f, want, options.budget, executor, scaling.unit_bytes, on_bytes
                )
                r.chunks_decoded = sum(info.num_chunks for info, _ in f.arrays.values())
                r.leaves_complete = len(f.arrays)
            out.append(r)
    if scale is not None and scale.split:
        units = sum(r.units for r in out if r)
        seconds = sum(r.worker_seconds for r in out if r)
        scale = replace(scale, units=units, worker_seconds=seconds)
    return out, None, scale


def _deep_executor(
    stack: contextlib.ExitStack, scaling: _Scaling, nbytes: int
) -> tuple[Executor | None, Scale | None]:
    """The executor a deep pass reading ``nbytes`` runs on (entered on ``stack``), and its
    ``Scale`` (None: not asked to scale out). A spec whose split does not pay is declined: its
    early-started workers are released and the pass stays in this process."""
    executor = scaling.executor
    if executor is None:
        return None, None
    if isinstance(executor, Executor):
        return executor, Scale(executor.name, executor.workers)
    from ckpt_cli.core.storage.remote import RemoteLocation

    remote = isinstance(scaling.location, RemoteLocation)
    decision = should_split(executor, nbytes, remote=remote, reads_only=True)
    if not decision.split:
        decline(executor)
        return None, Scale(executor.kind, executor.workers, split=False, reason=decision.reason)
    pool = stack.enter_context(open_executor(executor))
    return pool, Scale(pool.name, pool.workers)


def _digest_state(f: ItemFacts, level: str) -> str:
    if f.record is None:
        return "absent"
    return {"structure": "sizes-checked", "sample": "sampled"}.get(level, "checked")


def _with_steps(found: Targets, top: list[Problem], checks: list[ItemCheck]) -> tuple[Problem, ...]:
    """Every problem, root and step ones first, each carrying its step: an item's is the
    item's; one found on the way (a step's file) the step its path starts with."""
    by_name = (
        {loc.name: n for loc, n in zip(found.step_locations, found.steps, strict=True)}
        if found.kind == "root"
        else {}
    )
    lone = found.steps[0] if found.kind != "root" and len(found.steps) == 1 else None

    def step_of(p: Problem) -> int | None:
        first = (p.file or "").split("/", 1)[0]
        return by_name.get(first, lone)

    out = [replace(p, step=step_of(p)) for p in top]
    out += [p for c in checks for p in c.problems]  # each carries its item's step already
    return tuple(out)


def _clean_steps(found: Targets, checks: list[ItemCheck], top: list[Problem]) -> list[Location]:
    """The checked steps with no error: of a root, each step on its own (one damaged step
    does not hold back the stamp of the others; a problem of the root itself holds back none);
    a step given itself, only when the whole check is clean."""
    if found.kind != "root":
        clean = not any(p.severity == "error" for c in checks for p in (*top, *c.problems))
        return found.step_locations if clean else []
    out = []
    for loc, number in zip(found.step_locations, found.steps, strict=True):
        if loc.child(COMMIT_MARKER).is_file():
            continue  # nothing to stamp: a root's report names only the steps stamped now
        prefix = loc.name + "/"
        mine = [p for p in top if p.file is not None and (p.file + "/").startswith(prefix)]
        mine += [p for c in checks if c.step == number for p in c.problems]
        if not any(p.severity == "error" for p in mine):
            out.append(loc)
    return out


def _mark_committed(step: Location) -> str:
    """Put the step's ``commit_success.txt`` (Orbax's text); a marker already there is kept."""
    marker = step.child(COMMIT_MARKER)
    if not marker.is_file():
        marker.write_bytes(f"Checkpoint commit was successful to {step}".encode())
    return str(step)
