"""Each wrong answer issue 13 and the matrix found (fixtures/matrix/check_ckpt.py), on a real release's output.

The per-fixture tests (``test_matrix_read.py``, ``test_matrix_write.py``) check every command on
every fixture; these name each wrong answer once, assert the right one and, where a fix could
hide real damage, that the damage is still reported.
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
from ckpt_cli.core.spec.language import parse_spec
from ckpt_cli.core.storage import open_location
from tests.support.cli import run_cli
from tests.support.matrix import MATRIX, Fixture, array_leaves
from tests.support.orbax_restorer import OrbaxRestorer

OLD = ["0.5.20", "0.6.4", "0.9.1", "0.10.3", "0.11.19"]  # _METADATA without use_ocdbt


def fixture(release: str, case: str) -> Fixture:
    f = Fixture(release, case, MATRIX / release / case)
    assert (f.dir / "truth.json").is_file(), f.id
    return f


def _codes(path: Path | str, **kw: Any) -> list[str]:
    return [p.code for p in ckpt_cli.verify(path, deep=True, **kw).problems]


# 1. Orbax 0.4.x steps have no _CHECKPOINT_METADATA -----------------------------------------
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


# 2. OCDBT told from the files where _METADATA has no use_ocdbt ------------------------------
@pytest.mark.parametrize("release", OLD)
def test_ls_tells_ocdbt_from_the_files(release: str) -> None:
    def formats(case: str) -> set[str]:
        steps = ckpt_cli.open(fixture(release, case).path).steps()
        return {fmt for s in steps for fmt in s.formats.values()}

    assert formats("linen_trainstate") == {"ocdbt+zarr2"}
    assert formats("zarr3_ocdbt") == {"ocdbt+zarr3"}
    assert formats("zarr2_plain") == {"plain+zarr2"}
    assert formats("zarr3_plain") == {"plain+zarr3"}


# 3. The msgpack `checkpoint` file of 0.4/0.5 is Orbax's own -------------------------------
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


# 4. ArraySave items ------------------------------------------------------------------------
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


# 5. JsonSave and metrics item directories, by path -----------------------------------------
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


# 6. Dict keys '' / 'trailing/' / '..' ------------------------------------------------------
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


def test_dotdot_key_is_refused_without_ocdbt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = fixture("0.12.8", "odd_keys").path
    for cmd in (["reshard", str(src), str(tmp_path / "r"), "--mesh", "x=1", "--no-ocdbt"],):
        r = run_cli(cmd, capsys)
        assert r.code == 3, r.stderr
        assert "'..'" in r.stderr and "without OCDBT" in r.stderr
    spec = tmp_path / "spec.yaml"
    spec.write_text("rules: [{op: cast, match: 'a\\.b', dtype: float16}]\n")
    r = run_cli(
        ["migrate", str(src), str(tmp_path / "m"), "--spec", str(spec), "--no-ocdbt"], capsys
    )
    assert r.code == 3 and "without OCDBT" in r.stderr
    assert not (tmp_path / "r").exists() and not (tmp_path / "m").exists()
    assert not (tmp_path / ".zarray").exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "spec.yaml"
    ]


@pytest.mark.slow
def test_odd_keys_plain_output_stays_inside_the_item(tmp_path: Path, orbax: OrbaxRestorer) -> None:
    f = fixture("0.12.8", "odd_keys_plain")
    out = tmp_path / "out"
    write = ckpt_cli.WriteOptions(ocdbt=False)
    ckpt_cli.execute(ckpt_cli.plan_reshard(f.path, out, mesh="x=1", write=write))
    item = out / "0" / "default"
    assert (item / ".zarray").is_file() and (item / "trailing" / ".zarray").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    got = {tuple(k for k, _ in x["keypath"]): x["sha256"] for x in orbax.item(item)["leaves"]}
    want = array_leaves(f.truth["steps"]["0"]["items"]["default"])
    assert got == {kp: leaf["sha256"] for kp, leaf in want.items()}


# 7. Zero-size arrays ------------------------------------------------------------------------
@pytest.mark.slow
def test_zero_size_reshard_sharding_the_empty_dimension(
    tmp_path: Path, orbax: OrbaxRestorer
) -> None:
    f = fixture("0.5.20", "zero_size_plain")
    out = tmp_path / "out"
    rules = {"empty_2d": ["data", None], "empty_1d": ["data"], "empty_mid": [None, "data", None]}
    ckpt_cli.execute(ckpt_cli.plan_reshard(f.path, out, mesh="data=2", rules=rules))
    got = {x["keypath"][0][0]: x for x in orbax.item(out / "0" / "default")["leaves"]}
    assert {k: v["shape"] for k, v in got.items()} == {
        "empty_1d": [0],
        "empty_2d": [0, 16],
        "empty_mid": [3, 0, 2],
        "normal": [2, 3],
    }
    assert got["empty_1d"]["sharding"]["spec"] == ["data"]  # a jax.Array; the others are numpy
    assert diff_paths(str(f.path), str(out)).equal


# 8. diff of complex values: see tests/e2e/test_diff_complex.py (two saves by Orbax 0.12.8).


# 9. Typed keys as Orbax restores them -------------------------------------------------------
@pytest.mark.parametrize("release", ["0.11.19", "0.12.8", "v1-0.12.8"])
def test_typed_keys_show_as_keys(release: str) -> None:
    doc = ckpt_cli.open(fixture(release, "prng_keys").path).item().report.to_json()
    leaves = {x["name"]: x for x in doc["leaves"]}
    assert (leaves["typed"]["dtype"], leaves["typed"]["shape"]) == ("key<fry>", [])
    assert leaves["typed"]["key_data"] == {"dtype": "uint32", "shape": [2]}
    assert (leaves["typed_split"]["dtype"], leaves["typed_split"]["shape"]) == ("key<fry>", [3])
    assert (leaves["raw"]["dtype"], leaves["raw"]["key_data"]) == ("uint32", None)


# 10. flax.nnx training states ---------------------------------------------------------------
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


# 11. --item default on a single-item Checkpointer -------------------------------------------
@pytest.mark.parametrize("release", ["0.4.3", "0.5.20", "0.12.8"])
def test_item_default_on_single_checkpointer(
    release: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(fixture(release, "single_checkpointer").path)
    assert run_cli(["inspect", path, "--item", "default", "--json"], capsys).json()["item"] == (
        "default"
    )
    assert run_cli(["diff", path, path, "--item", "default"], capsys).code == 0


# 12. v1 API: no false warnings --------------------------------------------------------------
def test_v1_marker_file_and_per_process_leftovers() -> None:
    single = fixture("v1-0.12.8", "single_pytree_v1").path
    assert (single / "orbax.checkpoint").is_file() and _codes(single) == []
    scalars = fixture("v1-0.12.8", "scalars").path
    db = scalars / "0" / "state" / "ocdbt.process_0" / "d"
    assert len(list(db.iterdir())) > 9  # more data files than its manifest's 9 versions use
    assert _codes(scalars) == []


# 13. reshard moves Adam moments with their parameter ----------------------------------------
@pytest.mark.parametrize("release", ["0.5.20", "0.12.8"])
@pytest.mark.slow
def test_reshard_moments_follow_their_parameter(
    release: str, tmp_path: Path, orbax: OrbaxRestorer
) -> None:
    f = fixture(release, "sharded")
    out = tmp_path / "out"
    plan = ckpt_cli.plan_reshard(
        f.path, out, mesh="data=2,model=2", rules={"params.w": ["model", "data"]}
    )
    follows = {p.leaf.name: p.follows for p in plan.leaves if p.follows}
    assert follows == {"opt_state.mu.w": "params.w", "opt_state.nu.w": "params.w"}
    assert {p["name"]: p["follows"] for p in plan.to_json()["leaves"]}["opt_state.mu.w"] == (
        "params.w"
    )
    ckpt_cli.execute(plan)
    step = str(f.latest()[0])
    got = {
        ".".join(k for k, _ in x["keypath"]): x
        for x in orbax.item(out / step / "default")["leaves"]
    }
    for name in ("params.w", "opt_state.mu.w", "opt_state.nu.w"):
        assert got[name]["sharding"]["spec"] == ["model", "data"], name
    # A rule naming the moments wins over following.
    plan = ckpt_cli.plan_reshard(
        f.path, tmp_path / "o2", mesh="data=2,model=2",
        rules={"params.w": ["model", "data"], "opt_state.*": []},
    )  # fmt: skip
    assert not any(p.follows for p in plan.leaves)


# 14. cast / resize never touch PRNG key data unless named exactly ----------------------------
def _plan(f: Fixture, tmp_path: Path, rules: str) -> Any:
    spec = parse_spec(f"rules: [{rules}]\n".encode(), "spec.yaml")
    return ckpt_cli.plan_migration(f.path, tmp_path / "out", spec, allow_unused=True)


@pytest.mark.parametrize("release", ["0.11.19", "0.12.8"])
def test_cast_skips_key_data(release: str, tmp_path: Path) -> None:
    f = fixture(release, "nnx_model_optimizer")
    plan = _plan(f, tmp_path, "{op: cast, match: 'model\\..*', dtype: bfloat16}")
    skipped = {s.leaf: s.reason for s in plan.skipped}
    keys = {n: r for n, r in skipped.items() if r == "typed PRNG key"}
    assert keys and all(".rngs." in n for n in keys)
    assert all(r in ("typed PRNG key", "nnx RNG stream counter") for r in skipped.values())
    leaves = {leaf.name: leaf for leaf in plan.leaves}
    assert all(leaves[n].expr.dtype == "uint32" and not leaves[n].changed for n in skipped)
    assert leaves["model.linear.kernel.value"].expr.dtype == "bfloat16"
    assert plan.to_json()["skipped"] and not plan.unused_rules
    # Named exactly, key data is cast: the user asked for that very leaf.
    name = next(iter(keys))
    exact = _plan(
        f, tmp_path, "{op: cast, match: '" + name.replace(".", "\\.") + "', dtype: float32}"
    )
    assert not exact.skipped and {x.name: x for x in exact.leaves}[name].expr.dtype == "float32"


def test_resize_and_set_skip_raw_keys(tmp_path: Path) -> None:
    f = fixture("0.12.8", "prng_raw")
    names = [leaf.name for leaf in ckpt_cli.open(f.path).item().leaves if leaf.is_array]
    plan = _plan(f, tmp_path, "{op: resize, match: '.*', shape: [null, 4], init: zeros}")
    assert sorted(s.leaf for s in plan.skipped) == sorted(
        n for n in names if n.split(".")[0] in ("rng", "rngs", "key_batch")
    )
    assert not plan.changed
    plan = _plan(f, tmp_path, "{op: set, match: 'rng', value: 0}")  # exactly: `rng` is set
    assert not plan.skipped and [x.name for x in plan.changed] == ["rng"]


# 15. Multi-item roots -----------------------------------------------------------------------
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
