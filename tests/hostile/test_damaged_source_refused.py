"""Damage is never laundered into a clean-looking output.

Writers check the source's structure before writing and refuse a damaged source (exit 3, one
line naming the problem and pointing at ``ckpt verify``; nothing committed in the destination);
``verify`` fails an array leaf that has no data (a checkpoint Orbax cannot restore is never OK).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.ckpt_process import ckpt, committed_steps, copy_fixture, edit_json
from tests.support.paths import REPO

DAMAGED = REPO / "fixtures" / "damaged"


def _rm_bias_dir(tmp: Path) -> Path:
    src = copy_fixture("no_ocdbt", tmp / "S")
    shutil.rmtree(src / "0" / "default" / "params.Dense_0.bias")
    return src


def _rm_bias_in_ocdbt(tmp: Path) -> Path:
    """The same leaf removed from inside the OCDBT database (header and chunks), by TensorStore."""
    import tensorstore as ts

    src = copy_fixture("seed_mlp", tmp / "S")
    item = src / "500" / "default"
    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{item}/"}).result()
    keys = [k for k in kv.list().result() if k.startswith(b"params.Dense_0.bias/")]
    assert keys, "the fixture stores params.Dense_0.bias"
    for k in keys:
        kv.delete_range(ts.KvStore.KeyRange(k, k + b"\0")).result()
    return src


def _copy_damaged(name: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        dst = tmp / "S"
        shutil.copytree(DAMAGED / name, dst, symlinks=True)
        return dst

    return make


SOURCES = [
    pytest.param(_rm_bias_dir, "params.Dense_0.bias", id="plain-leaf-dir-removed"),
    pytest.param(_rm_bias_in_ocdbt, "params.Dense_0.bias", id="ocdbt-leaf-removed"),
    pytest.param(_copy_damaged("deleted-manifest"), "manifest", id="deleted-manifest"),
    pytest.param(
        _copy_damaged("leaf-removed-from-metadata"),
        "params.Dense_1.kernel",
        id="leaf-removed-from-metadata",
    ),
]


@pytest.mark.parametrize(("make", "named"), SOURCES)
@pytest.mark.parametrize("command", ["reshard", "migrate"])
def test_writer_refuses_a_damaged_source(
    tmp_path: Path, make: Callable[[Path], Path], named: str, command: str
) -> None:
    src = make(tmp_path)
    dst = tmp_path / "D"
    if command == "reshard":
        run = ckpt("reshard", src, dst, "--mesh", "data=8")
    else:
        spec = tmp_path / "spec.yaml"
        spec.write_text("rules:\n  - {op: rename, from: 'step', to: 'step'}\n")
        run = ckpt("migrate", src, dst, "--spec", spec, "--allow-unused")
    assert run.code == 3, run.stdout[-300:]
    assert len(run.lines) == 1, run.stderr
    assert named in run.stderr and "ckpt verify" in run.stderr, run.stderr
    assert committed_steps(dst) == [] if dst.exists() else True


@pytest.mark.parametrize("make", [p.values[0] for p in SOURCES], ids=[p.id for p in SOURCES])
def test_verify_fails_each_damaged_source(tmp_path: Path, make: Callable[[Path], Path]) -> None:
    """The precondition of the test above: every one of these sources fails ``ckpt verify``."""
    run = ckpt("verify", make(tmp_path))
    assert run.code == 1, run.stdout


def test_verify_fails_an_array_leaf_without_data(tmp_path: Path) -> None:
    """What the laundering wrote: a jax.Array leaf marked ``skip_deserialize`` with no array.
    Made from a real Orbax output by the same edit."""
    src = copy_fixture("no_ocdbt", tmp_path / "S")
    item = src / "0" / "default"
    shutil.rmtree(item / "params.Dense_0.bias")

    def skip(m: dict) -> None:
        m["tree_metadata"]["('params', 'Dense_0', 'bias')"]["value_metadata"][
            "skip_deserialize"
        ] = True

    edit_json(item / "_METADATA", skip)
    run = ckpt("verify", src, "--deep")
    assert run.code == 1, run.stdout
    assert "params.Dense_0.bias" in run.stdout
