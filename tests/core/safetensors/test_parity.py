"""``core.safetensors.parity``: weight parity between an Orbax save and safetensors files written
by the ``safetensors`` library, streamed block by block; figures checked against numpy."""

from __future__ import annotations

import dataclasses
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


TRANSPOSE_SPEC = r"""
version: 1
rules:
  - {op: transpose, match: 'params\.kernel', axes: [1, 0]}
  - {op: rename, from: 'params\.kernel', to: 'weight'}
"""


def test_a_row_sharded_kernel_against_its_transpose_in_column_bands(tmp_path: Path) -> None:
    """Rows sharded over 8 devices: each 256 KiB chunk is a column band of the [out, in] tensor,
    gathered from the file's mapping and compared in tiles against a transposed view; equal, then
    every figure as numpy gives it when values move in several bands."""
    import jax
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from safetensors.numpy import save_file

    from ckpt_cli.core.safetensors.reader import LocalFile

    rng = np.random.default_rng(8)
    kernel = rng.standard_normal((1024, 512)).astype(np.float32)  # [in, out], 2 MiB
    kernel[100, 7] = np.nan
    rows = NamedSharding(Mesh(np.array(jax.devices()[:8]), ("data",)), P("data", None))
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(tmp_path / "ckpt", {"params": {"kernel": jax.device_put(kernel, rows)}})
    ckptr.wait_until_finished()
    spec = tmp_path / "t.yaml"
    spec.write_text(TRANSPOSE_SPEC)
    weight = np.ascontiguousarray(kernel.T)
    save_file({"weight": weight}, str(tmp_path / "model.safetensors"))
    gathers = []
    real = LocalFile.gather

    def spy(self: LocalFile, *args: Any) -> int:
        gathers.append(args[2])
        return real(self, *args)

    options = ParityOptions(spec=str(spec), memory_limit=64 << 20)
    mp = pytest.MonkeyPatch()
    mp.setattr(LocalFile, "gather", spy)
    try:
        report = diff_parity(str(tmp_path / "ckpt"), str(tmp_path), options)
        assert report.equal and [d.name for d in report.all_leaves] == ["weight"]
        assert len(gathers) >= 2  # column bands, not the whole tensor
        assert all(g[1].stop - g[1].start < 1024 for g in gathers)
        changed = weight.copy()
        changed[3, 10] += np.float32(1e-3)  # row 3 of the [out, in] tensor: band of column 10
        changed[500, 1000] = np.float32(7.0)
        changed[200, 700] = -changed[200, 700]
        save_file({"weight": changed}, str(tmp_path / "model.safetensors"))
        for atol in (0.0, 1e-2):
            with_atol = dataclasses.replace(options, atol=atol)
            d = diff_parity(str(tmp_path / "ckpt"), str(tmp_path), with_atol).all_leaves[0]
            a, b = weight.astype(np.float64), changed.astype(np.float64)
            same = (a == b) | (np.isnan(a) & np.isnan(b))
            diff = np.where(same, 0.0, np.abs(a - b))
            assert d.status == "different" and d.elements == weight.size
            assert d.mismatched == int((~same & (diff > atol)).sum())
            assert d.max_abs == float(diff.max())
            rel = ~same & (b != 0)
            assert d.max_rel == float((diff[rel] / np.abs(b[rel])).max())
    finally:
        mp.undo()
