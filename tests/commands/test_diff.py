"""``ckpt diff`` through the real entry point: layouts, steps, tolerances, dtype changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts

from tests.support.paths import FIXTURES


def _kernel(root: Path) -> ts.TensorStore:
    return ts.open(
        {"driver": "zarr", "kvstore": f"file://{root}/0/default/params.Dense_0.kernel/"}
    ).result()


def test_same_values_in_other_layouts_are_equal(cli) -> None:  # type: ignore[no-untyped-def]
    # merged OCDBT vs per-process databases; zarr2 vs zarr3 without OCDBT
    for a, b in (("multiprocess", "unmerged_ocdbt"), ("no_ocdbt", "no_ocdbt_zarr3")):
        r = cli("diff", FIXTURES / a, FIXTURES / b, "--json")
        assert r.code == 0, r.stdout
        doc = r.json()
        assert doc["schema_version"] == 5 and doc["equal"] is True
        assert doc["leaves"]
        assert all(leaf["status"] == "equal" for leaf in doc["leaves"])
        assert all(leaf["max_abs_diff"] in (0.0, None) for leaf in doc["leaves"])


def test_two_steps_differ(cli) -> None:  # type: ignore[no-untyped-def]
    root = FIXTURES / "seed_mlp"
    r = cli("diff", f"{root}@400", f"{root}@500", "--json")
    assert r.code == 1
    doc = r.json()
    assert (doc["a"]["step"], doc["b"]["step"]) == (400, 500)
    step = next(leaf for leaf in doc["leaves"] if leaf["name"] == "step")
    assert step["status"] == "different" and step["max_abs_diff"] == 100.0
    flags = cli("diff", root, root, "--step-a", "400", "--step-b", "500", "--json").json()
    assert flags["leaves"] == doc["leaves"]
    assert cli("diff", root, root, "--step", "300").code == 0
    human = cli("diff", f"{root}@400", f"{root}@500")
    assert "DIFFERENT" in human.stdout and "params.Dense_0.kernel" in human.stdout


def test_tolerances(cli, fixture_copy) -> None:  # type: ignore[no-untyped-def]
    a = FIXTURES / "no_ocdbt"
    b = fixture_copy("no_ocdbt")
    kernel = _kernel(b)
    values = kernel.read().result()
    kernel[...] = values + np.float32(1e-4)
    r = cli("diff", a, b, "--json")
    assert r.code == 1
    leaf = next(x for x in r.json()["leaves"] if x["name"] == "params.Dense_0.kernel")
    assert leaf["status"] == "different" and leaf["mismatched"] == values.size
    assert abs(leaf["max_abs_diff"] - 1e-4) < 1e-6
    assert cli("diff", a, b, "--atol", "1e-3").code == 0
    assert cli("diff", a, b, "--rtol", "1e-9").code == 1


def test_leaves_only_on_one_side(cli) -> None:  # type: ignore[no-untyped-def]
    doc = cli("diff", FIXTURES / "no_ocdbt", FIXTURES / "sharded_4x2", "--json").json()
    assert doc["summary"]["only_a"] == 3 and doc["summary"]["only_b"] == 4


def test_dtype_change_needs_compare_cast(cli, fixture_copy) -> None:  # type: ignore[no-untyped-def]
    a = FIXTURES / "no_ocdbt"
    b = fixture_copy("no_ocdbt")
    values = _kernel(b).read().result()
    wide = ts.open(
        {
            "driver": "zarr",
            "kvstore": f"file://{b}/0/default/params.Dense_0.kernel/",
            "metadata": {"shape": list(values.shape), "chunks": [8, 8], "dtype": "<f8"},
        },
        create=True,
        delete_existing=True,
    ).result()
    wide[...] = values.astype(np.float64)
    r = cli("diff", a, b, "--json")
    assert r.code == 1
    leaf = next(x for x in r.json()["leaves"] if x["name"] == "params.Dense_0.kernel")
    assert leaf["status"] == "dtype_changed" and leaf["dtype"] == ["float32", "float64"]
    cast = cli("diff", a, b, "--compare-cast", "--json")
    assert cast.code == 0, cast.stdout


def test_diff_usage_and_missing(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert cli("diff", FIXTURES / "seed_mlp", tmp_path).code == 3
    assert cli("diff", FIXTURES / "seed_mlp", FIXTURES / "seed_mlp", "--atol", "-1").code == 2
    root = FIXTURES / "seed_mlp"
    assert cli("diff", f"{root}@400", root, "--step-a", "300").code == 2


def _reshard(cli, src: Path, dst: Path, mesh: str, *rules: str) -> Path:  # type: ignore[no-untyped-def]
    args = [a for rule in rules for a in ("--rule", rule)]
    r = cli("reshard", src, dst, "--mesh", mesh, *args)
    assert r.code == 0, r.stdout
    return dst


def _sharding_notes(doc: dict[str, Any]) -> dict[str, str]:
    return {x["name"]: x["message"] for x in doc["leaves"] if x["status"] == "sharding_changed"}


def test_structure_reports_a_reshard_for_another_mesh(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # A real 8-device Orbax save on a (data=4, model=2) mesh, resharded to (2,4) and (8,1) with
    # the same specs: every sharded leaf is chunked differently, the replicated one too sits on
    # another mesh; the host scalar has no sharding.
    src = FIXTURES / "sharded_4x2"
    rules = ("params.w=[data, model]", "params.b=[null, model]")
    old = "mesh data=4,model=2 -> "
    expected = {
        "data=2,model=4": {
            "params.b": old + "data=2,model=4; chunks 1x2 of [6,2] -> 1x4 of [6,1]",
            "params.replicated": old + "data=2,model=4",
            "params.w": old + "data=2,model=4; chunks 4x2 of [2,2] -> 2x4 of [4,1]",
        },
        "data=8,model=1": {
            "params.b": old + "data=8,model=1; chunks 1x2 of [6,2] -> 1x1 of [6,4]",
            "params.replicated": old + "data=8,model=1",
            "params.w": old + "data=8,model=1; chunks 4x2 of [2,2] -> 8x1 of [1,4]",
        },
    }
    for mesh, notes in expected.items():
        dst = _reshard(cli, src, tmp_path / mesh, mesh, *rules)
        r = cli("diff", "--structure", src, dst, "--json")
        assert r.code == 1, r.stdout  # --structure: a layout change is a difference
        doc = r.json()
        assert doc["schema_version"] == 5 and doc["equal"] is False
        assert doc["summary"]["sharding_changed"] == 3 and doc["summary"]["equal"] == 1
        assert _sharding_notes(doc) == notes
        text = cli("diff", "--structure", src, dst)
        assert text.code == 1 and "3 sharding changed" in text.stdout
        assert "chunks 4x2 of [2,2]" in text.stdout
        # The values are the same: the value diff's verdict does not change.
        values = cli("diff", src, dst, "--json")
        assert values.code == 0 and values.json()["summary"]["sharding_changed"] == 0


def test_structure_reports_spec_and_chunk_changes_on_one_mesh(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src = FIXTURES / "sharded_4x2"
    dst = _reshard(cli, src, tmp_path / "t", "data=4,model=2", "params.w=[model, data]")
    notes = _sharding_notes(cli("diff", "--structure", src, dst, "--json").json())
    assert (
        notes["params.w"]
        == "spec P(data,model) -> P(model,data); chunks 4x2 of [2,2] -> 2x4 of [4,1]"
    )
    assert (
        notes["params.b"] == "spec P(None,model) -> replicated; chunks 1x2 of [6,2] -> 1x1 of [6,4]"
    )
    assert "params.replicated" not in notes


def test_structure_of_a_step_against_itself_is_equal(cli) -> None:  # type: ignore[no-untyped-def]
    src = FIXTURES / "sharded_4x2"
    r = cli("diff", "--structure", src, src, "--json")
    assert r.code == 0, r.stdout
    doc = r.json()
    assert doc["summary"]["sharding_changed"] == 0 and doc["summary"]["equal"] == 4


# --- a run that diverged: NaN from step 5 on (fixtures/diverged) ---------------------------------

DIVERGED = FIXTURES.parent / "diverged" / "linen"


def _strict_json(text: str) -> Any:
    """The document, parsed as JavaScript's and Go's parsers would: no NaN, no Infinity."""
    import json

    def refuse(token: str) -> None:
        raise AssertionError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def _rows(stdout: str) -> dict[str, str]:
    """The table's rows by leaf name (the first column)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("leaf "))
    return {line.split()[0]: line for line in lines[start + 1 : -1]}


