"""``reshard`` and ``migrate`` on every fixture of the matrix, proven by Orbax 0.12.8's restore.

Per fixture, the latest committed step's state item is rewritten, then restored by the project's
Orbax (0.12.8, one restore process per test worker: the ``orbax`` fixture of
``tests/support/orbax_restorer.py``) and compared, value for value, with what the fixture's own
release restored (``truth.json``):

- ``reshard`` to a (data=2, model=4) mesh, every jax.Array that is no optimizer state sharded
  where its dimensions allow it, by rules naming leaves exactly (odd dict keys included):
  the values are the truth's, each leaf restores with the planned sharding, and optimizer
  moments (Adam ``mu``/``nu``) come out sharded like their parameter.
- ``migrate`` with one rule casting every leaf (``.*``) to float64 but complex and scalar ones:
  the values are the truth's cast with numpy, except PRNG key data, which the plan skips and
  names, and which restores bit for bit (typed keys still typed).

Both also check that Orbax lists the new root's one step and restores every other item of the
step (JSON, ArraySave) copied as is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import ckpt_cli
from ckpt_cli.core.format.names import parse_step_name
from ckpt_cli.core.spec.language import parse_spec
from tests.support.matrix import (
    Fixture,
    Keypath,
    all_fixtures,
    array_leaves,
    restored_dtype_shape,
    sha256,
)
from tests.support.orbax_restorer import OrbaxRestorer

pytestmark = pytest.mark.slow  # every output is restored by Orbax

FIXTURES = all_fixtures()
ids = [f.id for f in FIXTURES]
MESH = {"data": 2, "model": 4}
_OPT = {"opt_state", "optimizer", "optimizer_state", "opt"}
_RNG = re.compile(r"(^|_)(rngs?|keys?|prng|seed)(_|$)|rng")


def _exact(name: str) -> str:
    return "re:" + re.escape(name)


def _source(f: Fixture) -> tuple[Any, int | None, dict[str, Any]]:
    """The item ckpt picks by itself (the one state item), its step, and the step's truth."""
    step, sd = f.latest()
    item = ckpt_cli.open(f.path).item(step=step)
    return item, step, sd


def _spec(shape: tuple[int, ...]) -> list[str | None]:
    if not shape:
        return []
    spec: list[str | None] = [None] * len(shape)
    if shape[0] % MESH["data"] == 0:
        spec[0] = "data"
    if len(shape) >= 2 and shape[-1] % MESH["model"] == 0:
        spec[-1] = "model"
    return spec


def _output_step(out: Path, step: int | None) -> tuple[Path, int]:
    dirs = {
        p: parsed.step
        for p in out.iterdir()
        if p.is_dir() and (parsed := parse_step_name(p.name)) and not parsed.tmp
    }
    assert len(dirs) == 1, sorted(p.name for p in out.iterdir())
    ((sdir, number),) = dirs.items()
    if step is not None:
        assert number == step
    return sdir, number


def _restore_step(
    orbax: OrbaxRestorer, out: Path, step: int | None, sd: dict[str, Any], name: str, f: Fixture
) -> dict[str, Any]:
    """Orbax, with the naming options the source was saved with (the output keeps its step
    names), lists the one step of ``out`` and restores every item; returns the rewritten one."""
    sdir, number = _output_step(out, step)
    assert orbax.steps(out, f.truth.get("manager_options")) == [number]
    restored: dict[str, Any] = {}
    for item_name, truth in sd["items"].items():
        got = orbax.item(sdir / item_name, truth["kind"])
        if item_name != name:
            if truth["kind"] == "json":
                assert got["value"] == truth["value"], item_name
            else:
                _same_values(array_leaves(truth), _by_keypath(got["leaves"]), item_name)
        restored[item_name] = got
    return restored[name]


def _by_keypath(leaves: list[dict[str, Any]]) -> dict[Keypath, dict[str, Any]]:
    return {tuple(k for k, _ in leaf["keypath"]): leaf for leaf in leaves if "sha256" in leaf}


def _same_values(
    want: dict[Keypath, dict[str, Any]], got: dict[Keypath, dict[str, Any]], where: str
) -> None:
    assert sorted(got) == sorted(want), where
    for kp, leaf in want.items():
        g = got[kp]
        assert g["sha256"] == leaf["sha256"], (where, kp)
        assert restored_dtype_shape(g) == restored_dtype_shape(leaf), (where, kp)


def _trimmed(spec: list[Any] | None) -> list[Any]:
    spec = list(spec or [])
    while spec and spec[-1] is None:
        spec.pop()
    return spec


