"""``ckpt diff`` with safetensors sides: an Orbax step against its export (``--spec``), against a
Hugging Face folder the ``safetensors`` library wrote, perturbed values, ``--ignore``, bf16,
damaged files. Figures are checked against numpy on the values Orbax itself restores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.orbax_truth import restore_leaves
from tests.support.paths import FIXTURES, REPO

SPEC = REPO / "examples" / "mlp_to_pytorch.yaml"
MLP = FIXTURES / "seed_mlp"


@pytest.fixture(scope="module")
def torch_state() -> dict[str, Any]:
    """The PyTorch state dict ``mlp_to_pytorch.yaml`` describes, made by numpy from the leaves
    Orbax restores from step 500: Dense kernels [in, out] -> nn.Linear weights [out, in]."""
    leaves = restore_leaves(MLP / "500" / "default")
    out = {}
    for i in (0, 1):
        kernel = np.asarray(leaves[f"params.Dense_{i}.kernel"])
        out[f"layers.{i}.weight"] = np.ascontiguousarray(kernel.T)
        out[f"layers.{i}.bias"] = np.asarray(leaves[f"params.Dense_{i}.bias"])
    assert out["layers.0.weight"].shape == (64, 16)
    return out


def hf_folder(root: Path, tensors: dict[str, Any]) -> Path:
    """A Hugging Face folder as ``save_pretrained`` lays it out: two shards and the index,
    written by the ``safetensors`` library."""
    from safetensors.numpy import save_file

    root.mkdir(parents=True)
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}  # fmt: skip
    weight_map = {}
    for file, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(root / file), metadata={"format": "pt"})
        weight_map |= {n: file for n in part}
    total = sum(t.nbytes for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    (root / "config.json").write_text("{}")
    return root


def leaf(doc: dict[str, Any], name: str) -> dict[str, Any]:
    assert doc["leaves"], doc
    return next(x for x in doc["leaves"] if x["name"] == name)


def test_a_step_equals_its_export_through_the_same_spec(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "pt"
    assert cli("export", MLP, out, "--spec", SPEC, "--max-shard-size", "3KB").code == 0
    assert (out / "model.safetensors.index.json").exists()
    r = cli("diff", MLP, out, "--spec", SPEC, "--json")
    assert r.code == 0, r.stdout + r.stderr
    doc = r.json()
    assert doc["schema_version"] == 5 and doc["equal"] is True and doc["spec"] == str(SPEC)
    assert (doc["a"]["format"], doc["b"]["format"]) == ("orbax", "safetensors")
    assert doc["a"]["step"] == 500
    assert sorted(x["name"] for x in doc["leaves"]) == ["layers.0.bias", "layers.0.weight", "layers.1.bias", "layers.1.weight"]  # fmt: skip
    assert all(x["status"] == "equal" and x["max_abs_diff"] == 0.0 for x in doc["leaves"])
    assert leaf(doc, "layers.0.weight")["elements"] == 64 * 16
    # The folder, the index file and one shard name the same tensors.
    assert cli("diff", out, out / "model.safetensors.index.json").code == 0
    text = cli("diff", MLP, out, "--spec", SPEC)
    assert text.code == 0 and "EQUAL" in text.stdout and "through spec" in text.stdout


def test_without_the_spec_the_names_are_only_on_one_side(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "pt"
    assert cli("export", MLP, out, "--spec", SPEC).code == 0
    doc = cli("diff", MLP, out, "--json").json()
    assert doc["ok"] is False
    assert leaf(doc, "layers.0.weight")["status"] == "only_b"
    assert leaf(doc, "params.Dense_0.kernel")["status"] == "only_a"
    assert leaf(doc, "params.Dense_0.kernel")["shape"] == [[16, 64], None]
    assert doc["summary"]["only_b"] == 4 and doc["summary"]["only_a"] >= 4
    assert cli("diff", MLP, out).code == 1


def test_a_folder_the_safetensors_library_wrote(cli, tmp_path: Path, torch_state) -> None:  # type: ignore[no-untyped-def]
    good = hf_folder(tmp_path / "good", torch_state)
    r = cli("diff", MLP, good, "--spec", SPEC, "--json")
    assert r.code == 0, r.stdout + r.stderr
    assert r.json()["b"]["item"] == "index of 2 files"
    # One element moved by 1e-3: exit 1 naming the tensor, with numpy's figures.
    bad_state = dict(torch_state)
    w = torch_state["layers.1.weight"].copy()
    w[3, 5] += np.float32(1e-3)
    bad_state["layers.1.weight"] = w
    bad = hf_folder(tmp_path / "bad", bad_state)
    r = cli("diff", MLP, bad, "--spec", SPEC, "--json")
    assert r.code == 1
    got = leaf(r.json(), "layers.1.weight")
    a64, b64 = torch_state["layers.1.weight"].astype(np.float64), w.astype(np.float64)
    assert got["status"] == "different" and got["mismatched"] == 1
    assert got["max_abs_diff"] == float(np.abs(a64 - b64).max())
    assert abs(got["max_abs_diff"] - 1e-3) < 1e-6
    assert got["max_rel_diff"] == float((np.abs(a64 - b64) / np.abs(b64)).max())
    assert [x["name"] for x in r.json()["leaves"] if x["status"] != "equal"] == ["layers.1.weight"]
    text = cli("diff", MLP, bad, "--spec", SPEC)
    assert text.code == 1 and "layers.1.weight" in text.stdout and "1/640" in text.stdout
    assert cli("diff", MLP, bad, "--spec", SPEC, "--atol", "2e-3").code == 0
    ignored = cli("diff", MLP, bad, "--spec", SPEC, "--ignore", r"layers\.1\.weight", "--json")
    assert ignored.code == 0 and ignored.json()["ignored"] == 2
    assert all(x["name"] != "layers.1.weight" for x in ignored.json()["leaves"])
    assert "2 ignored" in cli("diff", MLP, bad, "--spec", SPEC, "--ignore", "*.1.weight").stdout


def test_bfloat16_tensors_and_a_cast_export(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import ml_dtypes
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    x = rng.standard_normal((33, 17)).astype(ml_dtypes.bfloat16)
    y = x.copy()
    y[32, 16] = ml_dtypes.bfloat16(float(x[32, 16]) + 0.5)
    save_file({"w": x, "s": np.ones((), ml_dtypes.bfloat16)}, str(tmp_path / "a.safetensors"))
    save_file({"w": y, "s": np.ones((), ml_dtypes.bfloat16)}, str(tmp_path / "b.safetensors"))
    r = cli("diff", tmp_path / "a.safetensors", tmp_path / "b.safetensors", "--json")
    assert r.code == 1
    got = leaf(r.json(), "w")
    want = np.abs(x.astype(np.float64) - y.astype(np.float64))
    assert got["dtype"] == ["bfloat16", "bfloat16"] and got["mismatched"] == 1
    assert got["max_abs_diff"] == float(want.max()) > 0.4
    assert leaf(r.json(), "s")["status"] == "equal"
    # An Orbax step against its export cast to bfloat16: the dtype differs; compared as
    # float64, the rounding stays within bfloat16's half ulp.
    out = tmp_path / "bf"
    assert cli("export", MLP, out, "--spec", SPEC, "--dtype", "bfloat16").code == 0
    doc = cli("diff", MLP, out, "--spec", SPEC, "--json").json()
    assert leaf(doc, "layers.0.weight")["status"] == "dtype_changed"
    assert cli("diff", MLP, out, "--spec", SPEC, "--compare-cast").code == 1
    assert cli("diff", MLP, out, "--spec", SPEC, "--compare-cast", "--rtol", "4e-3").code == 0


def test_a_missing_shard_and_a_corrupted_header_are_unreadable(
    cli, tmp_path: Path, torch_state
) -> None:  # type: ignore[no-untyped-def]
    missing = hf_folder(tmp_path / "missing", torch_state)
    (missing / "model-00002-of-00002.safetensors").unlink()
    garbled = hf_folder(tmp_path / "garbled", torch_state)
    shard = garbled / "model-00001-of-00002.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[8:12] = b"}}}}"  # the header's JSON broken
    shard.write_bytes(bytes(raw))
    for folder, phrase in ((missing, "model-00002-of-00002.safetensors"), (garbled, "model-00001-of-00002.safetensors")):  # fmt: skip
        r = cli("diff", MLP, folder, "--spec", SPEC)
        assert r.code == 3, (r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and phrase in r.stderr
        assert "Traceback" not in r.stderr and not r.stdout.strip()


def test_damaged_and_misused_sides(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "pt"
    assert cli("export", MLP, out, "--spec", SPEC).code == 0
    raw = (out / "model.safetensors").read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(raw[:-5])
    for args in ((MLP, cut, "--spec", SPEC), (cut, out)):
        r = cli("diff", *args)
        assert r.code == 3, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "cut.safetensors" in r.stderr
        assert "Traceback" not in r.stderr
    r = cli("diff", out, MLP, "--spec", SPEC)
    assert r.code == 2 and "put the Orbax side first" in r.stderr
    r = cli("diff", MLP, out, "--spec", tmp_path / "missing.yaml")
    assert r.code in (2, 3) and len(r.stderr.strip().splitlines()) == 1
    r = cli("diff", out, out, "--ignore", "(")
    assert r.code == 2 and "--ignore" in r.stderr


def test_a_parity_diff_imports_no_jax_and_structure_reads_no_values(
    cli, tmp_path: Path, torch_state
) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    from tests.support.startup_probe import PROBE

    folder = hf_folder(tmp_path / "hf", torch_state)
    args = ["diff", str(MLP), str(folder), "--spec", str(SPEC)]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, check=True)  # fmt: skip
    line = next(x for x in proc.stderr.splitlines() if x.startswith("HEAVY="))
    assert json.loads(line[len("HEAVY=") :]) == [] and "EQUAL" in proc.stdout
    # --structure: names, dtypes and shapes; a file whose values are garbage still compares equal.
    (folder / "model-00002-of-00002.safetensors").write_bytes(
        bytes(len((folder / "model-00002-of-00002.safetensors").read_bytes()))
    )
    r = cli("diff", MLP, folder, "--spec", SPEC, "--structure", "--json")
    assert r.code == 3  # a zeroed header is not safetensors: unreadable, not "equal"
    hf = hf_folder(tmp_path / "hf2", {**torch_state, "layers.0.bias": torch_state["layers.0.bias"] + 1})  # fmt: skip
    r = cli("diff", MLP, hf, "--spec", SPEC, "--structure", "--json")
    assert r.code == 0 and r.json()["structure_only"] is True
    assert all(x["max_abs_diff"] is None for x in r.json()["leaves"])
    assert cli("diff", MLP, hf, "--spec", SPEC).code == 1
