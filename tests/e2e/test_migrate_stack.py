"""``migrate`` ``unstack`` and ``stack``: scanned <-> unscanned layers, Adam's moments following.

A scanned tree with optax Adam state is saved by Orbax; ``unstack`` gives one leaf per layer
(parameters and both moments), ``stack`` joins them back. Each result is restored by Orbax and
compared with the same arrays sliced and stacked in numpy; the round trip is bit-identical.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.orbax_truth import restore_leaves, same_bytes

pytestmark = pytest.mark.slow

UNSTACK = r"""
rules:
  - {op: unstack, match: 'params\.layers\.(.*)', to: 'params.layers_{i}.\1'}
"""
STACK = r"""
rules:
  - {op: stack, from: 'params\.layers_(?P<i>\d+)\.(.*)', to: 'params.layers.\2'}
"""


def save_scanned(root: Path) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import optax
    import orbax.checkpoint as ocp

    rs = np.random.RandomState(0)
    params = {
        "layers": {
            "kernel": jnp.asarray(rs.normal(size=(3, 4, 5)).astype(np.float32)),
            "scale": jnp.asarray(rs.normal(size=(3, 5)).astype(np.float32)),
        },
        "head": jnp.asarray(rs.normal(size=(5, 2)).astype(np.float32)),
    }
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)
    grads = jax.tree.map(lambda p: p * 0.5 + 1.0, params)
    _, opt_state = tx.update(grads, opt_state, params)  # non-zero moments
    state = {"params": params, "opt_state": opt_state, "step": jnp.asarray(7, jnp.int32)}
    with ocp.CheckpointManager(str(root)) as mgr:
        mgr.save(7, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
    return restore_leaves(root / "7" / "default")


def test_unstack_then_stack_with_optimizer_state(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    truth = save_scanned(tmp_path / "run")
    (tmp_path / "unstack.yaml").write_text(UNSTACK)
    (tmp_path / "stack.yaml").write_text(STACK)
    r = cli("migrate", tmp_path / "run", tmp_path / "flat", "--spec", tmp_path / "unstack.yaml", "--json")  # fmt: skip
    assert r.code == 0, r.stderr
    flat = restore_leaves(tmp_path / "flat" / "7" / "default")
    for prefix in ("params", "opt_state.0.mu", "opt_state.0.nu"):
        for leaf in ("kernel", "scale"):
            assert f"{prefix}.layers.{leaf}" not in flat
            for i in range(3):
                got = flat[f"{prefix}.layers_{i}.{leaf}"]
                assert same_bytes(got, np.ascontiguousarray(truth[f"{prefix}.layers.{leaf}"][i]))
        assert same_bytes(flat[f"{prefix}.head"], truth[f"{prefix}.head"])
    assert same_bytes(flat["opt_state.0.count"], truth["opt_state.0.count"])
    r = cli("migrate", tmp_path / "flat", tmp_path / "back", "--spec", tmp_path / "stack.yaml")
    assert r.code == 0, r.stderr
    back = restore_leaves(tmp_path / "back" / "7" / "default")
    assert sorted(back) == sorted(truth)
    assert all(same_bytes(back[k], truth[k]) for k in truth)


@pytest.mark.parametrize(
    ("spec", "phrase"),
    [
        (r"rules: [{op: unstack, match: 'params\.layers\.(.*)', to: 'params.layers.\1'}]", "{i}"),
        (r"rules: [{op: stack, from: 'params\.layers_(\d+)\.(.*)', to: 'params.l.\2'}]", "named i"),
        (r"rules: [{op: unstack, match: 'step', to: 's{i}'}]", "is a scalar"),
        (r"rules: [{op: stack, from: 'params\.layers\.(?P<i>kernel|scale)', to: 'params.x'}]", "not a layer number"),
    ],
)  # fmt: skip
def test_bad_stack_rules_are_refused(cli, tmp_path: Path, spec: str, phrase: str) -> None:  # type: ignore[no-untyped-def]
    save_scanned(tmp_path / "run")
    (tmp_path / "s.yaml").write_text(spec)
    r = cli("migrate", tmp_path / "run", tmp_path / "out", "--spec", tmp_path / "s.yaml")
    assert r.code == 3 and phrase in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
