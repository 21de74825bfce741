"""``ckpt trend`` through the real entry point on real training runs: the JSON document, the
text view (findings first, sparklines, 80 columns), ``--check`` and bad input."""

from __future__ import annotations

import json
import math
import shutil
from html.parser import HTMLParser

import pytest

from ckpt_cli.commands.trend_text import common_prefix, group_series, report_lines, sparkline
from ckpt_cli.core.trend.plan import plan_trend
from ckpt_cli.core.trend.run import trend
from ckpt_cli.core.trend.types import TrendOptions, TrendReport
from tests.support.paths import FIXTURES
from tests.support.trend_runs import NAN_LEAF, NAN_STEP, STEPS, TrendRuns

STEP_KEYS = {
    "step", "norm", "rms", "max_abs", "mean", "zeros", "nonfinite", "update_norm", "update_ratio",
    "dead_units", "new_dead_units",
}  # fmt: skip


def test_json_is_the_documented_shape(cli, trend_runs: TrendRuns) -> None:  # type: ignore[no-untyped-def]
    r = cli("trend", trend_runs.diverged, "--json")
    assert r.code == 0, r.stderr  # without --check, findings do not fail the command
    doc = r.json()
    assert doc["schema_version"] == TrendReport.SCHEMA_VERSION == 4
    assert set(doc) == {
        "schema_version", "root", "item", "steps", "leaves", "metrics", "findings",
        "divergence", "thresholds", "skipped_reads", "scale", "ok",
    }  # fmt: skip
    assert doc["scale"] is None  # not asked to scale out
    assert doc["steps"] == list(range(1, STEPS + 1)) and doc["item"] == "default"
    assert doc["leaves"]
    for leaf in doc["leaves"]:
        assert set(leaf) == {"name", "part", "dtype", "shape", "steps"}
        assert leaf["steps"] and all(set(s) == STEP_KEYS for s in leaf["steps"])
    first = doc["findings"][0]
    assert first == {
        "kind": "nonfinite",
        "severity": "error",
        "leaf": NAN_LEAF,
        "step": NAN_STEP,
        "message": "1 NaN/Inf value(s) at step 5, the first listed step with any",
    }
    assert doc["ok"] is False
    assert doc["thresholds"] == {
        "explode": 10.0, "vanish": 10.0, "norm_jump": 4.0, "dead_units": 1,
    }  # fmt: skip
    # NaN: null, and which it was beside it
    assert doc["metrics"][-1] == {
        "step": STEPS,
        "metrics": {"loss": None},
        "metrics_nonfinite": {"loss": "nan"},
    }
    json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_check_exits_1_on_nan_and_0_on_a_healthy_run(cli, trend_runs: TrendRuns) -> None:  # type: ignore[no-untyped-def]
    bad = cli("trend", trend_runs.diverged, "--check")
    assert bad.code == 1
    assert bad.stdout.splitlines()[2].startswith(f"  error nonfinite {NAN_LEAF} @ {NAN_STEP}")
    good = cli("trend", trend_runs.healthy, "--check")
    assert good.code == 0, good.stderr
    assert "findings: 0 errors, 6 warnings" in good.stdout
    # Before the NaN, the same run is healthy.
    assert cli("trend", trend_runs.diverged, "--check", "--steps", f"-{NAN_STEP - 1}").code == 0
    j = cli("trend", trend_runs.diverged, "--check", "--json")
    assert j.code == 1 and j.json()["ok"] is False
    assert "--check: 9 error-level finding(s)" in j.stderr


def test_text_puts_findings_first_then_a_table_per_part(cli, trend_runs: TrendRuns) -> None:  # type: ignore[no-untyped-def]
    r = cli("trend", trend_runs.healthy)
    assert r.code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"trend {trend_runs.healthy} (item default): 6 steps 1-6, 13 leaves")
    assert lines[1] == "findings: 0 errors, 6 warnings"
    assert lines[2].startswith("  warning zero opt_state.")
    metric = next(line for line in lines if line.startswith("metric loss: "))
    # The loss falls at every step: from the top bar to the bottom one.
    assert metric.startswith("metric loss: █") and metric.split()[2].endswith("▁")
    assert metric.endswith(f"{trend_runs.losses[1]:.4g} -> {trend_runs.losses[STEPS]:.4g}")
    assert "parameters (5 leaves, under params.)" in lines
    assert "optimizer state (7 leaves, under opt_state.inner_states.train.inner_state.0.)" in lines
    row = next(line for line in lines if line.lstrip().startswith("Dense_1.kernel "))
    assert "▁▁▁▁▁▁" in row and row.rstrip().endswith(" 0")  # frozen: flat norm, ratio 0