def test_finite_against_nan_says_nan_never_inf(cli) -> None:  # type: ignore[no-untyped-def]
    """Step 4 against step 5: strict JSON; each NaN leaf's largest difference is null with
    ``"nan"`` beside (not ``Infinity`` and a relative 0), and its NaN counted on B's side."""
    r = cli("diff", f"{DIVERGED}@4", f"{DIVERGED}@5", "--json")
    assert r.code == 1, r.stderr
    leaves = {x["name"]: x for x in _strict_json(r.stdout)["leaves"]}
    kernel = leaves["params.hidden.kernel"]
    assert kernel["status"] == "different" and kernel["mismatched"] == 32
    assert (kernel["max_abs_diff"], kernel["max_abs_diff_nonfinite"]) == (None, "nan")
    assert (kernel["max_rel_diff"], kernel["max_rel_diff_nonfinite"]) == (None, "nan")
    assert kernel["nonfinite"]["b"] == {"nan": 32, "inf": 0}
    assert kernel["nonfinite"]["a"] == {"nan": 0, "inf": 0}
    nan_leaves = [x for x in leaves.values() if x["max_abs_diff_nonfinite"] == "nan"]
    assert len(nan_leaves) == 12
    text = cli("diff", f"{DIVERGED}@4", f"{DIVERGED}@5")
    row = _rows(text.stdout)["params.hidden.kernel"].split()
    assert row[4:] == ["NaN", "NaN", "32/32", "32", "NaN", "in", "B"], row
    assert " inf " not in text.stdout.lower()


