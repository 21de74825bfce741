"""``ckpt export`` / ``ckpt import`` through the real entry point: exit codes, JSON, stderr."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tests.support.paths import FIXTURES, REPO


def test_export_dry_run_prints_the_plan_and_writes_nothing(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    r = cli("export", FIXTURES / "seed_mlp", out, "--params-only", "--dry-run", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["schema_version"] == 1 and doc["format"] == "safetensors"
    names = [t["name"] for t in doc["tensors"]]
    assert names and all(n.startswith("params.") for n in names)
    assert {s["name"] for s in doc["skipped"]} >= {"step", "rng", "opt_state.0.count"}
    assert doc["files"] == [{"name": "model.safetensors", "bytes": doc["files"][0]["bytes"], "tensors": len(names)}]  # fmt: skip
    assert not out.exists()
    text = cli("export", FIXTURES / "seed_mlp", out, "--params-only", "--dry-run")
    assert text.code == 0 and "params.Dense_0.kernel" in text.stdout and not out.exists()


def test_export_writes_and_reports_json(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "pt"
    r = cli(
        "export", FIXTURES / "seed_mlp", out, "--spec", REPO / "examples" / "mlp_to_pytorch.yaml",
        "--max-shard-size", "3KB", "--json",
    )  # fmt: skip
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["written"]["path"] == str(out)
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(doc["written"]["files"]) and "model.safetensors.index.json" in files
    assert doc["index"] == "model.safetensors.index.json"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(index["weight_map"]) == ["layers.0.bias", "layers.0.weight", "layers.1.bias", "layers.1.weight"]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "code", "phrase"),
    [
        (["--max-shard-size", "lots"], 2, "is not a size"),
        (["--dtype", "int8"], 3, "--dtype int8"),
        (["--framework", "jax"], 3, "unknown framework"),
    ],
)
def test_export_bad_options(cli, tmp_path: Path, args: list[str], code: int, phrase: str) -> None:  # type: ignore[no-untyped-def]
    r = cli("export", FIXTURES / "seed_mlp", tmp_path / "out", *args)
    assert r.code == code and phrase in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_export_refuses_strings_and_taken_output(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("export", FIXTURES / "strings", tmp_path / "s")
    assert r.code == 3 and "is a string" in r.stderr and "op: drop" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "s").exists()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("mine")
    r = cli("export", FIXTURES / "seed_mlp", taken)
    assert r.code == 3 and "not an empty directory" in r.stderr
    assert [p.name for p in taken.iterdir()] == ["x"]


def test_import_dry_run_and_damaged_input(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    st = tmp_path / "st"
    assert cli("export", FIXTURES / "seed_mlp", st, "--params-only").code == 0
    r = cli("import", st, tmp_path / "root", "--dry-run", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert [leaf["name"] for leaf in doc["leaves"]] == sorted(
        leaf["name"] for leaf in doc["leaves"]
    )
    # the step and item the export recorded (seed_mlp's latest is 500), no --step or --item
    assert doc["output"] == {"root": str(tmp_path / "root"), "step": 500, "item": "default"}
    assert not (tmp_path / "root").exists()
    path = st / "model.safetensors"
    raw = path.read_bytes()
    path.write_bytes(struct.pack("<Q", len(raw) * 2) + raw[8:])
    r = cli("import", st, tmp_path / "root")
    assert r.code == 3, r.stderr
    assert "runs past the end of the file" in r.stderr and str(path) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "root").exists()


def test_import_writes_a_step_orbax_lists(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    st = tmp_path / "st"
    assert cli("export", FIXTURES / "seed_mlp", st, "--params-only").code == 0
    r = cli("import", st, tmp_path / "root", "--step", "500", "--json")
    assert r.code == 0, r.stderr
    assert r.json()["written"]["path"] == str(tmp_path / "root" / "500")
    ls = cli("ls", tmp_path / "root", "--json")
    assert [s["step"] for s in ls.json()["steps"]] == [500]
    diff = cli(
        "diff", f"{FIXTURES / 'seed_mlp'}@500", f"{tmp_path / 'root'}@500", "--filter", "params.*"
    )
    assert diff.code == 0, diff.stdout + diff.stderr


def test_import_target_mismatch_is_refused(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    st = tmp_path / "st"
    assert cli("export", FIXTURES / "seed_mlp", st, "--params-only").code == 0
    r = cli("import", st, tmp_path / "root", "--target", "examples.train_mlp:abstract_state")
    assert r.code == 3 and "differs from --target" in r.stderr, r.stderr
    assert not (tmp_path / "root").exists()


def test_import_reports_the_containers_it_writes(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    st = tmp_path / "st"
    assert cli("export", FIXTURES / "seed_mlp", st).code == 0
    r = cli("import", st, tmp_path / "root", "--dry-run", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["schema_version"] == 2 and "ckpt.tree" not in doc["source"]["metadata"]
    assert doc["tree"] == {"containers": "ckpt.tree", "empty": [{"name": "opt_state.1", "value_type": "None"}]}  # fmt: skip
    types = {leaf["name"]: leaf["value_type"] for leaf in doc["leaves"]}
    assert types["params.Dense_0.kernel"] == "jax.Array" and len(types) == 15
    text = cli("import", st, tmp_path / "root", "--dry-run")
    assert "containers: from the files' ckpt.tree, 1 empty node (opt_state.1)" in text.stdout


@pytest.mark.parametrize(
    ("tree", "phrase"),
    [
        ("{not json", "ckpt.tree metadata is damaged"),
        ('{"version": 1, "tree": {"w": 7}}', "ckpt.tree metadata is damaged (w is 7)"),
        ('{"version": 9, "tree": {"w": 1}}', "has version 9; this ckpt reads version 1"),
    ],
)
def test_import_refuses_a_damaged_tree_key(cli, tmp_path: Path, tree: str, phrase: str) -> None:  # type: ignore[no-untyped-def]
    import numpy as np
    import safetensors.numpy

    (tmp_path / "st").mkdir()
    path = str(tmp_path / "st" / "model.safetensors")
    safetensors.numpy.save_file({"w": np.ones(2, np.float32)}, path, metadata={"ckpt.tree": tree})
    r = cli("import", tmp_path / "st", tmp_path / "root")
    assert r.code == 3 and phrase in r.stderr and "--target" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "root").exists()


def test_unused_rule_hints_the_command_that_lists_the_leaves(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "spec.yaml"
    spec.write_text("rules: [{op: drop, match: 'nothing\\..*'}]\n")
    r = cli("export", FIXTURES / "seed_mlp", tmp_path / "out", "--spec", spec, "--dry-run")
    assert r.code == 3 and "matched no leaf" in r.stderr
    assert "--dry-run lists" not in r.stderr
    assert "`ckpt inspect " in r.stderr and " --flat` lists the leaf names" in r.stderr


def test_text_names_the_files_written_and_shows_no_empty_column(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    one = cli("export", FIXTURES / "seed_mlp", tmp_path / "one")
    assert one.code == 0, one.stderr
    assert f"wrote {tmp_path / 'one' / 'model.safetensors'}: " in one.stdout
    header = one.stdout.splitlines()[0].split()
    assert header == ["tensor", "array", "operations"]  # one file, nothing renamed
    many = cli("export", FIXTURES / "seed_mlp", tmp_path / "many", "--max-shard-size", "8KiB")
    assert many.code == 0, many.stderr
    files = sorted(p.name for p in (tmp_path / "many").iterdir())
    assert f"wrote {len(files)} files to {tmp_path / 'many'} (" in many.stdout
    assert files[0] in many.stdout and "model.safetensors.index.json)" in many.stdout
    assert many.stdout.splitlines()[0].split() == ["tensor", "array", "file", "operations"]
    renamed = cli(
        "export", FIXTURES / "seed_mlp", tmp_path / "pt", "--spec",
        REPO / "examples" / "mlp_to_pytorch.yaml",
    )  # fmt: skip
    assert renamed.code == 0, renamed.stderr
    assert renamed.stdout.splitlines()[0].split() == ["tensor", "array", "from", "operations"]
    assert "layers.0.weight  float32[64,16]  params.Dense_0.kernel  transpose" in renamed.stdout


def test_export_to_tmpfs_writes_the_same_file_as_to_disk(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """On tmpfs the file is only sized before its blocks (not reserved): the same bytes, a file
    the safetensors library loads, nothing left under a temporary name."""
    import os
    import shutil

    import safetensors.numpy

    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm here")
    fast = Path(f"/dev/shm/ckpt-test-export-{os.getpid()}")
    try:
        for out in (tmp_path / "disk", fast):
            r = cli("export", FIXTURES / "seed_mlp", out, "--params-only")
            assert r.code == 0, r.stderr
        on_disk, on_shm = tmp_path / "disk" / "model.safetensors", fast / "model.safetensors"
        assert sorted(p.name for p in fast.iterdir()) == ["model.safetensors"]
        assert on_shm.read_bytes() == on_disk.read_bytes()
        tensors = safetensors.numpy.load_file(str(on_shm))
        assert tensors and all(name.startswith("params.") for name in tensors)
    finally:
        shutil.rmtree(fast, ignore_errors=True)
