"""``trend`` on a run that diverged (``fixtures/diverged/``: real Orbax saves, every parameter
and Adam moment all-NaN from step 5, the loss NaN at steps 6-8): a statistic of values holding
NaN/Inf is null (its count beside it), never 0; the run's verdict names the first step with
NaN/Inf, the last without and the leaves where it started; the text says ``nan`` and marks the
steps; the page marks them on every curve."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.commands.trend_html import page
from ckpt_cli.commands.trend_text import NONFINITE_MARK, report_lines
from ckpt_cli.core.storage import open_location
from ckpt_cli.core.trend.plan import plan_trend
from ckpt_cli.core.trend.run import trend
from ckpt_cli.core.trend.types import TrendOptions, TrendReport
from tests.support.paths import REPO

DIVERGED = REPO / "fixtures" / "diverged"
TRUTH: dict[str, Any] = json.loads((DIVERGED / "truth.json").read_text())


@pytest.fixture(scope="module")
def report() -> TrendReport:
    return trend(plan_trend(open_location(str(DIVERGED / "linen")), TrendOptions()))


def _strict(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_statistics_of_nan_values_are_null_never_zero(report: TrendReport) -> None:
    doc = _strict(json.dumps(report.to_json()))
    leaves = {lf["name"]: lf for lf in doc["leaves"]}
    kernel = leaves["params.hidden.kernel"]["steps"]
    assert [s["step"] for s in kernel] == list(range(1, 9))
    for s in kernel:
        if s["step"] >= 5:
            assert s["nonfinite"] == 32
            assert s["norm"] is None and s["max_abs"] is None and s["rms"] is None
            assert s["update_norm"] is None and s["update_ratio"] is None
        else:
            assert s["nonfinite"] == 0 and s["norm"] > 0
    assert kernel[3]["update_ratio"] is not None and kernel[3]["update_ratio"] > 0


def test_the_norms_of_finite_steps_are_orbaxs(report: TrendReport) -> None:
    truth = TRUTH["linen"]["steps"]
    leaf = report.leaf("params.hidden.kernel")
    checked = 0
    for s in leaf.steps:
        want = truth[str(s.step)]["items"]["state"]["params.hidden.kernel"]["l2"]
        if want is None:
            assert s.norm is None
        else:
            assert s.norm == pytest.approx(want, rel=1e-9)
            checked += 1
    assert checked == 4


def test_the_verdict_names_the_first_bad_and_last_good_step(report: TrendReport) -> None:
    d = report.divergence
    assert d is not None
    assert (d.first_step, d.last_finite_step) == (
        TRUTH["linen"]["first_nonfinite_step"],
        TRUTH["linen"]["last_finite_step"],
    )
    assert (d.first_step, d.last_finite_step) == (5, 4)
    assert d.steps == (5, 6, 7, 8)
    assert "params.hidden.kernel" in d.leaves and len(d.leaves) == 12
    doc = _strict(json.dumps(report.to_json()))
    assert doc["divergence"]["first_nonfinite_step"] == 5
    assert doc["divergence"]["last_finite_step"] == 4
    metrics = {m["step"]: m for m in doc["metrics"]}
    assert metrics[6]["metrics"]["loss"] is None
    assert metrics[6]["metrics_nonfinite"] == {"loss": "nan"}
    assert metrics[4]["metrics_nonfinite"] == {} and metrics[4]["metrics"]["loss"] > 0


def test_the_text_says_nan_and_marks_the_steps(report: TrendReport) -> None:
    text = "\n".join(report_lines(report, None))
    assert "diverged: NaN/Inf from step 5 on" in text and "last step without: 4" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("hidden.kernel"))
    assert NONFINITE_MARK * 4 in row and row.rstrip().endswith("nan")
    assert " 0\n" not in text + "\n"
    metric = next(line for line in text.splitlines() if line.startswith("metric loss"))
    assert metric.endswith("-> nan") and NONFINITE_MARK * 3 in metric


def test_the_page_marks_nan_steps_on_every_curve(report: TrendReport, tmp_path: Path) -> None:
    html = page(report)
    assert 'id="divergence"' in html
    marks = html.count('class="nonfinite"')
    # 12 leaves x 2 curves x 4 steps, 2 groups x 2 curves x 4 steps, the loss at 3 steps.
    assert marks == 12 * 2 * 4 + 2 * 2 * 4 + 3
    assert "norm 0," not in html and "update ratio 0," not in html
