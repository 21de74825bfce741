"""``reshard`` of what the Orbax releases wrote (``fixtures/matrix/``), restored by Orbax 0.12.8:
zero-size arrays sharded along their empty dimension, Adam moments that follow their parameter,
and odd dict keys written without OCDBT inside the item."""

from __future__ import annotations

from pathlib import Path

import pytest

import ckpt_cli
from ckpt_cli.core.diff.items import diff_paths
from tests.support.matrix import array_leaves, fixture
from tests.support.orbax_restorer import OrbaxRestorer


@pytest.mark.slow
def test_zero_size_reshard_sharding_the_empty_dimension(
    tmp_path: Path, orbax: OrbaxRestorer
) -> None:
    f = fixture("0.5.20", "zero_size_plain")
    out = tmp_path / "out"
    rules = {"empty_2d": ["data", None], "empty_1d": ["data"], "empty_mid": [None, "data", None]}
    ckpt_cli.execute(ckpt_cli.plan_reshard(f.path, out, mesh="data=2", rules=rules))
    got = {x["keypath"][0][0]: x for x in orbax.item(out / "0" / "default")["leaves"]}
    assert {k: v["shape"] for k, v in got.items()} == {
        "empty_1d": [0],
        "empty_2d": [0, 16],
        "empty_mid": [3, 0, 2],
        "normal": [2, 3],
    }
    assert got["empty_1d"]["sharding"]["spec"] == ["data"]  # a jax.Array; the others are numpy
    assert diff_paths(str(f.path), str(out)).equal


@pytest.mark.parametrize("release", ["0.5.20", "0.12.8"])
@pytest.mark.slow
def test_reshard_moments_follow_their_parameter(
    release: str, tmp_path: Path, orbax: OrbaxRestorer
) -> None:
    f = fixture(release, "sharded")
    out = tmp_path / "out"
    plan = ckpt_cli.plan_reshard(
        f.path, out, mesh="data=2,model=2", rules={"params.w": ["model", "data"]}
    )
    assert {p.leaf.name: p.follows for p in plan.leaves if p.follows} == {
        "opt_state.mu.w": "params.w",
        "opt_state.nu.w": "params.w",
    }  # the planner's part: tests/core/reshard/test_plan.py
    ckpt_cli.execute(plan)
    step = str(f.latest()[0])
    got = {
        ".".join(k for k, _ in x["keypath"]): x
        for x in orbax.item(out / step / "default")["leaves"]
    }
    for name in ("params.w", "opt_state.mu.w", "opt_state.nu.w"):
        assert got[name]["sharding"]["spec"] == ["model", "data"], name


@pytest.mark.slow
def test_odd_keys_plain_output_stays_inside_the_item(tmp_path: Path, orbax: OrbaxRestorer) -> None:
    f = fixture("0.12.8", "odd_keys_plain")
    out = tmp_path / "out"
    write = ckpt_cli.WriteOptions(ocdbt=False)
    ckpt_cli.execute(ckpt_cli.plan_reshard(f.path, out, mesh="x=1", write=write))
    item = out / "0" / "default"
    assert (item / ".zarray").is_file() and (item / "trailing" / ".zarray").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    got = {tuple(k for k, _ in x["keypath"]): x["sha256"] for x in orbax.item(item)["leaves"]}
    want = array_leaves(f.truth["steps"]["0"]["items"]["default"])
    assert got == {kp: leaf["sha256"] for kp, leaf in want.items()}
