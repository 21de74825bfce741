"""Which side of a parity diff is safetensors: the read commands' rule (a folder that is an Orbax
root, step or item stays a checkpoint, whatever ``.safetensors`` file was dropped into it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from ckpt_cli.core.safetensors.parity_source import is_safetensors
from tests.support.paths import FIXTURES


def test_an_orbax_root_with_an_exported_file_in_it_stays_a_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "exp7"
    shutil.copytree(FIXTURES / "seed_mlp", root)
    save_file({"w": np.ones((2, 2), np.float32)}, str(root / "model.safetensors"))
    assert not is_safetensors(str(root))
    assert is_safetensors(str(root / "model.safetensors"))


def test_a_folder_of_weights_and_bucket_names(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    save_file({"w": np.ones((2, 2), np.float32)}, str(hf / "model.safetensors"))
    assert is_safetensors(str(hf)) and is_safetensors(f"file://{hf}")
    assert not is_safetensors(str(tmp_path / "missing"))
    assert is_safetensors("s3://bucket/hf/model.safetensors")
    assert not is_safetensors("s3://bucket/runs/exp7")
