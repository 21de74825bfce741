"""Checkpoints of Orbax's v1 API (``fixtures/frameworks/orbax_v1/``, written by its own
``make.py`` with orbax-checkpoint 0.12.8): a ``training.Checkpointer`` root kept by LatestN +
BestN on a metric, with root metadata and the ``metrics`` checkpointable, a ``save_pytree`` in
zarr3 without OCDBT, and ``save_checkpointables`` of ``pytree`` beside a ``config`` of strings. Every command on them, and every output loaded back by the v1 loader
(``Checkpointer.load_pytree``, ``load_pytree``) with the values its truth records."""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckpt_cli
from tests.support.paths import REPO

pytestmark = pytest.mark.slow

V1 = REPO / "fixtures" / "frameworks" / "orbax_v1"
TRUTH: dict[str, Any] = json.loads((V1 / "truth.json").read_text())
KEPT = TRUTH["training"]["all_steps"]
LATEST = KEPT[-1]


def _v1() -> Any:
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    try:
        import orbax.checkpoint.v1 as ocp_v1  # type: ignore[import-not-found]
    except ImportError:
        import orbax.checkpoint.experimental.v1 as ocp_v1
    return ocp_v1


def _leaves(tree: Any) -> dict[str, Any]:
    """What the v1 loader returned, as the truth records it (dtype, shape, SHA-256; strings)."""
    import jax

    out: dict[str, Any] = {}
    for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        if isinstance(value, str):
            out[name] = value
            continue
        array = np.asarray(value)
        out[name] = (
            str(array.dtype),
            list(array.shape),
            hashlib.sha256(array.tobytes()).hexdigest(),
        )
    return out


def _truth_leaves(item: dict[str, Any]) -> dict[str, Any]:
    return {
        name: leaf["value"]
        if leaf["kind"] == "string"
        else (leaf["dtype"], leaf["shape"], leaf["sha256"])
        for name, leaf in item.items()
    }


def _load_root(root: Path, step: int) -> tuple[list[int], dict[str, Any], Any]:
    """The kept steps, the leaves of ``step`` and its metrics, by the v1 training.Checkpointer."""
    with _v1().training.Checkpointer(root.absolute()) as ckptr:
        steps = [c.step for c in ckptr.checkpoints]
        return steps, _leaves(ckptr.load_pytree(step)), ckptr.metadata(step).metrics


def _load_pytree(path: Path) -> dict[str, Any]:
    return _leaves(_v1().load_pytree(path.absolute()))


@pytest.fixture
def fixture(tmp_path: Path) -> Path:
    return shutil.copytree(V1, tmp_path / "v1")


def test_the_truth_is_what_the_v1_loader_restores_now(fixture: Path) -> None:
    steps, leaves, metrics = _load_root(fixture / "training", LATEST)
    assert steps == KEPT == [1, 4, 5]  # step 1: the best loss (BestN); 4, 5: the latest two
    assert leaves == _truth_leaves(TRUTH["training"]["steps"][str(LATEST)]["items"]["state"])
    assert metrics == TRUTH["training"]["steps"][str(LATEST)]["metrics"]
    assert _load_pytree(fixture / "pytree_zarr3") == _truth_leaves(
        TRUTH["pytree_zarr3"]["items"]["state"]
    )


def test_ls_shows_the_kept_steps_metrics_and_root_metadata(cli, fixture: Path) -> None:  # type: ignore[no-untyped-def]
    doc = cli("ls", fixture / "training", "--json").json()
    assert [s["step"] for s in doc["steps"]] == KEPT
    assert [s["metrics"] for s in doc["steps"]] == [
        TRUTH["training"]["steps"][str(s)]["metrics"] for s in KEPT
    ]
    assert all(s["items"] == ["state"] for s in doc["steps"])  # metrics: not a state item
    assert doc["root_metadata"]["custom_metadata"] == TRUTH["training"]["root_custom_metadata"]
    single = cli("ls", fixture / "pytree_zarr3", "--json").json()
    assert single["steps"][0]["formats"] == {"state": "plain+zarr3"}


