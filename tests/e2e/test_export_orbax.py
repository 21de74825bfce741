"""``ckpt export`` against real Orbax restores, read back by the ``safetensors`` library.

Every fixture layout ``inspect`` reads exports, and each tensor the library loads is bit-identical
(bfloat16 as raw bytes) to what Orbax restores from the source; spec transposes and renames are
checked against the same arrays transformed in numpy, and by behaviour: the exported weights
compute the Flax model's outputs when used the PyTorch way (tests/support/hf_reference.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt_cli.core.format.resolve import resolve_item
from ckpt_cli.core.spec.language import load_spec, parse_spec
from ckpt_cli.core.storage import open_location
from ckpt_cli.errors import RefusedError
from tests.support.exchange import export, load_dir
from tests.support.hf_reference import mlp_forward
from tests.support.orbax_truth import DERIVED_FROM, restore_leaves, same_bytes
from tests.support.paths import FIXTURES, REPO

pytestmark = pytest.mark.slow


# (fixture, step, item, export keywords): the item each export reads, as `inspect` resolves it.
LAYOUTS = [
    ("seed_mlp", None, None, {}),
    ("sharded_4x2", None, None, {}),
    ("bf16", None, None, {}),
    ("v1_zarr3", 1, None, {}),
    ("no_ocdbt", None, None, {}),
    ("no_ocdbt_zarr3", None, None, {}),
    ("prefixed", 10, None, {}),
    ("single_checkpointer", None, None, {}),
    ("multiprocess", None, None, {}),
    ("unmerged_ocdbt", None, None, {}),
    ("composite_best", 4, "state", {}),
    ("with_tmp", None, None, {}),
    ("strings", None, None, {"spec": "strings"}),
]


@pytest.mark.parametrize(("fixture", "step", "item", "kw"), LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_every_layout_exports_bit_identical_to_an_orbax_restore(
    tmp_path: Path, fixture: str, step: int | None, item: str | None, kw: dict[str, Any]
) -> None:
    if kw.get("spec") == "strings":
        # Strings have no safetensors form: the export refuses them until a rule drops them.
        with pytest.raises(RefusedError, match="is a string"):
            export(FIXTURES / fixture, tmp_path / "refused")
        assert not (tmp_path / "refused").exists()
        doc = b"rules: [{op: drop, match: '(name|meta\\..*)'}]"
        kw = {"spec": parse_spec(doc, "drop_strings.yaml")}
    out = tmp_path / "out"
    result = export(FIXTURES / fixture, out, step=step, item=item, **kw)
    ref = resolve_item(
        open_location(str(FIXTURES / DERIVED_FROM.get(fixture, fixture))), step, item
    )
    truth = restore_leaves(Path(str(ref.location)))
    tensors, metadata = load_dir(out)
    assert tensors and set(tensors) <= set(truth)
    arrays = {k for k, v in truth.items() if isinstance(v, np.ndarray) and v.dtype != object}
    assert set(tensors) == arrays
    for name, value in tensors.items():
        want = np.asarray(truth[name])
        if value.dtype == np.uint8 and want.dtype != np.uint8:
            assert value.tobytes() == want.tobytes(), name
        else:
            assert same_bytes(value, want), name
    assert metadata is not None and metadata["format"] == "pt"
    assert metadata["ckpt.item"] == ref.name
    assert result.bytes_written == sum(np.asarray(v).nbytes for v in tensors.values())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no tmp dir left behind


def test_mlp_spec_gives_pytorch_linear_weights(tmp_path: Path) -> None:
    src = FIXTURES / "seed_mlp"
    export(src, tmp_path / "pt", spec=load_spec(str(REPO / "examples" / "mlp_to_pytorch.yaml")))
    tensors, _ = load_dir(tmp_path / "pt")
    truth = restore_leaves(FIXTURES / "seed_mlp" / "500" / "default")
    assert sorted(tensors) == [
        "layers.0.bias",
        "layers.0.weight",
        "layers.1.bias",
        "layers.1.weight",
    ]
    for i in (0, 1):
        kernel = truth[f"params.Dense_{i}.kernel"]
        assert same_bytes(tensors[f"layers.{i}.weight"], np.ascontiguousarray(kernel.T))
        assert same_bytes(tensors[f"layers.{i}.bias"], truth[f"params.Dense_{i}.bias"])
    # Behaviour: the PyTorch-convention forward pass equals Flax's on the restored parameters.
    sys.path.insert(0, str(REPO / "examples"))
    import jax.numpy as jnp
    from train_mlp import MLP, make_data

    x = np.asarray(make_data(32)[0])
    params = {f"Dense_{i}": {k: jnp.asarray(truth[f"params.Dense_{i}.{k}"]) for k in ("kernel", "bias")} for i in (0, 1)}  # fmt: skip
    want = np.asarray(MLP(64).apply({"params": params}, jnp.asarray(x)))
    np.testing.assert_allclose(mlp_forward(tensors, x), want, rtol=1e-5, atol=1e-5)


def test_params_only_dtype_and_shards(tmp_path: Path) -> None:
    import ml_dtypes

    out = tmp_path / "bf16"
    result = export(
        FIXTURES / "seed_mlp", out, params_only=True, dtype="bfloat16", max_shard_size=2000
    )
    truth = restore_leaves(FIXTURES / "seed_mlp" / "500" / "default")
    tensors, _ = load_dir(out)
    params = sorted(k for k in truth if k.startswith("params."))
    assert sorted(tensors) == params
    for name in params:
        assert same_bytes(tensors[name], truth[name].astype(ml_dtypes.bfloat16)), name
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted({f.name for f in result.plan.files.files})
    assert len(files) > 1 and sorted(set(index["weight_map"].values())) == files
    assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in tensors.values())
    skipped = {s.name: s.reason for s in result.plan.skipped}
    assert "opt_state.0.count" in skipped and "rng" in skipped and "step" in skipped


def test_existing_output_and_typed_keys_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(RefusedError, match="not an empty directory"):
        export(FIXTURES / "seed_mlp", out)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
