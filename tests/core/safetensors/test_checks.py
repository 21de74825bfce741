"""``ckpt_cli.verify`` of safetensors files and Hugging Face folders written by the ``safetensors``
library and by ``ckpt export``: every kind of damage gets its problem code, naming the file and
the tensor; clean sources report none."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import ckpt_cli
from ckpt_cli.core.verify.types import VerifyOptions
from ckpt_cli.errors import CkptError, NotFoundError, UnsupportedError, UsageError
from tests.support.hf_folders import (
    INDEX,
    header_of,
    llama_like,
    perturb,
    save_hf_folder,
    write_raw,
)
from tests.support.paths import FIXTURES


def codes(report: ckpt_cli.VerifyReport) -> list[str]:
    return sorted(p.code for p in report.problems)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    save_hf_folder(tmp_path / "hf", llama_like(), shards=2)
    return tmp_path / "hf"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``ckpt export`` of a real Orbax checkpoint: the files record every tensor's ld1."""
    out = tmp_path_factory.mktemp("export") / "pt"
    ckpt_cli.execute(ckpt_cli.plan_export(FIXTURES / "seed_mlp", out, max_shard_size=4096))
    return out


def test_a_folder_written_by_the_safetensors_library_is_clean_at_every_level(folder: Path) -> None:
    for deep in (False, True):
        report = ckpt_cli.verify(folder, deep=deep)
        assert report.ok and report.problems == (), report.problems
        doc = report.to_json()
        assert doc["kind"] == "safetensors" and doc["checked"]["files"] == 2
        assert doc["checked"]["arrays"] == len(llama_like())
        assert {i.digests for i in report.items} == {"none-in-metadata"}
    deep = ckpt_cli.verify(folder, deep=True)
    assert sum(i.bytes_decoded for i in deep.items) == sum(v.nbytes for v in llama_like().values())


def test_the_index_and_a_lone_file_are_sources_too(folder: Path, tmp_path: Path) -> None:
    assert ckpt_cli.verify(folder / INDEX, deep=True).ok
    one = tmp_path / "one"
    save_hf_folder(one, llama_like(), shards=1)
    report = ckpt_cli.verify(one / "model.safetensors", deep=True)
    assert report.ok and [i.name for i in report.items] == ["model.safetensors"]


def test_an_export_is_checked_against_its_recorded_digests(exported: Path) -> None:
    report = ckpt_cli.verify(exported, deep=True)
    assert report.ok, report.problems
    assert len(report.items) > 1 and {i.digests for i in report.items} == {"checked"}
    assert {i.digests for i in ckpt_cli.verify(exported).items} == {"in-metadata"}


def test_a_value_changed_by_1e_3_after_export_is_found_by_deep_only(
    exported: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "pt"
    shutil.copytree(exported, copy)
    index = json.loads((copy / "model.safetensors.index.json").read_text())["weight_map"]
    tensor = next(t for t in sorted(index) if t.endswith("kernel"))
    perturb(copy / index[tensor], tensor, 1e-3, element=3)
    assert ckpt_cli.verify(copy).ok  # the structure is intact
    report = ckpt_cli.verify(copy, deep=True)
    assert codes(report) == ["digest-mismatch"]
    (p,) = report.problems
    assert p.leaf == tensor and p.file == index[tensor] and "changed after export" in p.message


def test_a_planted_nan_is_a_warning_unless_asked_to_fail(tmp_path: Path) -> None:
    tensors = llama_like()
    tensors["model.layers.0.mlp.up_proj.weight"][2, 3] = np.nan  # bfloat16
    tensors["lm_head.weight"][0, 0] = np.inf
    save_hf_folder(tmp_path / "hf", tensors, shards=2)
    assert ckpt_cli.verify(tmp_path / "hf").problems == ()
    report = ckpt_cli.verify(tmp_path / "hf", deep=True)
    assert report.ok and codes(report) == ["nonfinite", "nonfinite"]
    found = {(n.leaf, n.nan, n.inf) for i in report.items for n in i.nonfinite}
    assert found == {("model.layers.0.mlp.up_proj.weight", 1, 0), ("lm_head.weight", 0, 1)}
    strict = ckpt_cli.verify(tmp_path / "hf", deep=True, fail_on_nonfinite=True)
    assert not strict.ok and strict.errors == 2


def test_a_missing_shard_names_the_file_and_its_tensors(folder: Path) -> None:
    weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
    gone = "model-00002-of-00002.safetensors"
    (folder / gone).unlink()
    report = ckpt_cli.verify(folder, deep=True)
    assert codes(report) == ["data-file-missing"]
    (p,) = report.problems
    assert p.file == gone and set(p.leaves) == {t for t, f in weight_map.items() if f == gone}


def test_index_and_shards_that_disagree(folder: Path) -> None:
    doc = json.loads((folder / INDEX).read_text())
    doc["weight_map"]["model.norm.weight"] = "model-00002-of-00002.safetensors"  # wrong file
    doc["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"  # no file holds it
    del doc["weight_map"]["lm_head.weight"]  # a shard holds it, the index does not list it
    (folder / INDEX).write_text(json.dumps(doc))
    report = ckpt_cli.verify(folder)
    assert codes(report) == ["index-mismatch"] * 3
    assert {p.leaf for p in report.problems} == {
        "model.norm.weight",
        "ghost.weight",
        "lm_head.weight",
    }
    assert all(p.file and p.file.endswith(".safetensors") for p in report.problems)


def test_a_tensor_in_two_shards_and_a_shard_the_index_omits(folder: Path, tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    save_file({"lm_head.weight": np.zeros((2, 2), np.float32)}, str(folder / "extra.safetensors"))
    report = ckpt_cli.verify(folder)
    assert codes(report) == ["shard-unlisted"] and report.ok  # the index never reads it
    (folder / INDEX).unlink()
    report = ckpt_cli.verify(folder)  # no index: every file is read, so the copy collides
    assert "tensor-duplicated" in codes(report) and not report.ok
    assert (
        next(p for p in report.problems if p.code == "tensor-duplicated").leaf == "lm_head.weight"
    )


def test_an_index_or_config_that_does_not_parse(folder: Path) -> None:
    (folder / INDEX).write_text("{not json")
    (folder / "config.json").write_text("[")
    report = ckpt_cli.verify(folder, deep=True)
    assert codes(report) == ["index-invalid", "json-invalid"]
    # The shards beside the broken index are still read.
    assert sum(len(i.leaves) for i in report.items) == len(llama_like())


HEADER_DAMAGE = {
    "bad-json": (b'{"x": {"dtype": "F32",', b"", None, "not valid JSON"),
    "huge-length": ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, bytes(4), 1 << 40, "over the format's limit"),
    "unknown-dtype": ({"x": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}, bytes(4), None, "unknown dtype"),
    "overlap": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8), None, "overlaps"),
    "out-of-file": ({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8), None, "past the end of the file"),
    "size-mismatch": ({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8), None, "needs 12"),
    "hole": ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8), None, "belong to no tensor"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HEADER_DAMAGE))
