"""``locate`` and ``is_safetensors_source``: which paths are safetensors, and the files, index
and config.json of each, with damage kept as messages instead of raised."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from ckpt_cli.core.safetensors.source import is_safetensors_source, lfs_pointer, locate, strict
from ckpt_cli.errors import InvalidSafetensorsError, NotFoundError, UnsupportedError
from tests.support.hf_folders import INDEX, llama_like, save_hf_folder
from tests.support.paths import FIXTURES


def test_which_paths_are_safetensors(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    save_hf_folder(tmp_path / "hf", llama_like(), shards=2)
    save_file({"x": np.ones(2, np.float32)}, str(tmp_path / "weights.bin"))  # renamed
    (tmp_path / "text.bin").write_bytes(b"hello, not safetensors at all")
    assert is_safetensors_source(str(tmp_path / "hf"))
    assert is_safetensors_source(str(tmp_path / "hf" / INDEX))
    assert is_safetensors_source("file://" + str(tmp_path / "hf"))
    assert is_safetensors_source(str(tmp_path / "weights.bin"))  # sniffed from its header
    assert not is_safetensors_source(str(tmp_path / "text.bin"))
    assert not is_safetensors_source(str(FIXTURES / "seed_mlp"))
    run = tmp_path / "run"  # an Orbax root with an export dropped into it stays a checkpoint
    shutil.copytree(FIXTURES / "seed_mlp", run)
    shutil.copy(tmp_path / "weights.bin", run / "model.safetensors")
    shutil.copy(tmp_path / "weights.bin", run / "500" / "model.safetensors")
    shutil.copy(tmp_path / "weights.bin", run / "500" / "default" / "model.safetensors")
    for path in (run, run / "500", run / "500" / "default"):
        assert not is_safetensors_source(str(path)), path
    assert is_safetensors_source(str(run / "model.safetensors"))
    assert not is_safetensors_source("s3://bucket/runs/exp7")
    with pytest.raises(UnsupportedError, match="local disk only"):
        is_safetensors_source("s3://bucket/hf/model.safetensors")


def test_a_folder_through_its_index_with_missing_and_unlisted_shards(tmp_path: Path) -> None:
    save_hf_folder(tmp_path / "hf", llama_like(), shards=3)
    (tmp_path / "hf" / "model-00002-of-00003.safetensors").rename(
        tmp_path / "hf" / "old.safetensors"
    )
    loc = locate(str(tmp_path / "hf"))
    assert loc.index_name == INDEX and loc.index is not None and loc.index_problem is None
    assert loc.files == tuple(f"model-0000{n}-of-00003.safetensors" for n in (1, 2, 3))
    assert loc.missing == ("model-00002-of-00003.safetensors",)
    assert loc.unlisted == ("old.safetensors",)
    assert loc.config is not None and loc.config["model_type"] == "llama"
    with pytest.raises(InvalidSafetensorsError, match="model-00002-of-00003"):
        strict(loc)


def test_a_damaged_index_falls_back_to_the_shards_beside_it(tmp_path: Path) -> None:
    save_hf_folder(tmp_path / "hf", llama_like(), shards=2)
    (tmp_path / "hf" / INDEX).write_text('{"weight_map": 3}')
    loc = locate(str(tmp_path / "hf"))
    assert loc.index is None and loc.index_problem and "weight_map" in loc.index_problem
    assert len(loc.files) == 2


def test_what_is_no_source_raises(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        locate(str(tmp_path / "gone"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidSafetensorsError, match=r"no \.safetensors file"):
        locate(str(tmp_path / "empty"))


def test_a_git_lfs_pointer_is_told_apart(tmp_path: Path) -> None:
    (tmp_path / "p.safetensors").write_text("version https://git-lfs.github.com/spec/v1\n")
    (tmp_path / "q.safetensors").write_bytes(bytes(16))
    assert lfs_pointer(str(tmp_path / "p.safetensors"))
    assert not lfs_pointer(str(tmp_path / "q.safetensors"))
