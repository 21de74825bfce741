"""``core.safetensors.parity``: weight parity between an Orbax save and safetensors files written
by the ``safetensors`` library, streamed block by block; figures checked against numpy."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt_cli.core.safetensors.parity import ParityOptions, diff_parity
from ckpt_cli.core.safetensors.parity_source import block_budget, is_safetensors
from ckpt_cli.errors import InvalidSafetensorsError

#: A fused attention projection [D, 3D] (q, k, v side by side), as a JAX model keeps it; the
#: Hugging Face side holds q_proj, k_proj, v_proj as nn.Linear weights [out, in].
FUSED_SPEC = r"""
version: 1
rules:
  - {op: split, match: 'params\.attn\.qkv\.kernel', into: ['params.attn.q.kernel', 'params.attn.k.kernel', 'params.attn.v.kernel'], axis: 1}
  - {op: transpose, match: 'params\.attn\.(q|k|v)\.kernel', axes: [1, 0]}
  - {op: rename, from: 'params\.attn\.(q|k|v)\.kernel', to: 'self_attn.\1_proj.weight'}
  - {op: cast, match: 'params\.norm\.scale', dtype: bfloat16}
  - {op: rename, from: 'params\.norm\.scale', to: 'norm.weight'}
"""


@pytest.fixture(scope="module")
def fused(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """An Orbax save (StandardCheckpointer) of a fused qkv kernel and a norm, and its values."""
    import orbax.checkpoint as ocp

    rng = np.random.default_rng(1)
    tree = {
        "params": {
            "attn": {"qkv": {"kernel": rng.standard_normal((24, 72)).astype(np.float32)}},
            "norm": {"scale": rng.standard_normal(24).astype(np.float32)},
        }
    }
    path = tmp_path_factory.mktemp("fused") / "ckpt"
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(path, tree)
    ckptr.wait_until_finished()
    return path, tree["params"]


def hf_tensors(params: dict[str, Any]) -> dict[str, Any]:
    """What the spec should produce, by numpy: the kernel cut in three, each transposed."""
    import ml_dtypes

    q, k, v = np.split(params["attn"]["qkv"]["kernel"], 3, axis=1)
    out = {f"self_attn.{n}_proj.weight": np.ascontiguousarray(t.T) for n, t in zip("qkv", (q, k, v), strict=True)}  # fmt: skip
    out["norm.weight"] = params["norm"]["scale"].astype(ml_dtypes.bfloat16)
    return out


def test_a_fused_qkv_split_by_the_spec_equals_the_hugging_face_tensors(
    fused: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    from safetensors.numpy import save_file

    ckpt, params = fused
    spec = tmp_path / "fused.yaml"
    spec.write_text(FUSED_SPEC)
    tensors = hf_tensors(params)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    report = diff_parity(str(ckpt), str(tmp_path), ParityOptions(spec=str(spec)))
    assert report.all_leaves and report.equal, report.to_json()
    assert {d.name for d in report.all_leaves} == set(tensors)
    assert next(d for d in report.all_leaves if d.name == "norm.weight").dtype_a == "bfloat16"
    # k's block moved: only k differs, by numpy's figure.
    k = tensors["self_attn.k_proj.weight"].copy()
    k[7, :] *= np.float32(1.5)
    save_file({**tensors, "self_attn.k_proj.weight": k}, str(tmp_path / "model.safetensors"))
    report = diff_parity(str(ckpt), str(tmp_path), ParityOptions(spec=str(spec)))
    bad = [d for d in report.all_leaves if not d.equal]
    assert [d.name for d in bad] == ["self_attn.k_proj.weight"]
    want = np.abs(tensors["self_attn.k_proj.weight"].astype(np.float64) - k.astype(np.float64))
    assert bad[0].max_abs == float(want.max()) and bad[0].mismatched == int((want > 0).sum())


def test_blocks_stream_in_bounded_memory(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(2)
    big = rng.standard_normal((1536, 4096)).astype(np.float32)  # 24 MiB
    big[0, 0] = np.nan  # NaN equals NaN at the same place
    save_file({"w": big, "b": big[0]}, str(tmp_path / "a.safetensors"))
    changed = big.copy()
    changed[-1, -1] += np.float32(0.25)  # in the last block only
    save_file({"w": changed, "b": big[0]}, str(tmp_path / "b.safetensors"))
    del big, changed
    limit = 64 << 20
    block, held = block_budget(limit)
    assert block == 1 << 20 and held == 2 << 20
    tracemalloc.start()
    try:
        report = diff_parity(
            str(tmp_path / "a.safetensors"),
            str(tmp_path / "b.safetensors"),
            ParityOptions(memory_limit=limit, atol=1e-6),
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    w = next(d for d in report.all_leaves if d.name == "w")
    assert w.status == "different" and w.mismatched == 1 and w.elements == 1536 * 4096
    assert w.max_abs is not None and abs(w.max_abs - 0.25) < 1e-6
    # The blocks in flight on both sides and a few float64 copies of one block, well under
    # the 24 MiB tensor.
    bound = 2 * (held + block) + 8 * block
    assert bound < 24 << 20 and peak < bound, peak


def test_what_names_safetensors(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    save_file({"x": np.zeros(2, np.float32)}, str(tmp_path / "m.safetensors"))
    assert is_safetensors(str(tmp_path / "m.safetensors"))
    assert is_safetensors(str(tmp_path))
    assert is_safetensors("s3://bucket/m.safetensors")
    assert not is_safetensors(str(tmp_path / "nothing"))
    (tmp_path / "orbax").mkdir()
    assert not is_safetensors(str(tmp_path / "orbax"))
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(InvalidSafetensorsError):
        diff_parity(str(tmp_path / "bad.safetensors"), str(tmp_path), ParityOptions())
