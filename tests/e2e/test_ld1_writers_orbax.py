"""``ld1`` digests carried by the writers: a TrainState saved by the installed Orbax is
recorded once; ``reshard`` to two meshes, to zarr3 and out of OCDBT keeps every leaf's digest
(and checks it against the values it writes); the output restores into the user's abstract
state and the next training step equals the uninterrupted run's. A source whose values changed
after recording is refused by the writer before anything is committed (exit 3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow


def _save(root: Path) -> Any:

    from tests.support import linen_train_state as lts

    state = lts.save_trained(root)
    return state


def _leaves(root: Path) -> dict[str, Any]:
    doc = json.loads((root / "1" / "default" / "_CKPT_DIGESTS.json").read_text())
    assert doc["version"] == 2
    leaves = doc["leaves"]
    assert isinstance(leaves, dict) and leaves
    return leaves


def _digests(cli: Any, root: Path) -> dict[str, str]:
    r = cli("digest", root, "--json")
    assert r.code == 0, r.stderr
    leaves = r.json()["items"][0]["leaves"]
    assert leaves
    return {x["name"]: x["digest"] for x in leaves if x["digest"] is not None}


def test_digests_survive_reshard_zarr3_and_ocdbt_off_and_training_resumes(
    cli: Any, tmp_path: Path
) -> None:

    from tests.support import linen_train_state as lts

    src = tmp_path / "src"
    state = _save(src)
    assert cli("verify", src, "--record").code == 0
    recorded = _leaves(src)
    arrays = {k: v["ld1"] for k, v in recorded.items() if v["dtype"] != "string"}
    assert arrays and set(arrays.items()) <= set(_digests(cli, src).items())
    outs = {
        "mesh-1": ["--mesh", "data=1"],
        "mesh-2": ["--mesh", "data=2", "--rule", "*Dense_0.kernel=[null, data]"],
        "zarr3-plain": ["--mesh", "data=1", "--zarr3", "--no-ocdbt"],
    }
    for name, args in outs.items():
        dst = tmp_path / name
        r = cli("reshard", src, dst, *args)
        assert r.code == 0, r.stderr
        assert _leaves(dst) == recorded, name
        assert set(arrays.items()) <= set(_digests(cli, dst).items()), name
        deep = cli("verify", dst, "--deep", "--json")
        assert deep.code == 0 and deep.json()["checked"]["digests"] == {"1/default": "checked"}
    lts.assert_resumes(tmp_path / "zarr3-plain", state)


def test_reshard_refuses_a_source_changed_after_recording(cli: Any, tmp_path: Path) -> None:
    import tensorstore as ts

    src = tmp_path / "src"
    _save(src)
    plain = tmp_path / "plain"
    assert cli("reshard", src, plain, "--mesh", "data=1", "--no-ocdbt").code == 0
    assert cli("verify", plain, "--record").code == 0
    name = "params.Dense_0.kernel"
    item = plain / "1" / "default"
    assert (item / name).is_dir(), sorted(p.name for p in item.iterdir())
    arr = ts.open({"driver": "zarr", "kvstore": f"file://{item}/{name}/"}).result()
    values = arr.read().result()
    values[0, 0] += 1.0  # every chunk still decodes: only the digest can tell
    arr.write(values).result()
    dst = tmp_path / "dst"
    r = cli("reshard", plain, dst, "--mesh", "data=1", "--json")
    assert r.code == 3, r.stdout + r.stderr
    assert r.json()["error"]["code"] == "source-digest-mismatch"
    assert name in r.json()["error"]["message"]
    assert not (dst / "1").exists()
    assert not [p for p in dst.rglob("*") if p.is_dir() and p.name.startswith("1")]


def test_migrate_checks_the_leaves_it_leaves_unchanged(
    cli: Any, fixture_copy: Any, tmp_path: Path
) -> None:
    import tensorstore as ts

    src = fixture_copy("no_ocdbt")
    assert cli("verify", src, "--record").code == 0
    spec = tmp_path / "spec.yaml"
    spec.write_text("rules:\n  - {op: cast, match: 'params\\.Dense_0\\.bias', dtype: bfloat16}\n")
    good = tmp_path / "good"
    r = cli("migrate", src, good, "--spec", spec)
    assert r.code == 0, r.stderr
    source = json.loads((src / "0" / "default" / "_CKPT_DIGESTS.json").read_text())["leaves"]
    out = json.loads((good / "0" / "default" / "_CKPT_DIGESTS.json").read_text())["leaves"]
    assert out["params.Dense_0.kernel"] == source["params.Dense_0.kernel"]
    assert out["params.Dense_0.bias"]["dtype"] == "bfloat16"
    item = src / "0" / "default"
    arr = ts.open({"driver": "zarr", "kvstore": f"file://{item}/params.Dense_0.kernel/"}).result()
    values = arr.read().result()
    values[0, 0] += 1.0
    arr.write(values).result()
    bad = tmp_path / "bad"
    r = cli("migrate", src, bad, "--spec", spec, "--json")
    assert r.code == 3, r.stdout + r.stderr
    assert r.json()["error"]["code"] == "source-digest-mismatch"
    assert not list(bad.glob("0*"))
