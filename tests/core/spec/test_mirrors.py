"""Subtrees that mirror the parameters (a float32 master copy, an EMA) follow structural rules as
the optimizer moments do, but not casts; a rule written for a mirror changes that mirror only.

The trees here are plans over leaves of known shapes and dtypes (as ``import`` plans tensors);
the values are proven by the Orbax round trip in ``tests/e2e/test_migrate_mirrors_orbax.py``.
"""

from __future__ import annotations

from ckpt_cli.core.spec import ops
from ckpt_cli.core.spec.apply import apply_rules
from ckpt_cli.core.spec.language import parse_spec
from ckpt_cli.core.spec.tree import Work, followed_families, mirrors_by_root

LAYERS = {"Dense_0.kernel": (4, 8), "Dense_0.bias": (8,), "Dense_1.kernel": (8, 2)}
TREES = {
    "params": "bfloat16",
    "master_params": "float32",
    "ema_params": "bfloat16",
    "opt_state.0.mu": "float32",
    "opt_state.0.nu": "float32",
}


def leaf(name: str, shape: tuple[int, ...], dtype: str) -> Work:
    keypath = tuple(name.split("."))
    expr = ops.Const(shape=shape, dtype=dtype, value=0)
    return Work(keypath, (None,) * len(keypath), "jax.Array", expr, (name,), None, name)


def state(trees: dict[str, str] = TREES, layers: dict[str, tuple[int, ...]] = LAYERS) -> list[Work]:
    work = [
        leaf(f"{t}.{rel}", shape, dtype)
        for t, dtype in trees.items()
        for rel, shape in layers.items()
    ]
    return [*work, leaf("opt_state.0.count", (), "int32"), leaf("step", (), "int32")]


def migrate(rules: str, work: list[Work] | None = None) -> dict[str, Work]:
    spec = parse_spec(f"rules:\n{rules}".encode(), "spec.yaml")
    out, unused = apply_rules(work if work is not None else state(), spec)
    assert not unused
    return {w.name: w for w in out}


def dtype(w: Work) -> str:
    assert w.expr is not None
    return w.expr.dtype


def test_master_and_ema_are_mirrors_of_params_and_moments_are_not() -> None:
    mirrors = mirrors_by_root(state())
    assert mirrors == {("master_params",): ("params",), ("ema_params",): ("params",)}


def test_a_nested_ema_of_the_params_is_a_mirror() -> None:
    work = state({"params": "float32", "ema.params": "float32", "opt_state.0.mu": "float32"})
    assert mirrors_by_root(work) == {("ema", "params"): ("params",)}


def test_without_params_the_ema_is_what_rules_target() -> None:
    work = state({"ema_params": "float32", "master_params": "float32"})
    assert mirrors_by_root(work) == {("master_params",): ("ema_params",)}


def test_a_partial_copy_or_batch_stats_is_no_mirror() -> None:
    work = state({"params": "float32"})
    work += [leaf("ema_params.Dense_0.kernel", (4, 8), "float32")]  # one leaf only
    work += [leaf("batch_stats.Dense_0.bias", (8,), "float32")]
    work += [leaf("other.Dense_0.kernel", (4, 9), "float32")]  # another shape
    assert mirrors_by_root(work) == {}
    out = migrate(r"  - {op: rename, from: 'params\.Dense_0\.(.*)', to: 'params.hidden.\1'}", work)
    assert {"ema_params.Dense_0.kernel", "batch_stats.Dense_0.bias", "other.Dense_0.kernel"} <= set(
        out
    )


def test_rename_carries_master_ema_and_moments() -> None:
    out = migrate(r"  - {op: rename, from: 'params\.Dense_0\.(.*)', to: 'params.hidden.\1'}")
    for tree in TREES:
        assert f"{tree}.hidden.kernel" in out and f"{tree}.Dense_0.kernel" not in out
        assert f"{tree}.hidden.bias" in out and f"{tree}.Dense_1.kernel" in out
    step = out["master_params.hidden.kernel"].steps[-1]
    assert step.via == "params.Dense_0.kernel"
    assert step.text() == (
        "rename master_params.Dense_0.kernel -> master_params.hidden.kernel "
        "(follows params.Dense_0.kernel) [rule 1]"
    )


def test_cast_of_params_leaves_master_and_ema_as_they_are() -> None:
    out = migrate(r"  - {op: cast, match: 'params\..*', dtype: float16}")
    assert dtype(out["params.Dense_0.kernel"]) == "float16"
    assert dtype(out["master_params.Dense_0.kernel"]) == "float32"
    assert dtype(out["ema_params.Dense_0.kernel"]) == "bfloat16"
    assert not out["master_params.Dense_0.kernel"].steps


def test_cast_follows_the_mirrors_when_asked() -> None:
    out = migrate(r"  - {op: cast, match: 'params\..*', dtype: float16, follow_mirrors: true}")
    assert dtype(out["master_params.Dense_1.kernel"]) == "float16"
    assert dtype(out["ema_params.Dense_1.kernel"]) == "float16"
    assert dtype(out["opt_state.0.mu.Dense_1.kernel"]) == "float32"


def test_a_rule_for_the_ema_changes_the_ema_only() -> None:
    out = migrate(
        r"  - {op: rename, from: 'ema_params\.Dense_0\.(.*)', to: 'ema_params.hidden.\1'}"
    )
    assert "ema_params.hidden.kernel" in out
    for tree in ("params", "master_params", "opt_state.0.mu", "opt_state.0.nu"):
        assert f"{tree}.Dense_0.kernel" in out and f"{tree}.hidden.kernel" not in out


