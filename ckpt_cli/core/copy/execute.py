"""``execute_copy``: stream a ``CopyPlan`` into its destination, data first, markers last.

Under the destination root's write claim (``core/write/claim.py``: one ckpt writer per root),
each step is written where no reader takes it for a finished one before it is: locally into a
tmp dir (``<step>.orbax-checkpoint-tmp-<µs>`` holding ckpt's owner record) renamed at the end,
in a bucket in place with a ``.ckpt-writing`` object first. Its data objects are copied several
at once (``concurrency`` copies in flight; object stores are latency-bound), each streamed in
pieces of ``PIECE`` bytes and appearing whole or not at all; once every one of them is there,
the markers follow one by one (``plan.marker_rank``), then the rename, or the removal of
``.ckpt-writing``. Several steps are in progress at once, so small steps overlap.

Resuming. A file already at the destination in the planned size is read back and kept when
its CRC-32 is the source's (the one recorded in ``_CKPT_DIGESTS.json`` when the item has a
record, else the source file's own): a rerun after a kill writes only what is missing.

``verify``: every file of an item with a record is checked against its recorded size and CRC-32
while it streams; the last piece is held back until the check passes, so a file that fails is
never completed at the destination, and its step gets no markers (its other files are removed).

Interrupts: ``Interrupted`` (SIGINT/SIGTERM) stops every copy at its next piece; what was
written stays as an unfinished ckpt write, which the next run resumes: locally a tmp dir no
reader takes for a step, in a bucket a step without ``commit_success.txt`` (uncommitted).
``left_behind`` says afterwards which steps are committed and where the unfinished ones are.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from ckpt_cli.core.copy.destination import CopyObject, dest_entries, dest_state
from ckpt_cli.core.copy.objects import PIECE, Mismatch, Stopped, write_stream
from ckpt_cli.core.copy.plan import CopyPlan, CpJSON, CpOutcomeJSON, StepStatus
from ckpt_cli.core.copy.step import StepJob, StepTally
from ckpt_cli.core.progress import ByteProgress, ProgressFn
from ckpt_cli.core.storage import Location
from ckpt_cli.core.write.claim import claim_root
from ckpt_cli.core.write.uploads import UploadCleanup, abort_under_claim
from ckpt_cli.errors import CkptError, DigestMismatchError, RefusedError


@dataclass(frozen=True)
class CopyResult:
    plan: CopyPlan
    outcome: CpOutcomeJSON
    #: Open uploads a killed earlier writer left under the destination, aborted first.
    uploads: UploadCleanup = field(default_factory=UploadCleanup)

    @property
    def ok(self) -> bool:
        return all(s["status"] != "failed" for s in self.outcome["steps"])

    def to_json(self) -> CpJSON:
        return self.plan.to_json(self.outcome, ok=self.ok)


def execute_copy(plan: CopyPlan, on_progress: ProgressFn | None = None) -> CopyResult:
    """Copy what ``plan`` names; raises ``DigestMismatchError`` (exit 1) when ``plan.verify`` found
    a file that is not what its record says (that step is not written), ``RefusedError`` when a
    committed destination step differs from its source."""
    start = time.monotonic()
    destination = plan.destination
    undo_dirs = destination.make_dirs_undoable()
    try:
        claim = claim_root(destination, "cp")
    except BaseException:
        undo_dirs()
        raise
    try:
        uploads = abort_under_claim(destination, claim)
        # Under the claim: the destination as it is now (the plan may be old).
        destination.refresh()
        entries = dest_entries(destination)
        steps = [dest_state(s.step, s.name, s.source, destination, entries) for s in plan.steps]
        plan = CopyPlan(
            plan.source, destination, plan.selection, tuple(steps), plan.root_files,
            plan.skipped, plan.warnings, plan.verify, plan.concurrency, plan.storage,
        )  # fmt: skip
        verify, concurrency = plan.verify, plan.concurrency
        owner = claim.owner.to_text().encode()
        progress = ByteProgress(on_progress, "copy", plan.total_bytes)
        jobs = [StepJob(s, verify) for s in plan.steps]
        with ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="ckpt-cp") as pool:
            runner = _Runner(pool, max(1, concurrency), progress)
            try:
                runner.root_files(plan)
                runner.run(jobs, owner)
            except BaseException:
                # Interrupted, or a store failed: every copy stops at its next piece, queued
                # ones never start; the pool's exit waits for the running ones.
                runner.stop.set()
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    except BaseException:
        claim.release()
        undo_dirs()  # a destination this run made and left empty (a full disk)
        raise
    claim.release()
    outcome = _outcome(jobs, runner, time.monotonic() - start)
    result = CopyResult(plan, outcome, uploads)
    failed = [j for j in jobs if j.tally.problem is not None]
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more steps)" if len(failed) > 1 else ""
        cls = RefusedError if first.tally.refused else DigestMismatchError
        raise cls(
            f"step {first.step.name} not copied: {first.tally.problem}{more}",
            hint=(
                "choose another destination; ckpt never overwrites a step"
                if first.tally.refused
                else f"the source is damaged: run `ckpt verify {plan.source} --deep`"
            ),
            result=result.to_json(),
        )
    return result


@dataclass(frozen=True)
class CopyLeft:
    """What a stopped copy left at the destination, from a fresh listing: the planned steps
    committed there now, and where each unfinished one is kept for a rerun to resume (a tmp
    dir locally, the uncommitted step itself in a bucket)."""

    planned: int
    committed: tuple[str, ...]
    unfinished: tuple[tuple[str, Location], ...]


def left_behind(plan: CopyPlan) -> CopyLeft:
    """After ``execute_copy`` stopped (an interrupt): each planned step as the destination holds
    it now. Listings only; a step that cannot be told (its listing failed) is left out."""
    destination = plan.destination
    committed: list[str] = []
    unfinished: list[tuple[str, Location]] = []
    with contextlib.suppress(CkptError):
        destination.refresh()
        entries = dest_entries(destination)
        for s in plan.steps:
            try:
                now = dest_state(s.step, s.name, s.source, destination, entries)
            except CkptError:
                continue
            if now.state == "present":
                committed.append(s.name)
            elif now.state == "resume":
                unfinished.append((s.name, now.write_to))
    return CopyLeft(len(plan.steps), tuple(committed), tuple(unfinished))


def _outcome(jobs: list[StepJob], runner: _Runner, seconds: float) -> CpOutcomeJSON:
    steps = []
    for j in jobs:
        t = j.tally
        status: StepStatus = (
            "failed" if t.problem else "already-there" if j.step.state == "present" else "copied"
        )
        steps.append(t.to_json(status))
    root = runner.root_tally
    return {
        "copied_objects": root.copied_objects + sum(j.tally.copied_objects for j in jobs),
        "copied_bytes": root.copied_bytes + sum(j.tally.copied_bytes for j in jobs),
        "skipped_objects": root.skipped_objects + sum(j.tally.skipped_objects for j in jobs),
        "skipped_bytes": root.skipped_bytes + sum(j.tally.skipped_bytes for j in jobs),
        "verified_objects": sum(j.tally.verified for j in jobs),
        "unverified_items": [u for j in jobs for u in j.unrecorded],
        "seconds": round(seconds, 3),
        "steps": steps,
    }


class _Runner:
    """Object copies as pool tasks, orchestrated from the calling (main) thread, so that
    interrupts land there: up to ``window`` steps open at once, each committed as soon as its
    last data object is written."""

    def __init__(self, pool: ThreadPoolExecutor, concurrency: int, progress: ByteProgress) -> None:
        self.pool = pool
        self.window = max(2, concurrency // 2)
        self.progress = progress
        self.stop = threading.Event()
        self.root_tally = StepTally("")

    def root_files(self, plan: CopyPlan) -> None:
        futures = []
        for o in plan.root_files:
            if o.dest_size is not None:
                self.root_tally.add(False, o.size, False)
                self.progress(o.size)
                continue
            src = plan.source.child(*o.rel.split("/"))
            dst = plan.destination.child(*o.rel.split("/"))
            futures.append(self.pool.submit(self._root_file, src, dst, o))
        for f in futures:
            f.result()

    def _root_file(self, src: Location, dst: Location, o: CopyObject) -> None:
        def pieces() -> Iterator[bytes]:
            for piece in src.iter_bytes(PIECE):
                if self.stop.is_set():
                    raise Stopped
                yield piece
                self.progress(len(piece))

        write_stream(dst, pieces(), o.size, src)
        self.root_tally.add(True, o.size, False)

    def run(self, jobs: list[StepJob], owner: bytes) -> None:
        queue = list(jobs)
        #: future -> (job, kind): kind "data" (one object) or "commit" (the step's markers)
        running: dict[Future[None], tuple[StepJob, str]] = {}
        open_data: dict[int, int] = {}  # id(job) -> data objects still in flight

        def submit_commit(job: StepJob) -> None:
            if job.tally.problem is not None:
                running[self.pool.submit(job.discard)] = (job, "discard")
            else:
                running[self.pool.submit(job.commit, self.stop, self.progress)] = (job, "commit")

        def open_step(job: StepJob) -> None:
            if job.tally.problem is not None:
                return  # failed its check before any data: nothing is written for it
            job.begin(owner)
            data = job.data()
            open_data[id(job)] = len(data)
            if not data:
                submit_commit(job)
            for o in data:
                running[self.pool.submit(job.copy, o, self.stop, self.progress)] = (job, "data")

        steps_open = 0
        while queue or running:
            while queue and steps_open < self.window and len(running) < 4 * self.window:
                job = queue.pop(0)
                open_step(job)
                steps_open += id(job) in open_data
            if not running:
                continue
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for f in done:
                job, kind = running.pop(f)
                error = f.exception()
                if isinstance(error, Mismatch) or (
                    error is not None and kind == "data" and job.tally.problem is not None
                ):
                    job.fail(str(error))
                elif isinstance(error, RefusedError):
                    job.fail(error.message)
                    job.tally.refused = True
                elif error is not None:
                    self.stop.set()
                    for other in running:
                        other.cancel()
                    self._drain(running)
                    raise error
                if kind == "data":
                    open_data[id(job)] -= 1
                    if open_data[id(job)] == 0:
                        submit_commit(job)
                else:
                    steps_open -= 1

    @staticmethod
    def _drain(running: dict[Future[None], tuple[StepJob, str]]) -> None:
        """Wait for the copies still running (they stop at their next piece)."""
        for f in list(running):
            with contextlib.suppress(BaseException):
                f.result()
