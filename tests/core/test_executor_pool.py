"""The worker pool is ready when the work is, proven by counts (never by time): units are
submitted as the planner yields them, every worker is spawned at once and runs its initializer
(the TensorStore + unit-module imports) exactly once per run, a command's early-started pool is
the one its run uses, Dask workers hold the same imports before their first task, and every
worker process (local or Dask) runs two units at once, never more."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ckpt_cli.core import executor as ex_mod
from ckpt_cli.core.executor import (
    DaskExecutor,
    ExecutorSpec,
    LocalExecutor,
    open_executor,
    release_early,
    start_early,
)
from ckpt_cli.core.workers import UNITS_PER_WORKER, WORKER_PRELOAD, units_running, worker_state


def square(i: int) -> int:
    return i * i


def held(_: int) -> tuple[int, int, int]:
    """A unit that lasts long enough for the worker to take its next one meanwhile; it reports
    how many units its process runs (itself included) and the most it ran at once."""
    import time

    time.sleep(0.4)
    return units_running()


def assert_two_units_per_worker(states: list[tuple[int, int, int]], workers: int) -> None:
    peaks: dict[int, int] = {}
    for pid, now, peak in states:
        assert 1 <= now <= peak <= UNITS_PER_WORKER
        peaks[pid] = max(peaks.get(pid, 0), peak)
    # Every worker took its next unit while one ran; none ever ran a third.
    assert len(peaks) == workers and set(peaks.values()) == {UNITS_PER_WORKER}, peaks


def test_units_are_submitted_as_the_planner_yields_them() -> None:
    pool = LocalExecutor(2)
    try:
        submits = [0]
        real = pool._pool.submit

        def counting(*args: Any, **kwargs: Any) -> Any:
            submits[0] += 1
            return real(*args, **kwargs)

        pool._pool.submit = counting
        seen_at_yield: list[int] = []

        def planner() -> Iterator[int]:
            for i in range(6):
                seen_at_yield.append(submits[0])
                yield i

        out = pool.map(square, planner())
    finally:
        pool.close()
    assert out == [i * i for i in range(6)]  # in unit order, as before
    # When the planner yields its last unit, the five before it are already submitted.
    assert seen_at_yield == [0, 1, 2, 3, 4, 5]
    assert submits[0] == 6


def test_every_worker_starts_at_once_and_once_per_run() -> None:
    pool = LocalExecutor(2)
    try:
        spawned = len(pool._pool._processes)  # before any unit was given
        first = pool.map(worker_state, range(8))
        second = pool.map(worker_state, range(8))  # a second item of the same run
        processes = len(pool._pool._processes)
    finally:
        pool.close()
    assert spawned == 2 and processes == 2
    states = first + second
    assert len(states) == 16
    pids = {pid for pid, _, _ in states}
    assert 1 <= len(pids) <= 2  # never a third process: the pool was not rebuilt
    assert {starts for _, starts, _ in states} == {1}  # each initializer ran once
    assert {held for _, _, held in states} == {WORKER_PRELOAD}  # imported before unit 1


def test_the_early_started_pool_is_the_one_the_run_opens() -> None:
    spec = ExecutorSpec("local", workers=2)
    start_early(spec)
    started = ex_mod._STARTED.get(spec)
    assert isinstance(started, LocalExecutor)
    start_early(spec)  # idempotent: still one pool
    assert ex_mod._STARTED[spec] is started
    with open_executor(spec) as opened:
        assert opened is started
        assert opened.map(square, [3]) == [9]
    assert spec not in ex_mod._STARTED
    start_early(ExecutorSpec("local", workers=1))  # nothing to start for one process
    assert not ex_mod._STARTED
    start_early(spec)  # a run that never opens it (a refused plan) closes it at its end
    unused = ex_mod._STARTED[spec]
    release_early(spec)
    assert spec not in ex_mod._STARTED and unused._pool is None


def test_dask_workers_hold_the_imports_before_their_first_task() -> None:
    from tests.support.cluster import local_cluster

    with local_cluster() as cluster, DaskExecutor(cluster.scheduler_address) as dask:
        states = dask.map(worker_state, range(4))
    assert len(states) == 4
    assert {held for _, _, held in states} == {WORKER_PRELOAD}


def test_each_local_worker_runs_two_units_at_once_never_more() -> None:
    with LocalExecutor(2) as pool:
        states = pool.map(held, range(12))
        assert len(pool._pool._processes) == 2  # two processes, each with two units running
    assert UNITS_PER_WORKER == 2
    assert_two_units_per_worker(states, 2)


def test_each_dask_worker_runs_two_units_at_once_never_more() -> None:
    from tests.support.cluster import local_cluster

    # One thread per worker (the cluster's setting): the second unit runs because the first
    # seceded from the worker's thread pool, the third waits for a slot.
    with local_cluster() as cluster, DaskExecutor(cluster.scheduler_address) as dask:
        states = dask.map(held, range(12))
    assert_two_units_per_worker(states, 2)


def touch(path: str) -> str:
    from pathlib import Path

    Path(path).write_text("written")
    return path


def test_a_dask_unit_asked_to_start_after_the_driver_stopped_does_not_run(tmp_path: Any) -> None:
    """The driver sets the run's stop event before it asks the workers what still runs; a task
    a worker starts after that (its cancel still on the way) ends before writing anything."""
    import pytest
    from distributed import Event

    from ckpt_cli.core.workers import in_slot
    from tests.support.cluster import local_cluster

    with local_cluster() as cluster, DaskExecutor(cluster.scheduler_address) as dask:
        stop = Event("ckpt-stop-test", client=dask.client)
        ran = dask.client.submit(in_slot, touch, str(tmp_path / "ran"), stop.name, pure=False)
        assert ran.result() == str(tmp_path / "ran")
        stop.set()
        late = dask.client.submit(in_slot, touch, str(tmp_path / "late"), stop.name, pure=False)
        with pytest.raises(RuntimeError, match="was stopped"):
            late.result()
    assert (tmp_path / "ran").read_text() == "written"
    assert not (tmp_path / "late").exists()
