"""A scaled-out run splits only when it pays: ``decide_split`` with fixed bytes, rate and
start-up both ways, ``--force-split`` overriding it, and the start-up it is given (the
early-started pool's measured ``ready_seconds`` once known, else the documented constant)."""

from __future__ import annotations

import pytest

from ckpt_cli.core import executor as ex_mod
from ckpt_cli.core.executor import ExecutorSpec, LocalExecutor
from ckpt_cli.core.split import (
    DASK_STARTUP_SECONDS,
    LOCAL_RATE,
    LOCAL_STARTUP_SECONDS,
    OBJECT_STORE_RATE,
    SPLIT_FACTOR,
    decide_split,
    should_split,
    startup_seconds,
)

MiB = 1 << 20


def test_a_transfer_well_above_the_start_up_splits() -> None:
    # 1 GiB at 100 MiB/s: 10.24 s alone, against 4 x 2 s of start-up.
    decision = decide_split(1024 * MiB, 100 * MiB, 2.0, factor=4)
    assert decision.split and decision.reason is None
    # Exactly K start-ups is enough.
    assert decide_split(800 * MiB, 100 * MiB, 2.0, factor=4).split


def test_a_short_transfer_stays_in_one_process_and_says_why() -> None:
    # 10 MiB at 100 MiB/s: 0.10 s alone, under 4 x 2 s.
    decision = decide_split(10 * MiB, 100 * MiB, 2.0, factor=4)
    assert not decision.split
    assert decision.reason is not None
    assert "10.0 MiB" in decision.reason and "0.10 s" in decision.reason
    assert "4 x" in decision.reason and "2.0 s" in decision.reason
    assert "--force-split" in decision.reason
    # Just under K start-ups is not.
    assert not decide_split(799 * MiB, 100 * MiB, 2.0, factor=4).split


def test_force_splits_whatever_the_estimate() -> None:
    decision = decide_split(1, 100 * MiB, 60.0, force=True)
    assert decision.split and decision.reason is None


def test_the_rate_depends_on_where_the_bytes_are() -> None:
    assert OBJECT_STORE_RATE < LOCAL_RATE
    spec = ExecutorSpec("local", 2)
    # Slow enough through an object store to pay for the start-up, quick on a local disk.
    nbytes = int(SPLIT_FACTOR * LOCAL_STARTUP_SECONDS * OBJECT_STORE_RATE)
    assert should_split(spec, nbytes, remote=True).split
    assert not should_split(spec, nbytes, remote=False).split
    assert should_split(ExecutorSpec("local", 2, force_split=True), 1, remote=True).split


def test_the_start_up_is_the_pools_measured_one_once_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = ExecutorSpec("local", 2)
    assert startup_seconds(spec) == LOCAL_STARTUP_SECONDS
    assert startup_seconds(ExecutorSpec("dask", 2)) == DASK_STARTUP_SECONDS
    pool = LocalExecutor.__new__(LocalExecutor)  # no processes: only its measured start-up
    pool.ready_seconds = None
    monkeypatch.setitem(ex_mod._STARTED, spec, pool)
    assert startup_seconds(spec) == LOCAL_STARTUP_SECONDS  # still starting
    pool.ready_seconds = 0.25
    assert startup_seconds(spec) == 0.25
    nbytes = int(SPLIT_FACTOR * 0.25 * LOCAL_RATE)
    assert should_split(spec, nbytes, remote=False).split
    assert not should_split(spec, nbytes - 1024, remote=False).split
