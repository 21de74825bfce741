"""``verify``: check a root (its committed steps), a step or an item, in layers.

1. structure (always): metadata, arrays, chunk keys, OCDBT trees, files, commit state;
2. ``deep``: decode every chunk, count NaN/Inf, check recorded digests (or ``record`` them);
3. ``sample``: decode a random subset of chunks, check the files that hold them.

Damage is never raised: it becomes problems in the report. Only a path that is no checkpoint at
all (or cannot be listed) raises, which the CLI turns into exit code 3.
"""

from __future__ import annotations

import contextlib
import time

from ckpt_cli.core.executor import Executor, ExecutorSpec, open_executor
from ckpt_cli.core.format.digests import DigestRecord, write_digests
from ckpt_cli.core.format.names import COMMIT_MARKER
from ckpt_cli.core.progress import ByteProgress, Progress, ProgressFn
from ckpt_cli.core.storage import Location
from ckpt_cli.core.verify.deep import deep_item, item_bytes, sample_items
from ckpt_cli.core.verify.distributed import DEFAULT_SCAN_UNIT_BYTES, deep_item_scaled
from ckpt_cli.core.verify.problems import escalate
from ckpt_cli.core.verify.structure import check_item, item_metadata_files
from ckpt_cli.core.verify.targets import ItemTarget, find_targets
from ckpt_cli.core.verify.types import (
    DataResult,
    ItemCheck,
    ItemFacts,
    SampleInfo,
    VerifyOptions,
    VerifyReport,
)
from ckpt_cli.errors import UsageError


def verify_path(
    location: Location,
    options: VerifyOptions,
    on_progress: ProgressFn | None = None,
    executor: Executor | ExecutorSpec | None = None,
    unit_bytes: int = DEFAULT_SCAN_UNIT_BYTES,
) -> VerifyReport:
    """Check ``location``; with ``executor`` the deep pass runs in units on its workers
    (``distributed``), everything else stays here. An ``ExecutorSpec`` that scales out is
    opened (and closed) here, for a deep pass or ``record`` only.

    Progress: ``structure`` counts items, ``data`` bytes decoded (and checksummed).
    """
    if isinstance(executor, ExecutorSpec):
        with contextlib.ExitStack() as stack:
            pool = None
            if executor.scaled and (options.deep or options.record):
                pool = stack.enter_context(open_executor(executor))
            return verify_path(location, options, on_progress, pool, unit_bytes)
    started = time.monotonic()
    if options.record and options.sample is not None:
        raise UsageError("--record needs every chunk: it cannot be combined with --sample")
    if options.sample is not None and options.deep:
        raise UsageError("choose --deep (every chunk) or --sample (some chunks), not both")
    found = find_targets(location, options)
    kind, targets, problems = found.kind, found.items, found.problems

    facts = _check_items(location, targets, on_progress)

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
    if options.mark_committed and clean and found.step_locations:
        marked = tuple(_mark_committed(s) for s in found.step_locations)
    return VerifyReport(
        path=str(location),
        kind=kind,
        level=level,
        items=tuple(checks),
        problems=tuple(top) + tuple(p for c in checks for p in c.problems),
        steps=tuple(found.steps),
        unfinished=tuple(found.unfinished),
        sample=sample,
        recorded=tuple(recorded),
        marked_committed=marked,
        elapsed_s=time.monotonic() - started,
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
            facts.append(check_item(t.location, t.shown_as, location, t.is_step))
        if on_progress:
            on_progress(Progress("structure", None, total, total))
        return facts
    from concurrent.futures import ThreadPoolExecutor, as_completed

    location.prefetch([f for t in targets for f in item_metadata_files(t.location)])
    workers = max(1, min(total, location.parallel_reads // 4))
    with ThreadPoolExecutor(workers) as pool:
        futures = {
            pool.submit(check_item, t.location, t.shown_as, location, t.is_step): i
            for i, t in enumerate(targets)
        }
        out: dict[int, ItemFacts] = {}
        for done in as_completed(futures):
            out[futures[done]] = done.result()
            if on_progress:
                on_progress(Progress("structure", targets[futures[done]].shown_as, len(out), total))
    return [out[i] for i in range(total)]


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
    if options.sample is not None:
        total = sum(sum(i.nbytes for i, _ in f.arrays.values()) for f in facts)
        total = (
            int(total * (options.sample.percent or 100) / 100)
            if options.sample.percent
            else min(total, options.sample.bytes or 0)
        )
        on_bytes = ByteProgress(on_progress, "data", total)
        results, sample = sample_items(
            facts, options.sample, options.seed, options.budget, on_bytes
        )
        return list(results), sample
    wants = [options.record or f.record is not None for f in facts]
    on_bytes = ByteProgress(
        on_progress, "data", sum(item_bytes(f, w) for f, w in zip(facts, wants, strict=True))
    )
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


def _mark_committed(step: Location) -> str:
    """Put the step's ``commit_success.txt`` (Orbax's text); a marker already there is kept."""
    marker = step.child(COMMIT_MARKER)
    if not marker.is_file():
        marker.write_bytes(f"Checkpoint commit was successful to {step}".encode())
    return str(step)
