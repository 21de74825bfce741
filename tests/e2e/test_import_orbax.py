"""``ckpt import`` proven by real Orbax restores, and the export -> import -> export round trip.

Imports of exported files restore in Orbax value for value: with no target (the recorded
single-device sharding), and on 8 forced CPU devices with the mesh the import laid out. Files
written by the ``safetensors`` library itself import the same way. Damaged files are refused
before anything is written.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
import yaml

from ckpt_cli.core.format.sharding import MeshSpec
from ckpt_cli.core.reshard.rules import parse_rules
from ckpt_cli.core.spec.language import load_spec
from ckpt_cli.errors import InvalidSafetensorsError
from tests.support.exchange import export, import_
from tests.support.orbax_truth import restore_leaves, same_bytes
from tests.support.paths import FIXTURES, REPO

pytestmark = pytest.mark.slow


def test_import_of_an_export_restores_value_for_value(tmp_path: Path) -> None:
    export(FIXTURES / "bf16", tmp_path / "st")
    result = import_(tmp_path / "st", tmp_path / "root", step=3)
    assert result.path == str(tmp_path / "root" / "3")
    truth = restore_leaves(FIXTURES / "bf16" / "0" / "default")
    got = restore_leaves(Path(result.path) / "default")
    assert got and sorted(got) == sorted(truth)
    for name in truth:
        assert same_bytes(got[name], truth[name]), name
    import orbax.checkpoint as ocp

    # A CheckpointManager sees a committed step and restores it without a target.
    mgr = ocp.CheckpointManager(str(tmp_path / "root"))
    assert mgr.all_steps() == [3]
    restored = mgr.restore(3)
    assert restored
    mgr.close()


def test_import_on_8_devices_with_a_target_mesh(tmp_path: Path) -> None:
    import jax
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    assert jax.device_count() == 8
    export(FIXTURES / "seed_mlp", tmp_path / "st", params_only=True)
    mesh = MeshSpec.parse("data=4,model=2")
    doc = yaml.safe_load((REPO / "examples" / "mesh_4x2.yaml").read_text())
    rules = parse_rules(doc, mesh, "mesh_4x2.yaml")
    result = import_(tmp_path / "st", tmp_path / "root", mesh=mesh, rules=rules, allow_unused=True)
    truth = restore_leaves(FIXTURES / "seed_mlp" / "500" / "default")
    jmesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    specs = {"Dense_0": {"kernel": P(None, "model"), "bias": P("model")}, "Dense_1": {"kernel": P("model", None), "bias": P()}}  # fmt: skip
    target = {
        "params": {
            layer: {
                k: jax.ShapeDtypeStruct(
                    truth[f"params.{layer}.{k}"].shape,
                    truth[f"params.{layer}.{k}"].dtype,
                    sharding=NamedSharding(jmesh, spec),
                )
                for k, spec in leaves.items()
            }
            for layer, leaves in specs.items()
        }
    }
    with ocp.CheckpointManager(str(tmp_path / "root")) as mgr:
        state = mgr.restore(result.plan.step, args=ocp.args.StandardRestore(target))
        untargeted = mgr.restore(result.plan.step)
    for layer, leaves in specs.items():
        for k, spec in leaves.items():
            value = state["params"][layer][k]
            assert value.sharding.spec == spec
            assert np.asarray(value).tobytes() == truth[f"params.{layer}.{k}"].tobytes()
            # Without a target Orbax uses the sharding the import recorded: the same layout.
            assert untargeted["params"][layer][k].sharding.spec == spec
    kernel = state["params"]["Dense_0"]["kernel"]
    assert kernel.addressable_shards[0].data.shape == (16, 32)


def test_export_import_export_is_byte_identical(tmp_path: Path) -> None:
    spec = load_spec(str(REPO / "examples" / "mlp_to_pytorch.yaml"))
    back = load_spec(str(REPO / "examples" / "pytorch_to_mlp.yaml"))
    export(FIXTURES / "seed_mlp", tmp_path / "a", spec=spec, provenance=False, max_shard_size=3000)
    result = import_(tmp_path / "a", tmp_path / "root", spec=back)
    truth = restore_leaves(FIXTURES / "seed_mlp" / "500" / "default")
    got = restore_leaves(Path(result.path) / "default")
    assert sorted(got) == sorted(k for k in truth if k.startswith("params."))
    assert all(same_bytes(got[k], truth[k]) for k in got)
    export(tmp_path / "root", tmp_path / "b", spec=spec, provenance=False, max_shard_size=3000)
    files = sorted(os.listdir(tmp_path / "a"))
    assert len(files) > 2 and files == sorted(os.listdir(tmp_path / "b"))
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_files_written_by_the_library_import(tmp_path: Path) -> None:
    import ml_dtypes
    import safetensors.numpy

    rng = np.random.default_rng(0)
    tensors = {
        "model.embed_tokens.weight": rng.normal(size=(11, 6)).astype(ml_dtypes.bfloat16),
        "model.layers.0.mlp.up_proj.weight": rng.normal(size=(12, 6)).astype(np.float16),
        "lm_head.weight": rng.normal(size=(11, 6)).astype(np.float32),
        "counts": rng.integers(0, 9, size=(4,), dtype=np.int64),
        "mask": rng.integers(0, 2, size=(3, 3)).astype(bool),
    }
    (tmp_path / "hf").mkdir()
    safetensors.numpy.save_file(tensors, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    result = import_(tmp_path / "hf", tmp_path / "root")
    got = restore_leaves(Path(result.path) / "default")
    assert sorted(got) == sorted(tensors)
    for name, value in tensors.items():
        assert same_bytes(got[name], value), name
    assert result.plan.source_metadata == {"format": "pt"}


def damaged(tmp_path: Path) -> Path:
    export(FIXTURES / "seed_mlp", tmp_path / "st", params_only=True)
    return tmp_path / "st" / "model.safetensors"


@pytest.mark.parametrize(
    ("case", "phrase"),
    [
        ("truncated", "run past the end"),
        ("length", "runs past the end of the file"),
        ("dtype", "unknown dtype"),
        ("offsets", "overlaps"),
    ],
)
def test_damaged_files_are_refused_and_nothing_is_written(
    tmp_path: Path, case: str, phrase: str
) -> None:
    path = damaged(tmp_path)
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = raw[8 : 8 + n]
    if case == "truncated":
        raw = raw[:-5]
    elif case == "length":
        raw = struct.pack("<Q", len(raw)) + raw[8:]
    elif case == "dtype":
        raw = raw[:8] + header.replace(b'"F32"', b'"F31"', 1) + raw[8 + n :]
    else:
        # The second tensor starts 4 bytes early (same header length: digits swapped in place).
        import json

        doc = json.loads(header)
        names = [k for k in doc if k != "__metadata__"]
        second = sorted(names, key=lambda k: doc[k]["data_offsets"][0])[1]
        begin, end = doc[second]["data_offsets"]
        old = f'"data_offsets":[{begin},{end}]'.encode()
        new = f'"data_offsets":[{begin - 4},{end - 4}]'.encode()
        assert len(old) == len(new) and old in header
        raw = raw[:8] + header.replace(old, new, 1) + raw[8 + n :]
    path.write_bytes(raw)
    with pytest.raises(InvalidSafetensorsError, match=phrase):
        import_(tmp_path / "st", tmp_path / "root")
    assert not (tmp_path / "root").exists()
