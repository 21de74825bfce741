"""``inspect_safetensors``: every tensor of a Hugging Face folder written by the ``safetensors``
library, where it is (the offsets read back give the library's own values), the metadata, the
index and config.json; ``--stats`` against numpy; damage refused with one error."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ckpt_cli.core.safetensors.contents import inspect_safetensors
from ckpt_cli.errors import InvalidSafetensorsError, UsageError
from tests.support.hf_folders import INDEX, llama_like, save_hf_folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    save_hf_folder(tmp_path / "hf", llama_like(), shards=2)
    return tmp_path / "hf"


def test_every_tensor_with_its_file_and_offsets_reads_back_the_librarys_values(
    folder: Path,
) -> None:
    want = llama_like()
    doc = inspect_safetensors(str(folder)).to_json()
    assert doc["source"] == "safetensors" and doc["schema_version"] >= 6
    assert [t["name"] for t in doc["tensors"]] == sorted(want)
    assert doc["totals"] == {
        "files": 2,
        "tensors": len(want),
        "elements": sum(v.size for v in want.values()),
        "bytes": sum(v.nbytes for v in want.values()),
    }
    weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
    for t in doc["tensors"]:
        value = want[t["name"]]
        assert t["file"] == weight_map[t["name"]] and t["shape"] == list(value.shape)
        raw = (folder / t["file"]).read_bytes()[t["file_offset"] : t["file_offset"] + t["bytes"]]
        assert raw == value.tobytes(), t["name"]
        assert t["data_offsets"][1] - t["data_offsets"][0] == t["bytes"]
    dtypes = {t["name"]: t["dtype"] for t in doc["tensors"]}
    assert dtypes["model.layers.0.mlp.up_proj.weight"] == "BF16"
    assert dtypes["model.layers.0.self_attn.q_proj.weight"] == "F16"
    assert [f["metadata"] for f in doc["files"]] == [{"format": "pt"}] * 2
    assert doc["index"] is not None and doc["index"]["total_size"] == doc["totals"]["bytes"]
    assert doc["config"] == {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}


def test_a_filter_keeps_matching_tensors_and_stats_match_numpy(folder: Path) -> None:
    result = inspect_safetensors(str(folder), name_filter="layers", stats=True)
    assert [t.entry.name for t in result.tensors] == [
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.self_attn.q_proj.weight",
    ]
    assert result.all_tensors == len(llama_like())
    want = llama_like()
    for t in result.tensors:
        values = want[t.entry.name].astype(np.float64)
        assert t.stats is not None and t.stats.count == values.size
        assert t.stats.mean == pytest.approx(values.mean(), rel=1e-6)
        assert t.stats.max == pytest.approx(values.max())
    with pytest.raises(UsageError, match="matches no tensor"):
        inspect_safetensors(str(folder), name_filter="^nothing$")


def test_a_lone_file_has_no_index_and_bfloat16_stats_count_nan(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    x = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16)
    x[1] = np.nan
    save_file({"x": x}, str(tmp_path / "w.safetensors"))
    result = inspect_safetensors(str(tmp_path / "w.safetensors"), stats=True)
    doc = result.to_json()
    assert doc["index"] is None and doc["config"] is None and doc["files"][0]["metadata"] is None
    (t,) = result.tensors
    assert t.stats is not None and (t.stats.nan, t.stats.count) == (1, 5)


def test_damage_is_refused_with_one_error(folder: Path) -> None:
    shard = folder / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-3])
    with pytest.raises(InvalidSafetensorsError, match="truncated"):
        inspect_safetensors(str(folder))
    shard.unlink()
    with pytest.raises(InvalidSafetensorsError, match="not in"):
        inspect_safetensors(str(folder))