@pytest.mark.parametrize("where", ["training", "pytree_zarr3"])
def test_inspect_shows_every_value_the_v1_loader_restores(fixture: Path, where: str) -> None:
    truth = TRUTH[where]
    item_truth = (
        truth["steps"][str(LATEST)]["items"]["state"]
        if where == "training"
        else truth["items"]["state"]
    )
    item = ckpt_cli.open(fixture / where).item()
    assert item.name == "state"
    got: dict[str, Any] = {}
    for leaf in item.leaves:
        value = item.read(leaf.name)
        if isinstance(value, str):
            got[leaf.name] = value
        else:
            array = np.asarray(value)
            got[leaf.name] = (
                str(array.dtype),
                list(array.shape),
                hashlib.sha256(array.tobytes()).hexdigest(),
            )
    assert got == _truth_leaves(item_truth)


@pytest.mark.parametrize("where", ["training", "pytree_zarr3"])
def test_verify_is_clean_and_a_flipped_byte_after_record_is_caught(
    cli, fixture: Path, where: str
) -> None:  # type: ignore[no-untyped-def]
    path = fixture / where
    for flags in ([], ["--deep"]):
        r = cli("verify", path, *flags, "--json")
        assert r.code == 0 and r.json()["problems"] == [], r.stdout
    assert cli("verify", path, "--record").code == 0
    assert cli("verify", path, "--deep").code == 0
    data = [
        p
        for p in path.rglob("*")
        if p.is_file() and ("/d/" in str(p) or "/c/" in str(p) or p.name == "c")
    ]
    target = max(data, key=lambda p: p.stat().st_size)
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    target.write_bytes(bytes(raw))
    bad = cli("verify", path, "--deep", "--json")
    assert bad.code == 1
    assert any(p["severity"] == "error" for p in bad.json()["problems"])