def test_the_text_fits_80_columns(trend_runs: TrendRuns) -> None:
    lines = report_lines(trend(plan_trend(trend_runs.diverged)), 80)
    assert len(lines) > 20
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)


def test_sparklines_and_prefixes() -> None:
    assert sparkline([1.0, 2.0, 3.0, None]) == "▁▅█·"
    assert sparkline([2.0, 2.0]) == "▁▁" and sparkline([None]) == "·"
    assert len(sparkline([float(i) for i in range(100)])) == 16
    assert common_prefix(["a.b.c", "a.b.d.e"]) == "a.b."
    assert common_prefix(["a.b", "a.c"]) == "a." and common_prefix(["x.y"]) == ""
    assert common_prefix(["a.b", "a.b.c"]) == "a."  # every name keeps its last part


def test_filter_item_and_a_fixture_release(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli(
        "trend", FIXTURES / "seed_mlp", "--filter", "params.*kernel", "--item", "default", "--json"
    )
    assert r.code == 0, r.stderr
    doc = r.json()
    assert [lf["name"] for lf in doc["leaves"]] == [
        "params.Dense_0.kernel",
        "params.Dense_1.kernel",
    ]
    assert doc["steps"] == [300, 400, 500]


@pytest.mark.parametrize(
    ("args", "code", "phrase"),
    [
        (["--steps", "x"], 2, "--steps 'x' is not a list of steps"),
        (["--steps", "99"], 3, "step 99 is not a committed step"),
        (["--filter", "("], 2, "--filter '(' is not a valid pattern"),
        (["--filter", "nothing"], 3, "no leaf of"),
        (["--match", "nothing"], 3, "no leaf of"),  # --filter's old name, hidden
        (["--explode", "0.5"], 2, "--explode"),
        (["--dead-units", "0"], 2, "--dead-units"),
        (["--group", "layer"], 2, "--group 'layer' is not a grouping"),
        (["--group", "depth:0"], 2, "--group 'depth:0' is not a grouping"),
    ],
)
def test_bad_input_is_one_line_and_its_exit_code(  # type: ignore[no-untyped-def]
    cli, trend_runs: TrendRuns, args: list[str], code: int, phrase: str
) -> None:
    r = cli("trend", trend_runs.healthy, *args)
    assert r.code == code, r.stderr
    assert phrase in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_no_such_root(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = cli("trend", tmp_path / "nope")
    assert r.code == 3 and "does not exist" in r.stderr and "Traceback" not in r.stderr


class _Page(HTMLParser):
    """What the page holds: tags, ids, links, text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.urls: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for key, value in attrs:
            if key == "id" and value:
                self.ids.add(value)
            if key == "href" and value:
                self.links.append(value)
            if key in ("src", "href") and value and "://" in value:
                self.urls.append(value)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_html_is_one_self_contained_page(cli, trend_runs: TrendRuns, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "trend.html"
    r = cli("trend", trend_runs.diverged, "--html", out, "--check")
    assert r.code == 1  # --check still decides the exit code
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trend.html"]  # no temporary left
    page = _Page()
    page.feed(out.read_text())
    text = "".join(page.text)
    doc = cli("trend", trend_runs.diverged, "--json").json()
    names = [lf["name"] for lf in doc["leaves"]]
    assert names and all(name in text for name in names)
    assert "script" not in page.tags and not page.urls  # nothing to fetch, nothing to run
    # One chart per metric, two per group (parameters, optimizer state, the rest) and per leaf,
    # and the heat map with a cell per leaf and step.
    assert page.tags.count("svg") == 1 + 2 * 3 + 2 * len(names) + 1
    cells = sum(len(lf["steps"]) for lf in doc["leaves"])
    assert page.tags.count("rect") == cells
    # Every finding links to its leaf's row.
    anchors = [link[1:] for link in page.links if link.startswith("#")]
    assert anchors and set(anchors) <= page.ids
    assert f"{NAN_LEAF} @ {NAN_STEP}" in text.replace("  ", " ")


def test_html_to_a_missing_directory_is_one_line(cli, trend_runs: TrendRuns, tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = cli("trend", trend_runs.healthy, "--html", tmp_path / "no" / "page.html")
    assert r.code == 3 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 2
    assert not (tmp_path / "no").exists()


def test_group_by_module_and_by_depth(cli, trend_runs: TrendRuns) -> None:  # type: ignore[no-untyped-def]
    def titles(*args: str) -> list[str]:
        r = cli("trend", trend_runs.healthy, *args)
        assert r.code == 0, r.stderr
        lines = r.stdout.splitlines()
        return [lines[i + 1] for i, line in enumerate(lines[:-1]) if line == ""]

    assert titles("--group", "module") == [
        "params.Dense_0 (2 leaves)",
        "params.Dense_1 (2 leaves)",
        "params (1 leaf)",
        "opt_state.inner_states.train.inner_state.0 (1 leaf)",
        "opt_state.inner_states.train.inner_state.0.mu.Dense_0 (2 leaves)",
        "opt_state.inner_states.train.inner_state.0.mu (1 leaf)",
        "opt_state.inner_states.train.inner_state.0.nu.Dense_0 (2 leaves)",
        "opt_state.inner_states.train.inner_state.0.nu (1 leaf)",
        "(top level) (1 leaf)",
    ]
    assert titles("--group", "depth") == [
        "params.Dense_0 (2 leaves)",
        "params.Dense_1 (2 leaves)",
        "params (1 leaf)",
        "opt_state.inner_states (7 leaves, under opt_state.inner_states.train.inner_state.0.)",
        "(top level) (1 leaf)",
    ]
    assert titles("--group", "depth:1") == [
        "params (5 leaves)",
        "opt_state (7 leaves, under opt_state.inner_states.train.inner_state.0.)",
        "(top level) (1 leaf)",
    ]
    assert titles() == titles("--group", "part")
    # Rows leave the group's name out; the JSON does not change with the grouping.
    r = cli("trend", trend_runs.healthy, "--group", "module")
    assert any(line.lstrip().startswith("kernel ") for line in r.stdout.splitlines())
    doc = cli("trend", trend_runs.healthy, "--json", "--group", "module").json()
    assert doc == cli("trend", trend_runs.healthy, "--json").json()


def test_group_series_is_the_norm_of_the_group_as_one_vector(trend_runs: TrendRuns) -> None:
    report = trend(plan_trend(trend_runs.healthy, TrendOptions(match="params.Dense_0.*")))
    leaves = list(report.leaves)
    assert len(leaves) == 2
    norms, ratios = group_series(report.steps, leaves)
    for i, step in enumerate(report.steps):
        rows = [next(s for s in lf.steps if s.step == step) for lf in leaves]
        assert norms[i] == pytest.approx(math.sqrt(sum(s.norm**2 for s in rows)), rel=1e-12)
    assert ratios[0] is None
    prev = [lf.steps[0] for lf in leaves]
    cur = [lf.steps[1] for lf in leaves]
    want = math.sqrt(sum(s.update_norm**2 for s in cur) / sum(s.norm**2 for s in prev))  # type: ignore[operator]
    assert ratios[1] == pytest.approx(want, rel=1e-12)


def test_read_all_reads_what_the_records_would_skip(cli, trend_runs: TrendRuns, tmp_path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "run"
    shutil.copytree(trend_runs.healthy, root)
    before = cli("trend", root, "--json").json()
    assert before["skipped_reads"] == 0  # no record yet
    assert cli("verify", root, "--record").code == 0
    r = cli("trend", root)
    assert r.code == 0, r.stderr
    assert "25 leaf reads skipped (recorded digests unchanged)" in r.stdout.splitlines()[0]
    skipped = cli("trend", root, "--json").json()
    everything = cli("trend", root, "--json", "--read-all").json()
    assert skipped["skipped_reads"] == 25 and everything["skipped_reads"] == 0
    assert skipped["leaves"] == everything["leaves"] == before["leaves"]
