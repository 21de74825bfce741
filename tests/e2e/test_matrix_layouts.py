"""What each Orbax release's layouts read as, one way of saving at a time, on the fixtures that
release wrote (``fixtures/matrix/``): steps without ``_CHECKPOINT_METADATA`` (0.4), OCDBT told
from the files, the legacy msgpack file, ArraySave and JSON items, odd dict keys, typed PRNG
keys, nnx training states, single-item and multi-item roots, v1 leftovers, root metadata.

The per-fixture tests (``test_matrix_read.py``, ``test_matrix_write.py``) check every command on
every fixture; these name each of these layouts once, assert the right answer and, where reading
it leniently could hide real damage, that the damage is still reported.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import ckpt_cli
from ckpt_cli.core.diff.items import diff_paths
from ckpt_cli.core.listing import list_root
from ckpt_cli.core.storage import open_location
from tests.support.cli import run_cli
from tests.support.matrix import Fixture, fixture

OLD = ["0.5.20", "0.6.4", "0.9.1", "0.10.3", "0.11.19"]  # _METADATA without use_ocdbt


def _codes(path: Path | str, **kw: Any) -> list[str]:
    return [p.code for p in ckpt_cli.verify(path, deep=True, **kw).problems]


# Orbax 0.4.x steps have no _CHECKPOINT_METADATA -----------------------------------------
def test_04_steps_are_listed_next_to_their_unfinished_neighbour() -> None:
    f = fixture("0.4.3", "unfinished")
    listing = list_root(open_location(str(f.path)))
    assert [(s.step, s.status) for s in listing.steps] == [
        (1, "committed"),
        (2, "committed"),
        (3, "incomplete"),
    ]
    assert listing.ignored == () and f.truth["all_steps"] == [1, 2]
    assert ckpt_cli.open(f.path).item(step=1).step == 1
    assert _codes(f.path) == []


def test_04_root_of_steps_0_and_10() -> None:
    f = fixture("0.4.3", "fixed_length")
    assert [s.name for s in ckpt_cli.open(f.path).steps()] == ["00000000", "00000010"]
    assert f.truth["all_steps"] == [0, 10]


def test_a_step_of_05_and_later_still_misses_its_metadata(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(fixture("0.5.20", "retention").path, root)
    (root / "9" / "_CHECKPOINT_METADATA").unlink()
    assert _codes(root, step=9) == ["step-metadata-missing"]


# OCDBT told from the files where _METADATA has no use_ocdbt ------------------------------
@pytest.mark.parametrize("release", OLD)
def test_ls_tells_ocdbt_from_the_files(release: str) -> None:
    def formats(case: str) -> set[str]:
        steps = ckpt_cli.open(fixture(release, case).path).steps()
        return {fmt for s in steps for fmt in s.formats.values()}

    assert formats("linen_trainstate") == {"ocdbt+zarr2"}
    assert formats("zarr3_ocdbt") == {"ocdbt+zarr3"}
    assert formats("zarr2_plain") == {"plain+zarr2"}
    assert formats("zarr3_plain") == {"plain+zarr3"}


# The msgpack `checkpoint` file of 0.4/0.5 is Orbax's own -------------------------------
def test_legacy_msgpack_file_is_no_unknown_file(tmp_path: Path) -> None:
    for release in ("0.4.3", "0.5.20"):
        f = fixture(release, "linen_trainstate")
        assert (f.path / "3" / "default" / "checkpoint").is_file()
        assert _codes(f.path) == []
    # ... while a file of that name in a 0.12 item, which records use_ocdbt, is foreign.
    root = tmp_path / "ckpt"
    shutil.copytree(fixture("0.12.8", "linen_trainstate").path, root)
    (root / "3" / "default" / "checkpoint").write_bytes(b"stray")
    assert _codes(root, step=3) == ["unknown-file"]


# ArraySave items ------------------------------------------------------------------------
@pytest.mark.parametrize("release", ["0.4.3", "0.5.20", "0.11.19", "0.12.8"])
def test_arraysave_item_is_one_array(release: str, capsys: pytest.CaptureFixture[str]) -> None:
    f = fixture(release, "composite")
    item = ckpt_cli.open(f.path).item(step=1, item="arr")
    doc = item.report.to_json()
    assert doc["kind"] == "array"
    assert [(x["keypath"], x["dtype"], x["shape"]) for x in doc["leaves"]] == [
        ([], "float32", [3, 2])
    ]
    want = f.truth["steps"]["1"]["items"]["arr"]["leaves"][0]["values"]
    assert item.read("checkpoint").reshape(-1).tolist() == pytest.approx(want)
    assert _codes(f.path) == []
    report = diff_paths(str(f.path), str(f.path), step_a=1, step_b=2, item="arr")
    assert [d.status for d in report.leaves] == ["different"]
    r = run_cli(["inspect", str(f.path / "1" / "arr")], capsys)
    assert r.code == 0 and "one array (ArraySave)" in r.stdout


# JsonSave and metrics item directories, by path -----------------------------------------
@pytest.mark.parametrize(
    ("release", "case", "rel", "item"),
    [
        ("0.12.8", "composite", "1/meta", "meta"),
        ("0.5.20", "composite", "1/meta", "meta"),
        ("0.5.20", "retention_best", "2/metrics", "metrics"),
        ("0.12.8", "retention_best", "2/metrics", "metrics"),
    ],
)
def test_json_item_by_path(release: str, case: str, rel: str, item: str) -> None:
    f = fixture(release, case)
    step = rel.split("/")[0]
    got = ckpt_cli.open(f.path / rel).item().read_tree()
    assert got == f.truth["steps"][step]["items"][item]["value"]


# Dict keys '' / 'trailing/' / '..' ------------------------------------------------------
@pytest.mark.parametrize(
    ("release", "case"),
    [("0.4.3", "odd_keys"), ("0.12.8", "odd_keys"), ("v1-0.12.8", "odd_keys")]
    + [(r, "odd_keys_plain") for r in ["0.4.3", "0.9.1", "0.12.8"]],
)
def test_odd_keys_read_verify_diff(release: str, case: str) -> None:
    f = fixture(release, case)
    leaves = {leaf.keypath: leaf for leaf in ckpt_cli.open(f.path).item().leaves}
    for kp in [("",), ("trailing/",), ("nest", "", "")]:
        assert (leaves[kp].dtype, leaves[kp].shape, leaves[kp].problem) == ("float32", (2,), None)
    assert _codes(f.path) == []
    assert diff_paths(str(f.path), str(f.path)).equal


# Typed keys as Orbax restores them -------------------------------------------------------
@pytest.mark.parametrize("release", ["0.11.19", "0.12.8", "v1-0.12.8"])
def test_typed_keys_show_as_keys(release: str) -> None:
    doc = ckpt_cli.open(fixture(release, "prng_keys").path).item().report.to_json()
    leaves = {x["name"]: x for x in doc["leaves"]}
    assert (leaves["typed"]["dtype"], leaves["typed"]["shape"]) == ("key<fry>", [])
    assert leaves["typed"]["key_data"] == {"dtype": "uint32", "shape": [2]}
    assert (leaves["typed_split"]["dtype"], leaves["typed_split"]["shape"]) == ("key<fry>", [3])
    assert (leaves["raw"]["dtype"], leaves["raw"]["key_data"]) == ("uint32", None)


# flax.nnx training states ---------------------------------------------------------------
def _parts(f: Fixture) -> dict[str, dict[str, Any]]:
    doc = ckpt_cli.open(f.path).item().report.to_json()
    return {p["part"]: p for p in doc["training_state"]["parts"]}


@pytest.mark.parametrize("release", ["0.5.20", "0.9.1", "0.12.8"])
def test_nnx_split_state_holds_parameters(release: str) -> None:
    parts = _parts(fixture(release, "nnx_split"))
    assert parts["params"]["present"] and parts["params"]["leaves"] >= 2
    assert parts["params"]["subtrees"] == ["linear1", "linear2"]


@pytest.mark.parametrize("release", ["0.11.19", "0.12.8", "v1-0.12.8"])
def test_nnx_model_optimizer_is_complete(release: str) -> None:
    parts = _parts(fixture(release, "nnx_model_optimizer"))
    assert all(p["present"] for p in parts.values() if p["part"] != "data_order"), parts
    assert parts["step"]["note"].startswith("optimizer.step.value = 2")
    assert "key<fry>" in parts["rng"]["note"]
    assert parts["params"]["subtrees"] == ["model"]


# --item default on a single-item Checkpointer -------------------------------------------
@pytest.mark.parametrize("release", ["0.4.3", "0.5.20", "0.12.8"])
def test_item_default_on_single_checkpointer(
    release: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(fixture(release, "single_checkpointer").path)
    assert run_cli(["inspect", path, "--item", "default", "--json"], capsys).json()["item"] == (
        "default"
    )
    assert run_cli(["diff", path, path, "--item", "default"], capsys).code == 0


# v1 API: no false warnings --------------------------------------------------------------
def test_v1_marker_file_and_per_process_leftovers() -> None:
    single = fixture("v1-0.12.8", "single_pytree_v1").path
    assert (single / "orbax.checkpoint").is_file() and _codes(single) == []
    scalars = fixture("v1-0.12.8", "scalars").path
    db = scalars / "0" / "state" / "ocdbt.process_0" / "d"
    assert len(list(db.iterdir())) > 9  # more data files than its manifest's 9 versions use
    assert _codes(scalars) == []


# Multi-item roots -----------------------------------------------------------------------
@pytest.mark.parametrize("release", ["0.4.3", "0.12.8"])
def test_composite_root(release: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(fixture(release, "composite").path)
    r = run_cli(["inspect", path, "--json"], capsys)
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["item"] == "state"
    assert [(o["item"], o["kind"]) for o in doc["other_items"]] == [
        ("arr", "array"),
        ("meta", "json"),
    ]
    r = run_cli(["diff", f"{path}@1:arr", f"{path}@2:arr", "--json"], capsys)
    assert r.code == 1 and r.json()["a"]["item"] == "arr" and r.json()["b"]["item"] == "arr"
    r = run_cli(["diff", path, path, "--item-a", "meta", "--item-b", "meta"], capsys)
    assert r.code == 0
    r = run_cli(["reshard", path, str(tmp_path / "a"), "--mesh", "x=1"], capsys)
    assert r.code == 0, r.stderr
    r = run_cli(
        ["reshard", path, str(tmp_path / "b"), "--like", str(tmp_path / "a"), "-i", "state"], capsys
    )
    assert r.code == 0, r.stderr
    assert json.loads((tmp_path / "b" / "2" / "_CHECKPOINT_METADATA").read_text())["item_handlers"][
        "arr"
    ].endswith("ArrayCheckpointHandler")


@pytest.mark.parametrize("release", ["0.4.3", "0.5.20", "0.9.1", "0.11.19", "0.12.8"])
def test_root_metadata_of_every_era(release: str) -> None:
    listing = list_root(open_location(str(fixture(release, "composite").path)))
    assert listing.root_metadata is not None
    assert listing.root_metadata["custom_metadata"] == {"experiment": "composite"}