def test_migrate_cast_loads_in_the_v1_checkpointer(cli, fixture: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "cast.yaml"
    spec.write_text(
        "version: 1\nrules:\n  - op: cast\n    match: 'params\\..*'\n    dtype: bfloat16\n"
    )
    out = tmp_path / "out"
    assert cli("migrate", fixture / "training", out, "--spec", spec).code == 0
    steps, leaves, metrics = _load_root(out, LATEST)
    want = _truth_leaves(TRUTH["training"]["steps"][str(LATEST)]["items"]["state"])
    assert steps == [LATEST] and metrics == TRUTH["training"]["steps"][str(LATEST)]["metrics"]
    for name, value in want.items():
        if name.startswith("params."):
            assert leaves[name][:2] == ("bfloat16", value[1])
        else:
            assert leaves[name] == value, name
    with _v1().training.Checkpointer(out.absolute()) as ckptr:
        assert ckptr.root_metadata().custom_metadata == TRUTH["training"]["root_custom_metadata"]
    source = _load_root(fixture / "training", LATEST)[1]
    for name in ("params.dense.kernel", "params.dense.bias"):  # the cast values, exactly
        with _v1().training.Checkpointer(out.absolute()) as ckptr:
            cast = np.asarray(_flat(ckptr.load_pytree(LATEST))[name])
        with _v1().training.Checkpointer((fixture / "training").absolute()) as ckptr:
            orig = np.asarray(_flat(ckptr.load_pytree(LATEST))[name])
        assert source[name][0] == "float32"
        np.testing.assert_array_equal(cast, orig.astype(cast.dtype))


def _flat(tree: Any) -> dict[str, Any]:
    import jax

    return {
        ".".join(str(getattr(k, "key", k)) for k in path): v
        for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


@pytest.mark.parametrize("where", ["training", "pytree_zarr3"])
def test_reshard_loads_in_the_v1_loader(cli, fixture: Path, tmp_path: Path, where: str) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    assert cli("reshard", fixture / where, out, "--mesh", "data=1").code == 0
    if where == "training":
        steps, leaves, _ = _load_root(out, LATEST)
        assert steps == [LATEST]
        assert leaves == _truth_leaves(TRUTH["training"]["steps"][str(LATEST)]["items"]["state"])
    else:
        assert _load_pytree(out / "0") == _truth_leaves(TRUTH["pytree_zarr3"]["items"]["state"])


def test_cp_keeps_every_step_and_the_root_metadata(cli, fixture: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    assert cli("cp", fixture / "training", out).code == 0
    for step in KEPT:
        steps, leaves, metrics = _load_root(out, step)
        assert steps == KEPT
        assert leaves == _truth_leaves(TRUTH["training"]["steps"][str(step)]["items"]["state"])
        assert metrics == TRUTH["training"]["steps"][str(step)]["metrics"]


@pytest.mark.parametrize("where", ["training", "pytree_zarr3"])
def test_export_import_loads_under_the_checkpointable_name(
    cli, fixture: Path, tmp_path: Path, where: str
) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "drop.yaml"  # a string leaf has no safetensors form
    spec.write_text("version: 1\nrules:\n  - op: drop\n    match: '^note$'\n")
    flags = ["--spec", spec, "--allow-unused"]
    assert cli("export", fixture / where, tmp_path / "st", *flags).code == 0
    back = tmp_path / "back"
    r = cli("import", tmp_path / "st", back, "--step", str(LATEST), "--json")
    assert r.code == 0, r.stderr
    assert r.json()["output"]["item"] == "state"  # the checkpointable the v1 loader asks for
    steps, leaves, _ = _load_root(back, LATEST)
    truth = TRUTH[where]
    item = (
        truth["steps"][str(LATEST)]["items"]["state"]
        if where == "training"
        else truth["items"]["state"]
    )
    want = {k: v for k, v in _truth_leaves(item).items() if k != "note"}
    assert steps == [LATEST] and leaves == want


def test_doctor_like_says_an_output_restores(cli, fixture: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    assert cli("reshard", fixture / "training", out, "--mesh", "data=1").code == 0
    r = cli("doctor", fixture / "training", "--like", out, "--json")
    assert r.code == 0, r.stdout
    assert r.json()["verdict"] == "restores"


def _load_checkpointables(root: Path, step: int) -> dict[str, Any]:
    with _v1().training.Checkpointer(root.absolute()) as ckptr:
        loaded = ckptr.load_checkpointables(step)
    return {name: _leaves(value) for name, value in loaded.items()}


def test_checkpointables_of_strings_only_have_no_false_problem(cli, fixture: Path) -> None:  # type: ignore[no-untyped-def]
    """``save_checkpointables`` with a ``config`` of strings (no OCDBT database) beside
    ``pytree``: inspect picks ``pytree``, verify finds nothing, --record then a flipped byte in
    ``pytree`` is caught."""
    root = fixture / "checkpointables"
    truth = TRUTH["checkpointables"]["steps"]["3"]["items"]
    assert _load_checkpointables(root, 3) == {k: _truth_leaves(v) for k, v in truth.items()}
    doc = cli("inspect", root, "--json").json()
    assert doc["item"] == "pytree" and [o["item"] for o in doc["other_items"]] == ["config"]
    config = cli("inspect", root, "--item", "config", "--json").json()
    assert {leaf["name"]: leaf["value"] for leaf in config["leaves"]} == {
        k: v["value"] for k, v in truth["config"].items()
    }
    for flags in ([], ["--deep"], ["--record"]):
        r = cli("verify", root, *flags, "--json")
        assert r.code == 0 and r.json()["problems"] == [], r.stdout
    data = max((root / "3" / "pytree").rglob("d/*"), key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 1
    data.write_bytes(bytes(raw))
    assert cli("verify", root, "--deep").code == 1


@pytest.mark.parametrize("writer", ["migrate", "reshard", "cp"])
def test_checkpointables_written_whole_load_in_the_v1_checkpointer(
    cli, fixture: Path, tmp_path: Path, writer: str
) -> None:  # type: ignore[no-untyped-def]
    root, out = fixture / "checkpointables", tmp_path / "out"
    spec = tmp_path / "cast.yaml"
    spec.write_text("version: 1\nrules:\n  - op: cast\n    match: '.*\\.w$'\n    dtype: bfloat16\n")
    args = {"migrate": ["--spec", spec], "reshard": ["--mesh", "data=1"], "cp": []}[writer]
    assert cli(writer, root, out, *args).code == 0
    got = _load_checkpointables(out, 3)
    truth = {
        k: _truth_leaves(v) for k, v in TRUTH["checkpointables"]["steps"]["3"]["items"].items()
    }
    assert got["config"] == truth["config"]
    for name, value in truth["pytree"].items():
        if writer == "migrate" and name.endswith(".w"):
            assert got["pytree"][name][:2] == ("bfloat16", value[1])
        else:
            assert got["pytree"][name] == value, name


def test_checkpointables_export_import_under_pytree(cli, fixture: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = fixture / "checkpointables"
    assert cli("export", root, tmp_path / "st").code == 0  # the one tree holding arrays
    back = tmp_path / "back"
    assert cli("import", tmp_path / "st", back, "--step", "3").code == 0
    with _v1().training.Checkpointer(back.absolute()) as ckptr:
        loaded = ckptr.load_pytree(3, checkpointable_name="pytree")
    want = _truth_leaves(TRUTH["checkpointables"]["steps"]["3"]["items"]["pytree"])
    assert _leaves(loaded) == want
