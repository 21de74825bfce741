"""``explain``: each kind of difference named as what it is, with rules that migrate accepts."""

from __future__ import annotations

import re

from ckpt_cli.core.doctor.explain import explain, padding_init
from ckpt_cli.core.doctor.renames import change_of
from ckpt_cli.core.doctor.types import Finding, Leaves
from ckpt_cli.core.spec.language import parse_spec

F32 = "float32"


def kinds(findings: list[Finding]) -> list[str]:
    return [f.kind for f in findings]


def spec_of(findings: list[Finding]) -> None:
    """The rules parse as a migrate spec (raises RefusedError if not)."""
    import json

    rules = [r for f in findings for r in f.rules]
    assert rules
    text = "rules:\n" + "".join(f"  - {json.dumps(r)}\n" for r in rules)
    parse_spec(text.encode(), "t.yaml")


def test_identical_leaves_have_no_findings() -> None:
    leaves: Leaves = {"params.w": ((3, 4), F32), "step": ((), "int32"), "meta": (None, "string")}
    assert explain(dict(leaves), dict(leaves)) == []


def test_a_dtype_alone_does_not_block_orbax_casts_it() -> None:
    [f] = explain({"params.w": ((3, 4), F32)}, {"params.w": ((3, 4), "bfloat16")})
    assert (f.kind, f.blocks) == ("dtype", False)
    assert f.rules[0]["op"] == "cast" and f.rules[0]["dtype"] == "bfloat16"
    assert "Orbax casts" in f.message


def test_shapes_are_named_transposed_padded_truncated_reshaped_or_not_mappable() -> None:
    stored: Leaves = {
        "t": ((3, 4), F32),
        "p": ((16, 64), F32),
        "q": ((64, 10), F32),
        "r": ((8, 12), F32),
        "x": ((3, 4), F32),
    }
    expected: Leaves = {
        "t": ((4, 3), F32),
        "p": ((16, 128), F32),
        "q": ((32, 10), F32),
        "r": ((8, 3, 4), F32),
        "x": ((5, 7), F32),
    }
    found = {f.expected[0]: f for f in explain(stored, expected)}
    assert {n: f.kind for n, f in found.items()} == {
        "t": "transposed",
        "p": "padded",
        "q": "truncated",
        "r": "reshaped",
        "x": "shape",
    }
    assert found["t"].rules[0]["axes"] == [1, 0]
    assert found["p"].rules[0]["shape"] == [16, 128]
    assert found["x"].rules == () and found["x"].blocks
    spec_of([f for f in found.values() if f.rules])


def test_padding_starts_new_outputs_random_new_inputs_and_moments_at_zero() -> None:
    assert padding_init("params.Dense_0.kernel", 1, 2) == "lecun_normal"
    assert padding_init("params.Dense_1.kernel", 0, 2) == "zeros"
    assert padding_init("opt_state.0.mu.Dense_0.kernel", 1, 2) == "zeros"
    assert padding_init("params.Dense_0.bias", 0, 1) == "zeros"
    assert padding_init("params.LayerNorm_0.scale", 0, 1) == "constant(1.0)"


def test_an_nnx_variable_value_is_initialised_as_its_variable() -> None:
    assert padding_init("model.encoder.kernel.value", 1, 2) == "lecun_normal"
    assert padding_init("model.head.kernel.value", 0, 2) == "zeros"
    assert padding_init("optimizer.opt_state.0.mu.encoder.kernel.value", 1, 2) == "zeros"
    assert padding_init("norm.scale.value", 0, 1) == "constant(1.0)"


def test_a_renamed_module_is_one_rule_for_params_and_moments() -> None:
    names = ["params.{}.kernel", "params.{}.bias", "opt.mu.{}.kernel", "opt.mu.{}.bias"]
    shapes = [(4, 8), (8,), (4, 8), (8,)]
    stored = {n.format("Dense_0"): (s, F32) for n, s in zip(names, shapes, strict=True)}
    expected = {n.format("encoder"): (s, F32) for n, s in zip(names, shapes, strict=True)}
    [f] = explain(stored, expected)
    assert f.kind == "rename" and len(f.stored) == 4
    [rule] = f.rules
    for old, new in zip(sorted(stored), sorted(expected), strict=True):
        m = re.fullmatch(str(rule["from"]), old)
        assert m is not None and m.expand(str(rule["to"])) == new
    spec_of([f])


def test_linen_to_nnx_nesting_is_one_affix_rename() -> None:
    stored = {"params.Dense_0.kernel": ((4, 8), F32), "params.Dense_0.bias": ((8,), F32)}
    expected = {"Dense_0.kernel.value": ((4, 8), F32), "Dense_0.bias.value": ((8,), F32)}
    assert change_of("params.Dense_0.kernel", "Dense_0.kernel.value") == (
        "affix",
        "params",
        "",
        "",
        "value",
    )
    [f] = explain(stored, expected)
    assert f.kind == "rename" and f.rules[0]["from"] == r"params\.(.*)"
    assert f.rules[0]["to"] == r"\g<1>.value"


