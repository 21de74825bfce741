"""``verify --deep --max-duration D [--rotate]``: a deep pass that fits a nightly budget.

The budget counts from the start of the run (borg's ``check --max-duration``); the structure
level always runs to its end, the data level stops submitting reads once the reads in flight
would carry it past the deadline (``budget.Deadline``). With ``--rotate`` each item keeps where
the last run stopped in ``_CKPT_VERIFY_STATE.json`` next to its digests, so N runs read every
block of every item; items are visited least-covered first. A run that finishes an item's cycle
starts its next cycle on the following run.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from datetime import datetime, timezone

from ckpt_cli.core.digest.records import DIGEST_FILE, Wanted, wanted
from ckpt_cli.core.storage import Location
from ckpt_cli.core.verify.budget import (
    STATE_FILE,
    Deadline,
    RotationState,
    fingerprint,
    load_state,
    state_mismatch,
    write_state,
)
from ckpt_cli.core.verify.deep import deep_item
from ckpt_cli.core.verify.types import Coverage, DataResult, ItemFacts, Rotation, VerifyOptions
from ckpt_cli.errors import CkptError


def _layout(facts: ItemFacts, budget: int, digests: Wanted) -> str:
    parts = [f"budget={budget}", f"digests={bool(digests)}"]
    for name in sorted(facts.arrays):
        info = facts.arrays[name][0]
        parts.append(f"{name}:{info.dtype}:{info.shape}:{info.chunk_shape}")
    return fingerprint(parts)


def _record_hash(item: Location) -> str | None:
    try:
        loc = item.child(DIGEST_FILE)
        return hashlib.sha256(loc.read_bytes()).hexdigest() if loc.is_file() else None
    except CkptError:
        return None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def budgeted_deep(
    facts: list[ItemFacts],
    options: VerifyOptions,
    on_bytes: Callable[[int], None] | None,
    started: float,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[DataResult | None], Coverage, Rotation | None, list[str]]:
    """The deep level under ``options.max_duration``; returns the results per item, the
    coverage, the rotation state (with ``rotate``) and warnings (a state file not used: damaged,
    or kept for other arrays; a state file not written)."""
    deadline = Deadline(options.max_duration, clock, started)
    deadline.start_data()
    bases = [f.inventory.base if f.inventory else None for f in facts]
    wants = [wanted(f.record, options.record, options.upgrade) for f in facts]
    layouts = [_layout(f, options.budget, w) for f, w in zip(facts, wants, strict=True)]
    records = [_record_hash(b) if b and options.rotate else None for b in bases]
    sizes = [sum(info.nbytes for info, _ in f.arrays.values()) for f in facts]
    states, warnings = _load_states(facts, options, bases, layouts, records)
    results = _read_items(facts, states, sizes, wants, options, deadline, on_bytes)
    coverage = Coverage(
        bytes=sum(r.bytes_decoded for r in results if r),
        of_bytes=sum(sizes),
        leaves=sum(r.leaves_complete for r in results if r),
        of_leaves=sum(len(f.arrays) for f in facts),
        stopped="max-duration" if deadline.stopped else None,
        budget_s=options.max_duration,
        elapsed_s=deadline.elapsed(),
    )
    if not options.rotate:
        return results, coverage, None, []
    files, covered, cycles, complete = [], 0, [], True
    for i, (facts_i, r) in enumerate(zip(facts, results, strict=True)):
        base, st = bases[i], states[i]
        if base is None or r is None:
            continue
        new, read = _next_state(st, r, layouts[i], records[i], sizes[i])
        covered += read
        complete = complete and r.resume_at is None
        cycles.append(new.cycle)
        try:
            write_state(base, new)
            files.append(f"{facts_i.shown_as}/{STATE_FILE}".lstrip("./") or STATE_FILE)
        except CkptError as e:
            warnings.append(f"rotation state not written for {facts_i.shown_as}: {e.message}")
    rotation = Rotation(
        tuple(files), covered, sum(sizes), min(cycles, default=0), complete, tuple(warnings)
    )
    return results, coverage, rotation, warnings


def _load_states(
    facts: list[ItemFacts],
    options: VerifyOptions,
    bases: list[Location | None],
    layouts: list[str],
    records: list[str | None],
) -> tuple[list[RotationState | None], list[str]]:
    """Each item's rotation state, where the last run stopped (None: start a new cycle), and a
    warning for each state file not used."""
    warnings: list[str] = []
    states: list[RotationState | None] = []
    for f, base, layout, record in zip(facts, bases, layouts, records, strict=True):
        st, why = load_state(base) if (options.rotate and base is not None) else (None, None)
        if st is not None and st.layout != layout:
            why = "it was kept for other arrays or another --budget"
        elif st is not None and st.record != record:
            why = f"{DIGEST_FILE} changed since (digests recorded again)"
        elif st is not None:
            why = state_mismatch(st, [f.arrays[n][0].nbytes for n in sorted(f.arrays)])
        if why is not None:
            shown = f"{f.shown_as}/{STATE_FILE}".lstrip("./") or STATE_FILE
            warnings.append(f"{shown} not used, a new rotation cycle starts: {why}")
            st = None
        states.append(st)
    return states, warnings


def _read_items(
    facts: list[ItemFacts],
    states: list[RotationState | None],
    sizes: list[int],
    wants: list[Wanted],
    options: VerifyOptions,
    deadline: Deadline,
    on_bytes: Callable[[int], None] | None,
) -> list[DataResult | None]:
    """Read the items, the least covered first when rotating, each from where its state says,
    until the deadline; an item not reached resumes at its start (or its state's cursor)."""

    def stop(in_flight: int) -> bool:
        return deadline.should_stop(in_flight)

    def progress(n: int) -> None:
        deadline.done(n)
        if on_bytes is not None:
            on_bytes(n)

    def covered_share(i: int) -> float:
        st = states[i]
        return (st.covered_bytes / max(1, sizes[i])) if st else 0.0

    order = sorted(range(len(facts)), key=covered_share) if options.rotate else range(len(facts))
    results: list[DataResult | None] = [None] * len(facts)
    for i in order:
        st = states[i]
        start = (st.cursor // (1 << 32), st.cursor % (1 << 32)) if st else None
        if deadline.should_stop(0):
            results[i] = DataResult([], {}, {}, resume_at=start or (0, 0))
            continue
        results[i] = deep_item(facts[i], wants[i], options.budget, progress, stop, start)
    return results


def _next_state(
    st: RotationState | None, r: DataResult, layout: str, record: str | None, size: int
) -> tuple[RotationState, int]:
    """The item's rotation state after this run, and the bytes its current cycle has covered."""
    done_before = st.covered_bytes if st else 0
    cycle = st.cycle if st else 0
    if r.resume_at is None:  # read to the end: the cycle is complete
        new = RotationState(layout, record, cycle + 1, _now(), 0, 0, size, _now())
        # What this cycle read, never what the state claims: a stale cursor covers less.
        return new, min(size, done_before + r.bytes_decoded)
    li, block = r.resume_at
    new = RotationState(
        layout,
        record,
        cycle,
        st.cycle_started_at if st else _now(),
        (li << 32) + block,
        done_before + r.bytes_decoded,
        size,
        _now(),
    )
    return new, new.covered_bytes