def test_nan_at_the_same_places_is_shown_not_hidden_as_equal(cli) -> None:  # type: ignore[no-untyped-def]
    """Steps 6 and 7, NaN in the same 12 leaves: those leaves are equal (NaN at the same
    places), listed with their NaN all the same, never as a plain equal with 0.0."""
    r = cli("diff", f"{DIVERGED}@6", f"{DIVERGED}@7", "--json")
    leaves = {x["name"]: x for x in _strict_json(r.stdout)["leaves"]}
    kernel = leaves["params.hidden.kernel"]
    assert kernel["status"] == "equal" and kernel["max_abs_diff"] is None
    assert kernel["nonfinite"] == {
        "a": {"nan": 32, "inf": 0},
        "b": {"nan": 32, "inf": 0},
        "both_nan": 32,
    }
    assert kernel["message"] == "both NaN at the same 32 places"
    text = cli("diff", f"{DIVERGED}@6", f"{DIVERGED}@7").stdout
    rows = _rows(text)
    assert "both NaN at the same 32 places" in rows["params.hidden.kernel"]
    assert sum("both NaN at the same" in row for row in rows.values()) == 12
    assert "NaN in 12 of A's leaves, 12 of B's" in text


def test_the_verdict_counts_the_rows_it_leaves_out(cli) -> None:  # type: ignore[no-untyped-def]
    """The verdict's leaves add up to the table's rows and the equal leaves not shown."""
    text = cli("diff", f"{DIVERGED}@4", f"{DIVERGED}@5").stdout
    verdict = text.splitlines()[-1]
    assert verdict.startswith("DIFFERENT") and "16 leaves: 1 equal, 15 different" in verdict
    assert len(_rows(text)) == 15 and "1 equal leaf not shown (--all)" in verdict
    every = cli("diff", f"{DIVERGED}@4", f"{DIVERGED}@5", "--all").stdout
    assert len(_rows(every)) == 16 and "not shown" not in every