def test_a_renamed_index_followed_by_digits_is_no_other_group() -> None:
    stored = {"opt.0.mu.w": ((2,), F32), "opt.0.nu.w": ((2,), F32)}
    expected = {"opt.1.0.mu.w": ((2,), F32), "opt.1.0.nu.w": ((2,), F32)}
    [f] = explain(stored, expected)
    [rule] = f.rules
    for old, new in zip(sorted(stored), sorted(expected), strict=True):
        m = re.fullmatch(str(rule["from"]), old)
        assert m is not None and m.expand(str(rule["to"])) == new
    spec_of([f])


def test_a_rename_that_would_catch_other_leaves_falls_back_to_literal_rules() -> None:
    stored = {"a.x.w": ((2,), F32), "b.x.w": ((3,), F32), "a.x.keep": ((9,), F32)}
    expected = {"a.y.w": ((2,), F32), "b.y.w": ((3,), F32), "a.x.keep": ((9,), F32)}
    found = explain(stored, expected)
    assert kinds(found) == ["rename", "rename"]
    assert all(len(f.rules) == 1 and "\\" in str(f.rules[0]["from"]) for f in found)


def test_two_equally_likely_partners_are_ambiguous_not_guessed() -> None:
    stored = {"params.old.w": ((4,), F32)}
    expected = {"params.new_a.w": ((4,), F32), "params.new_b.w": ((4,), F32)}
    found = explain(stored, expected)
    assert kinds(found) == ["ambiguous"]
    assert found[0].blocks and not found[0].rules


def test_numbered_layers_stack_into_a_scanned_leaf_and_back() -> None:
    unstacked = {f"params.layers_{i}.kernel": ((4, 4), F32) for i in range(3)}
    stacked = {"params.layers.kernel": ((3, 4, 4), F32)}
    [f] = explain(dict(unstacked), dict(stacked))
    assert f.kind == "stacked" and len(f.stored) == 3
    assert re.fullmatch(str(f.rules[0]["from"]), "params.layers_2.kernel")
    [g] = explain(dict(stacked), dict(unstacked))
    assert g.kind == "unstacked" and g.rules[0]["to"] == "params.layers_{i}.kernel"
    spec_of([f, g])


def test_leaves_on_one_side_only_are_missing_or_unexpected() -> None:
    kept = {"params.w": ((100, 100), F32)}  # the model the checkpoint does hold
    found = explain(
        {"a": ((2,), F32), "s": (None, "string"), **kept}, {"b": ((9, 9), "int8"), **kept}
    )
    assert kinds(found) == ["unexpected", "missing", "unexpected"] or sorted(kinds(found)) == [
        "missing",
        "unexpected",
        "unexpected",
    ]
    missing = next(f for f in found if f.kind == "missing")
    assert missing.rules[0]["op"] == "add" and missing.rules[0]["shape"] == [9, 9]
    spec_of(found)


def test_a_layer_renamed_and_widened_is_a_rename_then_a_pad() -> None:
    stored: Leaves = {"params.Dense_0.kernel": ((16, 64), F32), "params.Dense_0.bias": ((64,), F32)}
    target: Leaves = {
        "params.encoder.kernel": ((16, 128), F32),
        "params.encoder.bias": ((128,), F32),
    }
    found = explain(stored, target)
    assert sorted(kinds(found)) == ["padded", "padded", "rename"]
    [rename] = [f for f in found if f.kind == "rename"]
    assert "shapes differing on one axis" in rename.message
    spec_of(found)


def test_shapes_differing_on_two_axes_are_never_renamed() -> None:
    found = explain({"params.a.kernel": ((16, 64), F32)}, {"params.b.kernel": ((20, 128), F32)})
    assert sorted(kinds(found)) == ["missing", "unexpected"]


def test_an_injected_hyperparameter_is_never_added_as_zeros() -> None:
    kept = {"params.w": ((4, 4), F32)}
    found = explain(kept, {**kept, "opt_state.hyperparams.learning_rate": ((), F32)})
    [f] = found
    assert f.kind == "missing" and not f.rules and "inject_hyperparams" in f.message


def test_a_target_mostly_absent_from_the_checkpoint_is_another_model() -> None:
    found = explain({"params.w": ((4,), F32)}, {"params.w": ((4,), F32), "e": ((100, 32), F32)})
    [f] = found
    assert f.kind == "missing" and not f.rules and "another model" in f.message
    small = explain(
        {"params.w": ((100, 32), F32)}, {"params.w": ((100, 32), F32), "h": ((4,), F32)}
    )
    assert small[0].rules[0]["op"] == "add"
