"""The migration planner never casts, resizes or sets PRNG key data unless a rule names that very
leaf: typed keys of ``flax.nnx`` (Orbax 0.11/0.12 ``nnx_model_optimizer``) and raw uint32 keys
(``prng_raw``) are skipped, with the reason, by rules matching ``.*``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ckpt_cli
from ckpt_cli.core.spec.language import parse_spec
from tests.support.matrix import Fixture, fixture


def _plan(f: Fixture, tmp_path: Path, rules: str) -> Any:
    spec = parse_spec(f"rules: [{rules}]\n".encode(), "spec.yaml")
    return ckpt_cli.plan_migration(f.path, tmp_path / "out", spec, allow_unused=True)


@pytest.mark.parametrize("release", ["0.11.19", "0.12.8"])
def test_cast_skips_key_data(release: str, tmp_path: Path) -> None:
    f = fixture(release, "nnx_model_optimizer")
    plan = _plan(f, tmp_path, "{op: cast, match: 'model\\..*', dtype: bfloat16}")
    skipped = {s.leaf: s.reason for s in plan.skipped}
    keys = {n: r for n, r in skipped.items() if r == "typed PRNG key"}
    assert keys and all(".rngs." in n for n in keys)
    assert all(r in ("typed PRNG key", "nnx RNG stream counter") for r in skipped.values())
    leaves = {leaf.name: leaf for leaf in plan.leaves}
    assert all(leaves[n].expr.dtype == "uint32" and not leaves[n].changed for n in skipped)
    assert leaves["model.linear.kernel.value"].expr.dtype == "bfloat16"
    assert plan.to_json()["skipped"] and not plan.unused_rules
    # Named exactly, key data is cast: the user asked for that very leaf.
    name = next(iter(keys))
    exact = _plan(
        f, tmp_path, "{op: cast, match: '" + name.replace(".", "\\.") + "', dtype: float32}"
    )
    assert not exact.skipped and {x.name: x for x in exact.leaves}[name].expr.dtype == "float32"


def test_resize_and_set_skip_raw_keys(tmp_path: Path) -> None:
    f = fixture("0.12.8", "prng_raw")
    names = [leaf.name for leaf in ckpt_cli.open(f.path).item().leaves if leaf.is_array]
    plan = _plan(f, tmp_path, "{op: resize, match: '.*', shape: [null, 4], init: zeros}")
    assert sorted(s.leaf for s in plan.skipped) == sorted(
        n for n in names if n.split(".")[0] in ("rng", "rngs", "key_batch")
    )
    assert not plan.changed
    plan = _plan(f, tmp_path, "{op: set, match: 'rng', value: 0}")  # exactly: `rng` is set
    assert not plan.skipped and [x.name for x in plan.changed] == ["rng"]
