"""``verify --deep`` splits over workers only when it pays (``split.should_split`` at verify's
read-only rates): a small local checkpoint is checked in one process and the early-started pool
is released at once (its two workers gone before ``verify_path`` returns, no unit run), a forced
split runs units on both workers, and the report is the same either way. Counted, never timed."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.core import executor as ex_mod
from ckpt_cli.core.executor import ExecutorSpec, LocalExecutor, start_early
from ckpt_cli.core.split import (
    LOCAL_RATE,
    OBJECT_STORE_RATE,
    RATE_ENV,
    VERIFY_LOCAL_RATE,
    VERIFY_OBJECT_STORE_RATE,
    single_rate,
)
from ckpt_cli.core.storage import LocalLocation
from ckpt_cli.core.verify.run import verify_path
from ckpt_cli.core.verify.types import VerifyOptions, VerifyReport
from ckpt_cli.errors import UsageError
from tests.support.paths import FIXTURES

SRC = FIXTURES / "seed_mlp"


def _findings(report: VerifyReport) -> dict[str, Any]:
    """The report's document without what depends on how it ran (time, the scale block)."""
    doc: dict[str, Any] = dict(report.to_json())
    for key in ("elapsed_s", "scale"):
        doc.pop(key)
    doc["checked"] = {k: v for k, v in doc["checked"].items() if k != "coverage"}
    return doc


def _verify(path: Path, spec: ExecutorSpec | None) -> VerifyReport:
    return verify_path(LocalLocation(str(path)), VerifyOptions(deep=True), None, spec, 4096)


def test_a_declined_split_releases_the_early_pool_and_reads_in_one_process() -> None:
    spec = ExecutorSpec("local", workers=2)
    start_early(spec)
    pool = ex_mod._STARTED[spec]
    assert isinstance(pool, LocalExecutor)
    workers = list(pool._pool._processes.values())
    assert len(workers) == 2  # both started before the run lists anything
    report = _verify(SRC, spec)
    assert spec not in ex_mod._STARTED and pool._pool is None  # released by the decision
    assert not any(p.is_alive() for p in workers) and not multiprocessing.active_children()
    scale = report.scale
    assert scale is not None and not scale.split and scale.units == 0
    assert scale.executor == "local" and scale.workers == 2
    assert scale.reason is not None and "in one process" in scale.reason
    assert "256.0 MiB/s" in scale.reason and "--force-split" in scale.reason
    assert _findings(report) == _findings(_verify(SRC, None))


def test_a_forced_split_runs_units_on_the_workers_with_the_same_report() -> None:
    spec = ExecutorSpec("local", workers=2, force_split=True)
    start_early(spec)
    report = _verify(SRC, spec)
    scale = report.scale
    assert scale is not None and scale.split and scale.reason is None
    assert scale.workers == 2 and scale.units > 3  # units of 4 KiB over 3 items
    assert not multiprocessing.active_children()
    assert report.ok and _findings(report) == _findings(_verify(SRC, None))


def test_only_a_deep_pass_decides() -> None:
    spec = ExecutorSpec("local", workers=2)
    structure = verify_path(LocalLocation(str(SRC)), VerifyOptions(), None, spec)
    assert structure.scale is None and structure.to_json()["scale"] is None
    assert _verify(SRC, None).scale is None  # not asked to scale out


def test_verify_assumes_its_own_rates_and_the_environment_overrides_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert single_rate(remote=False, reads_only=True) == VERIFY_LOCAL_RATE > LOCAL_RATE
    assert single_rate(remote=True, reads_only=True) == VERIFY_OBJECT_STORE_RATE
    assert VERIFY_OBJECT_STORE_RATE > OBJECT_STORE_RATE
    assert single_rate(remote=True) == OBJECT_STORE_RATE
    monkeypatch.setenv(RATE_ENV, "0.5")
    assert single_rate(remote=False, reads_only=True) == single_rate(remote=True) == 1 << 19
    for bad in ("fast", "0", "-3", "nan", "inf"):
        monkeypatch.setenv(RATE_ENV, bad)
        with pytest.raises(UsageError, match=RATE_ENV):
            single_rate(remote=False)
