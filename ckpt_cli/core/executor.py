"""Where the units of a scaled-out run execute: this machine or an existing Dask cluster.

An executor maps a module-level function over picklable units and hands each result to a
callback as soon as it arrives (progress aggregates on the driver, across workers), returning
the results in unit order. Units are idempotent, so re-running one is always safe:

* ``local``: ``workers`` processes on this machine (``spawn``: TensorStore's threads do not
  survive ``fork``), or the calling process itself for one worker. A worker process that dies
  breaks Python's pool; the pool is rebuilt and the unfinished units are submitted again.
* ``dask``: a running ``distributed`` scheduler, by address or Dask's own
  ``DASK_SCHEDULER_ADDRESS``. The scheduler re-runs the tasks of a worker that dies (Dask's
  ``distributed.scheduler.allowed-failures``, 3 by default); a task that raised is retried once
  more here (a transient storage error), then fails the run.

Workers are ready when the work is: a command starts its executor (``start_early``) before it
lists and plans, every worker process is spawned at once and imports TensorStore and the unit
modules (``WORKER_PRELOAD``) in its initializer (Dask: a worker plugin registered on connect),
the pool lives for the whole run (rebuilt only after a worker died), and ``map`` takes the units
as an iterable: each unit is submitted as the planner yields it.

Windows full across unit boundaries: a unit's reads drain at its end, and a worker that waits for
its last read before it takes the next unit sends nothing for a round trip or more. So every
worker process runs up to ``UNITS_PER_WORKER`` (2) units at once, on threads: it takes its next
unit while the previous one drains. Local: the pool's worker loop takes a call whenever fewer than
that many run (``workers.threaded_worker``). Dask: each task holds one of the worker's
``UNITS_PER_WORKER`` slots and secedes from the worker's thread pool (``distributed.secede``), so
the worker starts its next task; a third waits for a slot. Memory stays bounded: a writer gives
each unit ``1 / units_per_worker`` of ``--memory-limit``, so a worker holds no more than one
single-process writer.

Why Dask and not Ray: the workers do I/O and numpy through TensorStore, which needs no actor
state, no object store and no GPU scheduling; Dask's ``distributed`` is two pure-Python wheels
(Ray is a ~70 MB native wheel that starts a GCS, a raylet and an object store per node), its
``LocalCluster`` runs two worker processes on 2 cores in about a second, and worker loss is
handled by the scheduler with no code here (``client.map`` + ``as_completed``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any, TypeVar

from ckpt_cli.core.workers import (
    UNITS_PER_WORKER,
    WORKER_PRELOAD,
    in_slot,
    ready_task,
    start_worker,
    threaded_pool,
)
from ckpt_cli.errors import CkptError, StorageError, UnsupportedError, UsageError

T = TypeVar("T")
R = TypeVar("R")

EXECUTORS = ("local", "dask")
#: Times the local pool is rebuilt after a worker process died, before the run fails.
_POOL_RESTARTS = 3


@dataclass(frozen=True)
class ExecutorSpec:
    """What the command line asked for: ``--executor``, ``--workers``, ``--scheduler``."""

    kind: str = "local"
    workers: int = 1
    scheduler: str | None = None
    #: ``--force-split``: split into units even where ``should_split`` says it does not pay.
    force_split: bool = False

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise UsageError(f"--executor {self.kind!r}: use local or dask")
        if self.scheduler and self.kind != "dask":
            raise UsageError("--scheduler applies to --executor dask")
        if self.workers < 1:
            raise UsageError(f"--workers {self.workers}: give at least 1")

    @property
    def scaled(self) -> bool:
        """Whether the run is split into units (otherwise: the single-process writer)."""
        return self.kind != "local" or self.workers > 1


class Executor:
    """Runs ``fn`` over ``units``; ``on_done`` sees each result as it arrives."""

    name = "executor"
    workers = 1
    #: Units one worker process runs at once (what a unit's share of ``--memory-limit`` is).
    units_per_worker = 1

    def map(
        self,
        fn: Callable[[T], R],
        units: Iterable[T],
        on_done: Callable[[R], None] | None = None,
    ) -> list[R]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the executor holds (worker processes, the scheduler connection)."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InlineExecutor(Executor):
    """Units run one after another in this process: ``--workers 1`` with units (tests, bench)."""

    name = "local"

    def map(
        self,
        fn: Callable[[T], R],
        units: Iterable[T],
        on_done: Callable[[R], None] | None = None,
    ) -> list[R]:
        out = []
        for unit in units:
            result = fn(unit)
            if on_done is not None:
                on_done(result)
            out.append(result)
        return out


class LocalExecutor(Executor):
    """``workers`` spawned processes on this machine, all started (and importing
    ``WORKER_PRELOAD``) as the executor is created; ``ready_seconds``: how long until every
    one of them could take a unit (None while some are still starting)."""

    name = "local"
    units_per_worker = UNITS_PER_WORKER

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.ready_seconds: float | None = None
        self._pool: Any = self._new_pool()

    def _new_pool(self) -> Any:
        import multiprocessing

        pool = threaded_pool()(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=start_worker,
            initargs=(WORKER_PRELOAD,),
        )
        # Python spawns a worker per submit that finds none idle: one no-op task per worker
        # starts them all now, not one by one as the first units arrive.
        started, waiting = time.monotonic(), [self.workers]

        def ready(_: object) -> None:
            waiting[0] -= 1
            if not waiting[0] and self.ready_seconds is None:
                self.ready_seconds = time.monotonic() - started

        for _ in range(self.workers):
            pool.submit(ready_task).add_done_callback(ready)
        return pool

    def _stop_workers(self) -> None:
        """Kill the worker processes now (units are idempotent and the caller discards their
        output): a unit still running would write into a step after it was removed."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        stop = getattr(pool, "terminate_workers", None)  # Python 3.14
        if stop is not None:
            stop()
        else:
            processes = list(getattr(pool, "_processes", {}).values())
            for p in processes:
                p.terminate()
            for p in processes:
                p.join(10)
        # Not cancel_futures: the pool's manager thread fails their futures as it sees the
        # workers gone, and a future cancelled first makes it raise in that thread (3.11).
        pool.shutdown(wait=True)

    def map(
        self,
        fn: Callable[[T], R],
        units: Iterable[T],
        on_done: Callable[[R], None] | None = None,
    ) -> list[R]:
        """Submit each unit as ``units`` yields it; the results in unit order."""
        from concurrent.futures.process import BrokenProcessPool

        results: dict[int, R] = {}
        submitted: list[T] = []  # every unit taken from ``units``, to resubmit after a death
        source = iter(units)
        restarts = 0
        while True:
            if self._pool is None:
                self._pool = self._new_pool()
            pending: dict[Future[R], int] = {}
            try:
                for i, u in enumerate(submitted):
                    if i not in results:
                        pending[self._pool.submit(fn, u)] = i
                self._stream(fn, source, submitted, pending, results, on_done)
                return [results[i] for i in range(len(submitted))]
            except BrokenProcessPool:
                # A worker process died (killed, out of memory): units are idempotent, so the
                # unfinished ones simply run again on a fresh pool.
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
                restarts += 1
                if restarts > _POOL_RESTARTS:
                    raise StorageError(
                        f"local worker processes died {restarts} times; "
                        f"{len(submitted) - len(results)} units unfinished, nothing written",
                        hint="lower --memory-limit or --workers",
                    ) from None
            except BaseException:
                # Interrupted (Ctrl-C, SIGTERM) or a unit failed: the run ends here.
                self._stop_workers()
                raise

    def _stream(
        self,
        fn: Callable[[T], R],
        source: Iterator[T],
        submitted: list[T],
        pending: dict[Future[R], int],
        results: dict[int, R],
        on_done: Callable[[R], None] | None,
    ) -> None:
        """Submit the rest of ``source`` unit by unit (taking the results that arrived
        meanwhile), then wait for every pending unit."""
        for unit in source:
            submitted.append(unit)
            pending[self._pool.submit(fn, unit)] = len(submitted) - 1
            _collect(pending, results, on_done, block=False)
        while pending:
            _collect(pending, results, on_done, block=True)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class DaskExecutor(Executor):
    """Tasks on a running Dask ``distributed`` scheduler."""

    name = "dask"
    units_per_worker = UNITS_PER_WORKER

    def __init__(self, address: str | None) -> None:
        try:
            from distributed import Client
        except ImportError:
            raise UnsupportedError(
                "--executor dask needs Dask distributed, which is not installed",
                hint="pip install 'ckpt-orbax[dask]'",
            ) from None
        address = address or os.environ.get("DASK_SCHEDULER_ADDRESS")
        if not address:
            raise UsageError(
                "--executor dask needs the scheduler's address",
                hint="give --scheduler tcp://HOST:8786 or set DASK_SCHEDULER_ADDRESS",
            )
        self.address = address
        try:
            self.client = Client(address, timeout="20s")
        except (OSError, TimeoutError) as e:
            raise StorageError(
                f"cannot reach the Dask scheduler at {address}: {str(e).splitlines()[0]}",
                hint="start one with `dask scheduler` and `dask worker ADDRESS`",
            ) from None
        self.workers = len(self.client.scheduler_info().get("workers", {}))
        if self.workers == 0:
            self.client.close()
            raise StorageError(
                f"the Dask scheduler at {address} has no workers",
                hint="start some with `dask worker ADDRESS`",
            )
        # Every worker (and any that joins later) imports WORKER_PRELOAD now, while the driver
        # plans; ``map`` waits for it before the first task, so no task pays the import.
        self._preloading = threading.Thread(target=self._preload, daemon=True)
        self._preloading.start()

    def _preload(self) -> None:
        import contextlib

        from ckpt_cli.core.dask_preload import register

        # An optimisation only: if it fails, a task imports what it needs anyway.
        with contextlib.suppress(Exception):
            register(self.client, WORKER_PRELOAD)

    def map(
        self,
        fn: Callable[[T], R],
        units: Iterable[T],
        on_done: Callable[[R], None] | None = None,
    ) -> list[R]:
        import uuid

        from distributed import Event, as_completed

        self._preloading.join()
        stop = Event(f"ckpt-stop-{uuid.uuid4().hex}", client=self.client)
        futures: list[Any] = []
        index: dict[Any, int] = {}
        results: dict[int, R] = {}
        arrived = as_completed()
        try:
            for unit in units:  # each submitted as the planner yields it
                task = self.client.submit(in_slot, fn, unit, stop.name, pure=False, retries=1)
                index[task.key] = len(futures)
                futures.append(task)
                arrived.add(task)
            for fut in arrived:
                try:
                    value = fut.result()
                except CkptError:
                    raise
                except Exception as e:  # KilledWorker: the unit's workers kept dying
                    raise StorageError(
                        f"a unit failed on the Dask cluster: {type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}; nothing written",
                        hint="check the workers' logs (memory, storage credentials)",
                    ) from None
                results[index[fut.key]] = value
                if on_done is not None:
                    on_done(value)
        except BaseException:
            # Interrupted or failed: no unit starts from now on (``in_slot`` asks ``stop``;
            # left set: a task the cancel has not reached yet may still ask), cancel what has
            # not run, and wait for the units already running to end (Dask cannot stop a
            # running task), so that none writes into a step the caller is about to remove.
            with contextlib.suppress(Exception):  # the cluster went away: nothing runs there
                stop.set()
            self.client.cancel([f for f in futures if not f.done()])
            self._wait_stopped({f.key for f in futures})
            raise
        return [results[i] for i in range(len(futures))]

    def _wait_stopped(self, keys: set[Any], timeout_s: float = 60) -> None:
        import time

        def running(dask_worker: Any, keys: set[Any] = keys) -> int:
            state = dask_worker.state
            busy = {ts.key for ts in (*state.executing, *state.long_running)}
            return len(busy & keys)

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if not sum(self.client.run(running).values()):
                    return
            except Exception:  # the cluster went away: nothing of ours runs there any more
                return
            time.sleep(0.1)

    def close(self) -> None:
        self._preloading.join(30)
        self.client.close()


