"""``ckpt trend --workers N`` / ``--executor dask``: the same document (every row and finding,
to the bit) as one process, on local worker processes and on a local Dask cluster, with leaves
split across units (``--force-split``, small ``--unit-bytes``); bad scale flags are one line and
exit 2."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import local_cluster
from tests.support.paths import FIXTURES
from tests.support.trend_runs import NAN_LEAF, NAN_STEP, WIDE_LEAF, WIDE_NAN_STEP, TrendRuns

SPLIT = ("--force-split", "--unit-bytes", "4KiB")


def document(cli: Any, root: Any, *args: str) -> dict[str, Any]:
    r = cli("trend", root, *args, "--json")
    assert r.code == 0, r.stderr
    doc: dict[str, Any] = r.json()
    assert doc["leaves"] and doc["leaves"][0]["steps"]
    return doc


def assert_same_but_scale(scaled: dict[str, Any], single: dict[str, Any]) -> dict[str, Any]:
    """The two documents are equal but for ``scale``; returns the scaled run's ``scale``."""
    scale = scaled.pop("scale")
    assert single.pop("scale") is None
    assert scaled == single  # rows, findings, metrics: every float to the bit
    assert scale is not None
    return scale  # type: ignore[no-any-return]


@pytest.mark.slow
def test_two_local_workers_give_the_single_process_document(
    cli: Any, trend_runs: TrendRuns, wide_run: Path
) -> None:
    for root in (trend_runs.diverged, wide_run, FIXTURES / "unmerged_ocdbt"):
        single = document(cli, root, "--workers", "1")
        scaled = document(cli, root, "--workers", "2", *SPLIT)
        scale = assert_same_but_scale(scaled, single)
        assert scale["executor"] == "local" and scale["workers"] == 2
        assert scale["split"] and scale["reason"] is None and scale["units"] > 1, root
        if root == trend_runs.diverged:
            first = scaled["findings"][0]
            assert (first["leaf"], first["step"]) == (NAN_LEAF, NAN_STEP)
        if root == wide_run:
            nan = [f for f in scaled["findings"] if f["kind"] == "nonfinite"]
            assert [(f["leaf"], f["step"]) for f in nan] == [(WIDE_LEAF, WIDE_NAN_STEP)]


@pytest.mark.slow
def test_a_dask_cluster_gives_the_single_process_document(
    cli: Any, trend_runs: TrendRuns, wide_run: Path
) -> None:
    pytest.importorskip("distributed")
    with local_cluster() as cluster:
        dask = ("--executor", "dask", "--scheduler", cluster.scheduler_address, *SPLIT)
        for root in (trend_runs.diverged, wide_run):
            single = document(cli, root)
            scale = assert_same_but_scale(document(cli, root, *dask), single)
            assert scale["executor"] == "dask" and scale["workers"] == 2 and scale["units"] > 1
        r = cli("trend", trend_runs.diverged, *dask, "--check")
        assert r.code == 1 and NAN_LEAF in r.stdout
        assert "units on 2 dask workers" in r.stderr


def test_a_split_that_does_not_pay_stays_here_and_says_why(cli: Any, trend_runs: TrendRuns) -> None:
    doc = document(cli, trend_runs.healthy, "--workers", "2")
    assert doc["scale"]["split"] is False and doc["scale"]["units"] == 0
    assert "--force-split" in doc["scale"]["reason"]
    r = cli("trend", trend_runs.healthy, "--workers", "2")
    assert r.code == 0 and "not split:" in r.stderr


@pytest.fixture
def no_scheduler(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    yield


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--workers", "0"], "--workers"),
        (["--workers", "two"], "--workers"),
        (["--executor", "spark"], "use local or dask"),
        (["--scheduler", "tcp://127.0.0.1:1"], "--scheduler applies to --executor dask"),
        (["--executor", "dask"], "DASK_SCHEDULER_ADDRESS"),
        (["--unit-bytes", "lots"], "--unit-bytes"),
    ],
)
def test_bad_scale_flags_are_one_line_and_exit_2(
    cli: Any, trend_runs: TrendRuns, no_scheduler: None, args: list[str], phrase: str
) -> None:
    r = cli("trend", trend_runs.diverged, *args)
    assert r.code == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert phrase in r.stderr and "Traceback" not in r.stderr and len(lines) <= 2, r.stderr
    assert r.stdout == ""