def test_header_damage_is_one_problem_naming_the_file(tmp_path: Path, case: str) -> None:
    header, data, length, phrase = HEADER_DAMAGE[case]
    path = tmp_path / f"{case}.safetensors"
    write_raw(path, header, data, length)
    report = ckpt_cli.verify(path, deep=True)
    assert codes(report) == ["safetensors-header-invalid"] and not report.ok
    (p,) = report.problems
    assert p.file == path.name and phrase in p.message, p.message


def test_a_truncated_shard_and_a_git_lfs_pointer(folder: Path) -> None:
    shard = folder / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-5])
    (folder / "model-00002-of-00002.safetensors").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1234\n"
    )
    report = ckpt_cli.verify(folder, deep=True)
    assert codes(report) == ["safetensors-header-invalid"] * 2
    by_file = {p.file: p.message for p in report.problems}
    assert "truncated" in by_file[shard.name]
    assert "git lfs pull" in by_file["model-00002-of-00002.safetensors"]


def test_bool_bytes_other_than_0_and_1_are_a_decode_error(tmp_path: Path) -> None:
    path = tmp_path / "b.safetensors"
    write_raw(
        path,
        {"flags": {"dtype": "BOOL", "shape": [4], "data_offsets": [0, 4]}},
        bytes([0, 1, 7, 0]),
    )
    assert ckpt_cli.verify(path).ok
    report = ckpt_cli.verify(path, deep=True)
    assert codes(report) == ["decode-error"] and report.problems[0].leaf == "flags"


def test_a_dtype_ckpt_does_not_decode_is_checked_for_size_only(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    write_raw(path, {"z": {"dtype": "C64", "shape": [2], "data_offsets": [0, 16]}}, bytes(16))
    report = ckpt_cli.verify(path, deep=True)
    assert report.ok and codes(report) == ["dtype-unsupported"]


def test_the_ld1_metadata_damaged_is_reported(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    path = tmp_path / "m.safetensors"
    save_file({"x": np.ones(3, np.float32)}, str(path), metadata={"ckpt.ld1": "{broken"})
    report = ckpt_cli.verify(path)
    assert codes(report) == ["digest-file-invalid"]
    header, _ = header_of(path)
    assert header["__metadata__"]["ckpt.ld1"] == "{broken"  # nothing was written


def test_what_is_not_a_source_raises_one_error(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        ckpt_cli.verify(tmp_path / "nope.safetensors")
    with pytest.raises(UnsupportedError, match="local disk only"):
        ckpt_cli.verify("s3://bucket/model.safetensors")
    (tmp_path / "two").mkdir()
    for name in ("a.safetensors.index.json", "b.safetensors.index.json"):
        (tmp_path / "two" / name).write_text("{}")
    with pytest.raises(CkptError, match="2 safetensors indexes"):
        ckpt_cli.verify(tmp_path / "two")


def test_orbax_only_options_are_refused_by_name(folder: Path) -> None:
    from ckpt_cli.core.safetensors.checks import verify_safetensors

    for options, flag in (
        (VerifyOptions(record=True), "--record"),
        (VerifyOptions(step=3), "--step 3"),
        (VerifyOptions(max_duration=5.0), "--max-duration"),
    ):
        with pytest.raises(UsageError, match=flag):
            verify_safetensors(str(folder), options)