def _collect(
    pending: dict[Future[R], int],
    results: dict[int, R],
    on_done: Callable[[R], None] | None,
    *,
    block: bool,
) -> None:
    """Move the finished futures of ``pending`` into ``results`` (waiting for one if
    ``block``); a unit's exception (or a broken pool) is raised here."""
    done, _ = wait(pending, timeout=None if block else 0, return_when=FIRST_COMPLETED)
    for fut in done:
        i = pending.pop(fut)
        results[i] = fut.result()
        if on_done is not None:
            on_done(results[i])


#: Executors a command started before it listed and planned, taken by ``open_executor``.
_STARTED: dict[ExecutorSpec, Executor] = {}


def start_early(spec: ExecutorSpec) -> None:
    """Start ``spec``'s workers now (a command, before it lists and plans): spawn and imports
    overlap the planning. ``open_executor(spec)`` then returns this executor. A Dask scheduler
    that cannot be reached is left to ``open_executor``, which reports it when it is needed."""
    if not spec.scaled or spec in _STARTED:
        return
    try:
        _STARTED[spec] = _new_executor(spec)
    except CkptError:
        return
    atexit.register(_close_unused)


def decline(spec: ExecutorSpec) -> None:
    """The run stays in one process: close ``spec``'s early-started executor. A Dask executor
    that could not be started still fails the run (no scheduler address, none reachable): what
    was asked for is wrong, whether or not it is used."""
    if spec.kind == "dask" and spec not in _STARTED:
        _new_executor(spec).close()
    release_early(spec)


def release_early(spec: ExecutorSpec) -> None:
    """Close ``spec``'s early-started executor if the run never opened it (a refused plan, a
    usage error): the command's end, so that no pool outlives it."""
    started = _STARTED.pop(spec, None)
    if started is not None:
        started.close()


def _close_unused() -> None:
    while _STARTED:
        _STARTED.popitem()[1].close()


def _new_executor(spec: ExecutorSpec) -> Executor:
    if spec.kind == "dask":
        return DaskExecutor(spec.scheduler)
    return InlineExecutor() if spec.workers == 1 else LocalExecutor(spec.workers)


def open_executor(spec: ExecutorSpec) -> Executor:
    """The executor ``spec`` asks for, started (a pool, or a connection to the scheduler): the
    one ``start_early`` started, if any."""
    started = _STARTED.pop(spec, None)
    return started if started is not None else _new_executor(spec)