def test_a_pattern_over_every_tree_takes_each_leaf_once() -> None:
    out = migrate(r"  - {op: rename, from: '(.*)\.Dense_1\.kernel', to: '\1.head.kernel'}")
    for tree in TREES:
        assert f"{tree}.head.kernel" in out
    assert not out["master_params.head.kernel"].steps[-1].via  # matched, not followed


def test_resize_pads_mirrors_with_the_params_values_and_moments_with_zeros() -> None:
    out = migrate(
        "  - {op: resize, match: 'params\\.Dense_0\\.kernel', shape: [null, 16], init: 'normal(0.02)'}"
    )
    for tree in TREES:
        node = out[f"{tree}.Dense_0.kernel"].expr
        assert isinstance(node, ops.Resize) and node.shape == (4, 16)
    param, master = out["params.Dense_0.kernel"].expr, out["master_params.Dense_0.kernel"].expr
    assert isinstance(param, ops.Resize) and isinstance(master, ops.Resize)
    assert (
        master.init == param.init and master.key_name == param.key_name == "params.Dense_0.kernel"
    )
    assert master.dtype == "float32" and param.dtype == "bfloat16"
    mu = out["opt_state.0.mu.Dense_0.kernel"].expr
    assert isinstance(mu, ops.Resize) and mu.init is not None and mu.init.kind == "zeros"


def test_follow_mirrors_false_leaves_them() -> None:
    out = migrate(
        r"  - {op: rename, from: 'params\.Dense_0\.(.*)', to: 'params.hidden.\1', follow_mirrors: false}"
    )
    assert "master_params.Dense_0.kernel" in out and "opt_state.0.mu.hidden.kernel" in out


def test_drop_split_and_add_reach_the_mirrors() -> None:
    out = migrate(
        r"""  - {op: drop, match: 'params\.Dense_0\.bias'}
  - {op: split, match: 'params\.Dense_1\.kernel', into: ['params.a.kernel', 'params.b.kernel'], axis: 0}
  - {op: add, name: params.c.bias, shape: [3], dtype: bfloat16, init: 'normal(0.1)'}"""
    )
    for tree in TREES:
        assert f"{tree}.Dense_0.bias" not in out
        assert f"{tree}.a.kernel" in out and f"{tree}.b.kernel" in out
        assert f"{tree}.c.bias" in out
    master, param = out["master_params.c.bias"].expr, out["params.c.bias"].expr
    assert isinstance(master, ops.Init) and isinstance(param, ops.Init)
    assert (master.dtype, master.init, master.key_name) == ("float32", param.init, "params.c.bias")
    mu = out["opt_state.0.mu.c.bias"].expr
    assert isinstance(mu, ops.Init) and mu.init.kind == "zeros"


def test_stack_and_unstack_reach_the_mirrors() -> None:
    layers = {f"layers_{i}.kernel": (4, 4) for i in range(3)}
    work = state(layers=layers)
    stacked = migrate(
        r"  - {op: stack, from: 'params\.layers_(?P<i>\d+)\.kernel', to: 'params.layers.kernel'}",
        work,
    )
    for tree in TREES:
        w = stacked[f"{tree}.layers.kernel"]
        assert w.expr is not None and w.expr.shape == (3, 4, 4)
        assert f"{tree}.layers_0.kernel" not in stacked
    back = migrate(
        r"  - {op: unstack, match: 'params\.layers\.kernel', to: 'params.layers_{i}.kernel'}",
        list(stacked.values()),
    )
    assert {n for n in back if "layers" in n} == {f"{t}.{r}" for t in TREES for r in layers}


def test_concat_reaches_the_mirrors() -> None:
    out = migrate(
        r"  - {op: concat, from: ['params\.q\.kernel', 'params\.k\.kernel'], to: 'params.qk.kernel', axis: 1}",
        state(layers={"q.kernel": (4, 4), "k.kernel": (4, 4)}),
    )
    for tree in TREES:
        w = out[f"{tree}.qk.kernel"]
        assert w.expr is not None and w.expr.shape == (4, 8)
        assert f"{tree}.q.kernel" not in out


def test_follow_mirrors_defaults_to_follow_optimizer_defaults() -> None:
    spec = parse_spec(
        rb"""rules:
  - {op: rename, from: 'params\.a', to: 'params.b'}
  - {op: cast, match: 'params\..*', dtype: float16}
  - {op: set, match: 'params\.b', value: 0, follow_mirrors: true}
""",
        "spec.yaml",
    )
    assert [r.follow_mirrors for r in spec.rules] == [True, False, True]


def test_the_plan_counts_what_followed_each_rule_by_family() -> None:
    out = migrate(
        r"""  - {op: rename, from: 'params\.Dense_0\.(.*)', to: 'params.hidden.\1'}
  - {op: cast, match: 'params\..*', dtype: float16}
  - {op: drop, match: 'ema_params\.Dense_1\.kernel'}"""
    )
    assert followed_families(list(out.values())) == {
        1: {"opt_state.0.mu": 2, "opt_state.0.nu": 2, "master_params": 2, "ema_params": 2}
    }  # rule 3 made the EMA no mirror of the result: it counts under its first name
