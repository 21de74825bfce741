"""``ckpt diff`` through the real entry point: layouts, steps, tolerances, dtype changes."""

from __future__ import annotations

from pathlib import Path

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
        assert doc["schema_version"] == 2 and doc["equal"] is True
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
