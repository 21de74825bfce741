"""Safetensors files and Hugging Face folders through the real entry point, as ``inspect``,
``verify``, ``digest`` and ``doctor --like`` take them: exit codes, JSON, one line on stderr,
never a traceback nor exit 70."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from tests.support.hf_folders import INDEX, llama_like, perturb, save_hf_folder, write_raw
from tests.support.paths import FIXTURES
from tests.support.terminal import run_on_terminal


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    save_hf_folder(tmp_path / "hf", llama_like(), shards=2)
    return tmp_path / "hf"


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_inspect_lists_every_tensor_in_text_and_json(cli, folder: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", folder)
    assert r.code == 0, r.stderr
    assert r.stdout.startswith(f"safetensors {folder}: 5 tensors in 2 files")
    assert "config.json: model_type llama" in r.stdout and "format = pt" in r.stdout
    assert all(name in r.stdout for name in llama_like())
    doc = cli("inspect", folder / INDEX, "--json", "--filter", "lm_head").json()
    assert doc["source"] == "safetensors" and doc["schema_version"] == 6
    assert [t["name"] for t in doc["tensors"]] == ["lm_head.weight"]
    stats = cli("inspect", folder, "--stats", "--json").json()
    assert all(t["stats"]["finite"] == t["elements"] for t in stats["tensors"])


def test_inspect_refuses_orbax_options_and_damage_with_one_line(cli, folder: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", folder, "--step", "3")
    assert r.code == 2 and "--step apply to Orbax checkpoints" in one_line(r.stderr)
    shard = folder / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4])
    r = cli("inspect", folder)
    assert r.code == 3 and "truncated" in one_line(r.stderr)


def test_verify_a_clean_folder_exits_0_and_says_what_it_read(cli, folder: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", folder, "--deep")
    assert r.code == 0, r.stderr
    assert r.stdout.startswith(f"safetensors {folder}: 2 files, 5 tensors")
    assert "no ld1 digests in the metadata" in r.stdout and "OK" in r.stdout
    doc = cli("verify", folder, "--deep", "--json").json()
    assert doc["ok"] and doc["kind"] == "safetensors" and doc["checked"]["level"] == "deep"


def test_verify_deep_finds_a_value_changed_after_export(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "pt"
    assert cli("export", FIXTURES / "seed_mlp", out, "--params-only").code == 0
    assert cli("verify", out, "--deep").code == 0
    perturb(out / "model.safetensors", "params.Dense_1.kernel", 1e-3, element=5)
    assert cli("verify", out).code == 0
    r = cli("verify", out / "model.safetensors", "--deep", "--json")
    assert r.code == 1
    (p,) = r.json()["problems"]
    assert (p["code"], p["leaf"], p["file"]) == (
        "digest-mismatch",
        "params.Dense_1.kernel",
        "model.safetensors",
    )
    text = cli("verify", out, "--deep", "--junit", tmp_path / "v.xml")
    assert text.code == 1 and "params.Dense_1.kernel" in text.stdout and "FAILED" in text.stdout
    suites = ET.parse(tmp_path / "v.xml").getroot()
    failed = [c.get("name") for c in suites.iter("testcase") if c.find("failure") is not None]
    assert failed == ["params.Dense_1.kernel"]


def test_verify_damage_exits_1_naming_file_and_tensor(cli, folder: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "overlap.safetensors"
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
    }
    write_raw(bad, header, bytes(8))
    r = cli("verify", bad)
    assert r.code == 1 and "overlaps" in r.stdout and "'b'" in r.stdout
    (folder / "model-00002-of-00002.safetensors").unlink()
    r = cli("verify", folder, "--json")
    assert r.code == 1 and [p["code"] for p in r.json()["problems"]] == ["data-file-missing"]


def test_verify_nan_warns_and_fails_when_asked(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from safetensors.numpy import save_file

    path = tmp_path / "nan.safetensors"
    save_file({"w": np.array([1.0, np.nan], np.float32)}, str(path))
    r = cli("verify", path, "--deep", "--json")
    assert r.code == 0 and r.json()["nonfinite"] == [
        {"item": "nan.safetensors", "leaf": "w", "nan": 1, "inf": 0, "step": None}
    ]
    assert cli("verify", path, "--deep", "--fail-on-nonfinite").code == 1
    assert cli("verify", path, "--deep", "--strict").code == 1


def test_verify_unreadable_exits_3_with_one_line_and_a_json_error(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", tmp_path / "gone.safetensors")
    assert r.code == 3 and "does not exist" in one_line(r.stderr)
    r = cli("verify", tmp_path / "gone.safetensors", "--json")
    assert r.code == 3 and r.json()["ok"] is False
    r = cli("verify", "s3://bucket/model.safetensors")
    assert r.code == 3 and "local disk only" in one_line(r.stderr)
    (tmp_path / "x.safetensors").write_bytes(b"")
    r = cli("verify", tmp_path / "x.safetensors", "--record")
    assert r.code == 2 and "--record apply to Orbax" in one_line(r.stderr)
    r = cli("verify", tmp_path / "x.safetensors", "--workers", "2")
    assert r.code == 2 and "read in this process" in one_line(r.stderr)


def test_digest_reads_a_folder_an_index_and_a_file_alike(cli, folder: Path) -> None:  # type: ignore[no-untyped-def]
    docs = [cli("digest", p, "--json") for p in (folder, folder / INDEX)]
    assert all(d.code == 0 for d in docs), docs[0].stderr
    leaves = [{x["name"]: x["digest"] for x in d.json()["items"][0]["leaves"]} for d in docs]
    assert leaves[0] == leaves[1] and set(leaves[0]) == set(llama_like())
    one = cli("digest", folder / "model-00001-of-00002.safetensors", "--json").json()
    for leaf in one["items"][0]["leaves"]:
        assert leaves[0][leaf["name"]] == leaf["digest"]


def test_doctor_like_a_folder_of_the_safetensors_library(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from safetensors.numpy import load_file

    out = tmp_path / "pt"
    assert cli("export", FIXTURES / "seed_mlp", out, "--max-shard-size", "4KB").code == 0
    hf = tmp_path / "hf"
    tensors = {}
    for f in sorted(out.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    save_hf_folder(hf, tensors, shards=3)  # the same names and shapes, written by the library
    for like in (hf, hf / INDEX):
        r = cli("doctor", FIXTURES / "seed_mlp", "--like", like, "--json")
        assert r.code == 0 and r.json()["verdict"] == "restores", r.stdout
    name = "params.Dense_0.kernel"
    tensors[name] = np.zeros((3, 3), np.float32)
    shutil.rmtree(hf)
    save_hf_folder(hf, tensors, shards=2)
    r = cli("doctor", FIXTURES / "seed_mlp", "--like", hf, "--json")
    assert r.code == 1 and r.json()["verdict"] != "restores" and name in r.stdout


def test_inspect_and_verify_fit_80_columns(folder: Path, tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    lone = tmp_path / "lone.safetensors"
    save_file({"x": np.ones(2, np.float32)}, str(lone), metadata={"note": "a long value " * 20})
    for args in (
        ["inspect", str(folder), "--stats"],
        ["inspect", str(lone)],
        ["verify", str(folder), "--deep"],
    ):
        screen = run_on_terminal(args, 80)
        assert screen.code == 0 and screen.text.strip(), screen.text + screen.stderr
        assert not screen.too_wide(), screen.too_wide()
    assert "lm_head.weight" in run_on_terminal(["inspect", str(folder)], 80).text
