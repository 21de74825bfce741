"""``ckpt prune`` on real diverged runs (``fixtures/diverged/``, Orbax 0.12.8): steps 1-8 with a
``loss`` metric, every parameter and moment NaN from step 5, the loss NaN (on disk the bare token
``{"loss": NaN}``) from step 6. A NaN loss ranks worst, is shown as ``nan``, a rule that keeps only
NaN steps says so, and ``--keep-last-finite`` keeps the steps before the divergence."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import FIXTURES, REPO

DIVERGED = REPO / "fixtures" / "diverged"
TRUTH: dict[str, Any] = json.loads((DIVERGED / "truth.json").read_text())
RUNS = ["linen", "nnx"]
NAN_LOSS = [6, 7, 8]


def _strict(stdout: str) -> Any:
    """The document, refusing the bare NaN/Infinity tokens Python's json would accept."""

    def refuse(token: str) -> Any:
        raise AssertionError(f"{token} in the JSON document")

    return json.loads(stdout, parse_constant=refuse)


def _steps(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {e["step"]: e for e in [*doc["keep"], *doc["delete"]]}


def _rows(stdout: str) -> dict[int, str]:
    """The plan's table rows by step."""
    rows = [line.split(maxsplit=1) for line in stdout.splitlines()]
    return {int(r[0]): r[1] for r in rows if len(r) == 2 and r[0].isdigit()}


def test_the_fixtures_are_what_the_tests_assume() -> None:
    for run in RUNS:
        steps = TRUTH[run]["steps"]
        assert [s for s in map(int, steps) if steps[str(s)]["metrics"]["loss"] == "nan"] == NAN_LOSS
        assert TRUTH[run]["first_nonfinite_step"] == 5 and TRUTH[run]["orbax_best_step"] == 8
        assert (DIVERGED / run / "6" / "metrics" / "metrics").read_text() == '{"loss": NaN}'


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("mode", ["min", "max"])
def test_keep_best_ranks_a_nan_loss_worst_in_either_mode(cli, run: str, mode: str) -> None:  # type: ignore[no-untyped-def]
    args = ["prune", DIVERGED / run, "--keep-best", "2", "--metric", "loss", "--mode", mode]
    r = cli(*args, "--dry-run", "--json")
    assert r.code == 0, r.stderr
    doc = _strict(r.stdout)
    losses = {int(s): v["metrics"]["loss"] for s, v in TRUTH[run]["steps"].items()}
    finite = sorted((s for s in losses if s not in NAN_LOSS), key=lambda s: losses[s])
    best = finite[:2] if mode == "min" else finite[-2:]
    assert sorted(k["step"] for k in doc["keep"]) == sorted([*best, 8])  # 8: the latest
    assert [k["reasons"] for k in doc["keep"] if k["step"] == 8] == [["latest"]]
    steps = _steps(doc)
    for s in NAN_LOSS:
        assert steps[s]["metric"] == {
            "name": "loss",
            "value": None,
            "value_nonfinite": "nan",
            "rank": None,
        }
        assert steps[s]["metrics_nonfinite"] == {"loss": "nan"}
    assert sorted(steps[s]["metric"]["rank"] for s in finite) == [1, 2, 3, 4, 5]
    assert steps[best[0]]["metric"]["value"] == pytest.approx(losses[best[0]])
    text = cli(*args, "--dry-run")
    rows = _rows(text.stdout)
    assert all(rows[s].split()[-1 if s != 8 else -2] == "nan" for s in NAN_LOSS), text.stdout
    assert "no loss metric" not in text.stdout and "None" not in text.stdout


@pytest.mark.parametrize("run", RUNS)
def test_keep_last_that_keeps_only_nan_steps_warns(cli, run: str) -> None:  # type: ignore[no-untyped-def]
    r = cli("prune", DIVERGED / run, "--keep-last", "2", "--dry-run", "--json")
    assert r.code == 0, r.stderr
    doc = _strict(r.stdout)
    assert [k["step"] for k in doc["keep"]] == [7, 8]
    loss5 = TRUTH[run]["steps"]["5"]["metrics"]["loss"]
    want = (
        "--keep-last 2 keeps only steps whose loss is NaN (7, 8) and deletes every step whose "
        f"metrics are all finite, the newest being 5 (loss {loss5:.4g}): add --keep-last-finite "
        "2 to keep 4 and 5 (a metric is measured before its step's update, so 5 may already "
        "hold NaN values; `ckpt trend` reads them)"
    )
    assert doc["warnings"] == [want]
    assert want in r.stderr
    text = cli("prune", DIVERGED / run, "--keep-last", "2", "--dry-run")
    rows = _rows(text.stdout)
    assert "loss=nan" in rows[7] and "last 2" in rows[7]
    assert "finite" in rows[5] and "delete" in rows[5]
    assert want in text.stderr


@pytest.mark.parametrize("run", RUNS)
def test_keep_last_finite_keeps_the_steps_before_the_nan_loss(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, run: str
) -> None:
    """Judged by the metrics only: step 5 records a finite loss (measured before its update),
    so it counts as finite although its parameters are NaN (``truth.json``); the documented
    limit, and why the warning advises 2."""
    root = shutil.copytree(DIVERGED / run, tmp_path / run)
    plan = _strict(cli("prune", root, "--keep-last-finite", "2", "--dry-run", "--json").stdout)
    assert [(k["step"], k["reasons"]) for k in plan["keep"]] == [
        (4, ["last 2 finite"]),
        (5, ["last 2 finite"]),
        (8, ["latest"]),
    ]
    assert plan["warnings"] == [] and plan["policy"]["keep_last_finite"] == 2
    assert _steps(plan)[5]["metrics_nonfinite"] == {}  # the metrics say finite...
    assert TRUTH[run]["first_nonfinite_step"] == 5  # ...the values say otherwise
    r = cli("prune", root, "--keep-last-finite", "2", "--yes", "--json")
    assert r.code == 0, r.stderr
    assert sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) == [4, 5, 8]
    assert _strict(r.stdout)["outcome"]["deleted"] == ["1", "2", "3", "6", "7"]


@pytest.mark.parametrize("run", RUNS)
def test_the_fix_the_warning_names_silences_it(cli, run: str) -> None:  # type: ignore[no-untyped-def]
    args = ["prune", DIVERGED / run, "--keep-last", "2", "--keep-last-finite", "2"]
    r = cli(*args, "--dry-run", "--json")
    doc = _strict(r.stdout)
    assert [k["step"] for k in doc["keep"]] == [4, 5, 7, 8]
    assert doc["warnings"] == [] and "warning" not in r.stderr


def test_keep_last_finite_short_of_finite_steps_warns(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("prune", DIVERGED / "linen", "--keep-last-finite", "9", "--dry-run", "--json")
    doc = _strict(r.stdout)
    assert [k["step"] for k in doc["keep"]] == [1, 2, 3, 4, 5, 8]
    assert doc["warnings"] == [
        "--keep-last-finite 9 keeps 5: only steps 1, 2, 3, 4, 5 record metrics that are all finite"
    ]


def test_keep_last_finite_without_any_metric_is_refused(cli) -> None:  # type: ignore[no-untyped-def]
    root = FIXTURES / "seed_mlp"  # real Orbax steps saved without metrics
    r = cli("prune", root, "--keep-last-finite", "1", "--dry-run")
    assert r.code == 2
    assert "--keep-last-finite judges steps by their metrics" in r.stderr
    assert f"ckpt trend {root}" in r.stderr