@pytest.mark.parametrize("f", FIXTURES, ids=ids)
def test_reshard(f: Fixture, tmp_path: Path, orbax: OrbaxRestorer) -> None:
    item, step, sd = _source(f)
    rules: dict[str, list[str | None]] = {}
    param_spec: dict[str, list[str | None]] = {}
    for leaf in item.leaves:
        if leaf.value_type != "jax.Array" or leaf.shape is None or leaf.random_key_impl:
            continue
        if any(k.lower() in _OPT for k in leaf.keypath):
            continue
        rules[_exact(leaf.name)] = _spec(leaf.shape)
        param_spec[leaf.name] = rules[_exact(leaf.name)]
    out = tmp_path / "out"
    plan = ckpt_cli.plan_reshard(
        f.path,
        out,
        mesh=",".join(f"{k}={v}" for k, v in MESH.items()),
        rules=rules,
        step=step,
        item=item.name,
    )
    assert plan.refusal is None, plan.refusal
    ckpt_cli.execute(plan)
    got = _restore_step(orbax, out, step, sd, item.name, f)
    want = array_leaves(sd["items"][item.name])
    restored = _by_keypath(got["leaves"])
    _same_values(want, restored, item.name)
    planned = {p.leaf.keypath: p for p in plan.leaves}
    for kp, leaf in restored.items():
        p = planned[kp]
        if p.spec is None or leaf["kind"] != "jax.Array":
            continue
        assert _trimmed(leaf.get("sharding", {}).get("spec")) == _trimmed(list(p.spec)), kp
        if p.leaf.name in param_spec:
            assert _trimmed(list(p.spec)) == _trimmed(param_spec[p.leaf.name]), kp
    for p in plan.leaves:  # moments of a sharded parameter follow it, and the plan says so
        if p.follows is not None:
            assert _trimmed(list(p.spec or ())) == _trimmed(param_spec[p.follows]), p.leaf.name


def _migration_spec(item: Any) -> tuple[Any, set[str]]:
    excluded = {
        leaf.name
        for leaf in item.leaves
        if leaf.is_array and (leaf.value_type == "scalar" or str(leaf.dtype).startswith("complex"))
    }
    doc = "rules:\n  - {op: cast, match: '.*', dtype: float64"
    if excluded:
        doc += ", exclude: [" + ", ".join(repr(re.escape(n)) for n in sorted(excluded)) + "]"
    doc += "}\n"
    return parse_spec(doc.encode(), "matrix.yaml"), excluded


def _key_data(leaf: Any) -> bool:
    """PRNG key data by this test's own reading of the rule: typed keys, and uint32 [..., 2|4]
    under a key-ish name."""
    if leaf.random_key_impl:
        return True
    if leaf.dtype != "uint32" or not leaf.shape or leaf.shape[-1] not in (2, 4):
        return False
    return any(_RNG.search(k.lower()) for k in leaf.keypath)


def _values(truth: dict[str, Any], item: Any, name: str) -> Any:
    """A source leaf's values: from the truth when it lists them (64 elements at most), else
    read (test_inspect proves the reads equal the restore)."""
    import numpy as np

    if "values" not in truth or truth["kind"] == "typed_key":
        return np.asarray(item.read(name))
    dtype = np.dtype(truth["dtype"]) if truth["dtype"] != "bfloat16" else np.float32
    if truth["dtype"] in ("bfloat16",) or truth["dtype"].startswith(("float8", "int4", "uint4")):
        return np.asarray(item.read(name))  # ml_dtypes: read them, numpy has no such names
    return np.asarray(truth["values"], dtype=dtype).reshape(truth["shape"])


@pytest.mark.parametrize("f", FIXTURES, ids=ids)
def test_migrate(f: Fixture, tmp_path: Path, orbax: OrbaxRestorer) -> None:
    import numpy as np

    item, step, sd = _source(f)
    spec, excluded = _migration_spec(item)
    out = tmp_path / "out"
    plan = ckpt_cli.plan_migration(f.path, out, spec, step=step, item=item.name, allow_unused=True)
    assert plan.refusal is None, plan.refusal
    keys = {leaf.name for leaf in item.leaves if leaf.is_array and _key_data(leaf)}
    assert {s.leaf for s in plan.skipped} >= keys
    ckpt_cli.execute(plan)
    got = _by_keypath(_restore_step(orbax, out, step, sd, item.name, f)["leaves"])
    want = array_leaves(sd["items"][item.name])
    assert sorted(got) == sorted(want)
    skipped = {s.leaf for s in plan.skipped}
    for leaf in item.leaves:
        if not leaf.is_array:
            continue
        g, w = got[leaf.keypath], want[leaf.keypath]
        if leaf.name in excluded or leaf.name in skipped:
            assert g["sha256"] == w["sha256"], leaf.name
            assert restored_dtype_shape(g) == restored_dtype_shape(w), leaf.name
            continue
        expected = _values(w, item, leaf.name).astype(np.float64)
        assert (g["dtype"], g["shape"]) == ("float64", list(expected.shape)), leaf.name
        assert g["sha256"] == sha256(expected), leaf.name
