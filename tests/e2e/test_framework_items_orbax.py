"""Items frameworks save beside their state, written by the installed Orbax
(``tests/support/framework_items.py``): a tree of one string without a database (Keras's
``model_config``), Python scalars, an empty item of a no-op handler (Kauldron's ``ds_iter``), an
item of a handler ckpt does not know, a JSON item. Every command takes the step whole: no false
problem, every writer exits 0, and Orbax restores each output by the recorded handlers."""

from __future__ import annotations

import filecmp
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.support import framework_items as fi

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fi.save_run(tmp_path_factory.mktemp("framework") / "run")


def _same_bytes(a: Path, b: Path) -> bool:
    """Whether two item directories hold the same files with the same bytes."""
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    return not mismatch and not errors and all(_same_bytes(a / d, b / d) for d in cmp.common_dirs)


def _check_restores(out: Path, step: int, cast: bool = False) -> None:
    """Orbax restores every item of ``out``; the carried ones are the source's, byte for byte."""
    got = fi.restore_step(out, step)
    want = fi.state_of(step)
    for name, value in want.items():
        restored = np.asarray(got["state"][name])
        assert str(restored.dtype) == ("bfloat16" if cast else "float32")
        np.testing.assert_array_equal(restored.astype(np.float32), value)
    assert got["model_config"] == {"config": fi.CONFIG}
    assert got["counters"]["epoch"] == step
    assert got["ds_iter"] == "restored-by-noop"
    assert got["blob"] == fi.BLOB
    assert got["extra"] == {"epoch": step}


def test_ls_lists_every_item(cli, run: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("ls", run, "--json")
    assert r.code == 0, r.stderr
    items = r.json()["steps"][-1]["items"]
    assert {"blob", "counters", "ds_iter", "extra", "model_config", "state"} <= set(items)


def test_inspect_names_empty_and_unknown_items_with_their_handlers(cli, run: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", run, "--json")
    assert r.code == 0, r.stderr
    by_name = {d["item"]: d for d in r.json()["items"]}
    assert by_name["ds_iter"]["kind"] == "empty"
    assert by_name["ds_iter"]["handler"].endswith("framework_items.NoopHandler")
    assert by_name["blob"]["kind"] == "unknown" and by_name["blob"]["leaves"] == []
    assert "BlobHandler" in by_name["blob"]["note"]
    config = cli("inspect", run, "--item", "model_config", "--json").json()
    assert [leaf["value"] for leaf in config["leaves"]] == [fi.CONFIG]
    text = cli("inspect", run, "--item", "ds_iter")
    assert text.code == 0, text.stderr
    assert "empty item" in text.stdout and "NoopHandler" in text.stdout


@pytest.mark.parametrize("deep", [False, True])
def test_verify_finds_no_problem_and_notes_what_it_does_not_read(
    cli, run: Path, deep: bool
) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", run, *(["--deep"] if deep else []), "--json")
    assert r.code == 0, r.stdout
    doc = r.json()
    assert doc["problems"] == []
    notes = {(n["item"], n["kind"]) for n in doc["notes"]}
    assert notes == {
        (f"{s}/{n}", k) for s in fi.STEPS for n, k in (("ds_iter", "empty"), ("blob", "unknown"))
    }


def test_verify_record_then_a_flipped_byte_is_caught(cli, run: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    copy = shutil.copytree(run, tmp_path / "run")
    assert cli("verify", copy, "--record").code == 0
    assert not (copy / "2" / "ds_iter" / "_CKPT_DIGESTS.json").exists()  # carried as it is
    assert not (copy / "2" / "blob" / "_CKPT_DIGESTS.json").exists()
    clean = cli("verify", copy, "--deep", "--json")
    assert clean.code == 0 and clean.json()["problems"] == [], clean.stdout
    strings = copy / "2" / "model_config" / "_strings.json"
    strings.write_bytes(strings.read_bytes().replace(b"relu", b"gelu"))
    data = max((copy / "1" / "state").rglob("d/*"), key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 1
    data.write_bytes(bytes(raw))
    bad = cli("verify", copy, "--deep", "--json")
    assert bad.code == 1
    files = {p["file"] for p in bad.json()["problems"] if p["severity"] == "error"}
    assert "2/model_config/_strings.json" in files
    assert any(f.startswith("1/state/") for f in files)


def test_migrate_of_the_whole_step_restores(cli, run: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "cast.yaml"
    spec.write_text(
        "version: 1\nrules:\n  - op: cast\n    match: 'state\\..*|^[wb]$'\n    dtype: bfloat16\n"
    )
    out = tmp_path / "out"
    r = cli("migrate", run, out, "--spec", spec, "--allow-unused")
    assert r.code == 0, r.stderr
    _check_restores(out, 2, cast=True)
    assert _same_bytes(run / "2" / "blob", out / "2" / "blob")
    assert _same_bytes(run / "2" / "ds_iter", out / "2" / "ds_iter")
    assert cli("verify", out, "--deep").code == 0


def test_reshard_of_the_whole_step_restores(cli, run: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    r = cli("reshard", run, out, "--mesh", "data=1")
    assert r.code == 0, r.stderr
    _check_restores(out, 2)
    handlers = json.loads((out / "2" / "_CHECKPOINT_METADATA").read_text())["item_handlers"]
    source = json.loads((run / "2" / "_CHECKPOINT_METADATA").read_text())["item_handlers"]
    assert handlers == source  # every item keeps its handler, PyTreeCheckpointHandler included
    assert cli("verify", out, "--deep").code == 0


def test_cp_carries_every_item_byte_for_byte(cli, run: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bare = shutil.copytree(run, tmp_path / "bare")
    for marker in bare.glob("*/ds_iter/commit_success.txt"):
        marker.unlink()  # an item directory left empty, as Kauldron's is
    out = tmp_path / "out"
    assert cli("cp", bare, out).code == 0
    for step in fi.STEPS:
        assert (out / str(step) / "ds_iter").is_dir()
        assert _same_bytes(bare / str(step), out / str(step))
        _check_restores(out, step)
    assert cli("verify", out).code == 0


def test_export_import_restores_under_the_exported_item_name(
    cli, run: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    r = cli("export", run, tmp_path / "st", "--item", "state", "--no-provenance")
    assert r.code == 0, r.stderr
    back = tmp_path / "back"
    assert cli("import", tmp_path / "st", back, "--step", "2").code == 0
    got = fi.restore_step(back, 2, items=("state",))["state"]
    for name, value in fi.state_of(2).items():
        np.testing.assert_array_equal(np.asarray(got[name]), value)
    renamed = tmp_path / "renamed"
    assert cli("import", tmp_path / "st", renamed, "--item", "pytree").code == 0
    assert (renamed / "0" / "pytree" / "_METADATA").is_file()


def test_diff_compares_an_unknown_item_byte_for_byte(cli, run: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert cli("diff", run / "1", run / "2", "--item", "blob").code == 0  # same bytes each step
    copy = shutil.copytree(run, tmp_path / "run")
    note = copy / "2" / "blob" / "note.txt"
    note.write_bytes(note.read_bytes() + b"!")
    r = cli("diff", run / "2", copy / "2", "--item", "blob", "--json")
    assert r.code == 1
    by_name = {d["name"]: d["status"] for d in r.json()["leaves"]}
    assert by_name == {"blob.bin": "equal", "note.txt": "different"}
