"""Spec parsing: every op reads, every mistake is one line naming the rule and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_cli.core.spec.initializers import Initializer
from ckpt_cli.core.spec.language import load_spec, parse_spec
from ckpt_cli.errors import NotFoundError, RefusedError, UsageError

EVERY_OP = r"""
version: 1
seed: 7
rules:
  - {op: rename, from: 'params\.Dense_(\d+)\.(.*)', to: 'params.layer_\1.\2'}
  - {op: drop, match: 'opt_state\..*', follow_optimizer: false}
  - {op: keep_only, match: ['params\..*', 'step'], exclude: ['params\.tmp']}
  - {op: cast, match: 'params\..*', dtype: bfloat16}
  - {op: cast, match: 'step', dtype: int16, rounding: nearest}
  - {op: resize, match: 'params\.w', shape: [null, 128], init: 'normal(0.02)'}
  - {op: reshape, match: 'params\.w', shape: [-1, 4]}
  - {op: transpose, match: 'params\.w', axes: [1, 0]}
  - {op: split, match: 'params\.(\w+)\.qkv', into: ['params.\1.q', 'params.\1.k', 'params.\1.v'], axis: -1, sizes: [2, 2, 4]}
  - {op: concat, from: ['params\.(\w+)\.q', 'params\.(\w+)\.k'], to: 'params.\1.qk', axis: 1}
  - {op: add, name: params.new.bias, shape: [8], init: {name: truncated_normal, stddev: 0.1}}
  - {op: set, match: 'step|opt_state\.0\.count', value: 0}
  - {op: python, match: 'params\.x', function: 'mypkg.fix:scale', shape: [4], dtype: float32}
"""


def parse(text: str, path: str = "spec.yaml") -> object:
    return parse_spec(text.encode(), path)


def test_every_op_parses() -> None:
    spec = parse_spec(EVERY_OP.encode(), "s.yaml")
    ops = [r.op for r in spec.rules]
    assert ops == [
        "rename", "drop", "keep_only", "cast", "cast", "resize", "reshape", "transpose",
        "split", "concat", "add", "set", "python",
    ]  # fmt: skip
    r = spec.rules
    assert r[0].selects("params.Dense_3.kernel") and not r[0].selects("xparams.Dense_3.kernel")
    assert r[0].follow_optimizer and not r[1].follow_optimizer
    assert r[2].selects("step") and not r[2].selects("params.tmp")
    assert r[3].dtype == "bfloat16" and not r[3].follow_optimizer  # casts do not follow by default
    assert r[4].rounding == "nearest"
    assert r[5].shape == (None, 128) and r[5].init == Initializer("normal", 0.02, seed=7)
    assert r[6].shape == (-1, 4) and r[7].axes == (1, 0)
    assert r[8].into == ("params.\\1.q", "params.\\1.k", "params.\\1.v") and r[8].sizes == (2, 2, 4)
    assert len(r[9].match) == 2 and r[9].to == "params.\\1.qk"
    assert r[10].dtype == "float32" and r[10].init == Initializer("truncated_normal", 0.1, seed=7)
    assert r[11].value == 0 and r[12].function == "mypkg.fix:scale"
    assert spec.python_rules == [r[12]] and spec.seed == 7 and len(spec.sha256) == 64


def test_toml_and_bare_list(tmp_path: Path) -> None:
    toml = tmp_path / "spec.toml"
    toml.write_text(
        "[[rules]]\nop = 'cast'\nmatch = 'params\\..*'\ndtype = 'float16'\n"
        "[[rules]]\nop = 'add'\nname = 'params.b'\nshape = [3]\ninit = 'constant(1)'\n"
    )
    spec = load_spec(str(toml))
    assert [r.op for r in spec.rules] == ["cast", "add"]
    assert spec.rules[1].init == Initializer("constant", value=1)
    bare = parse_spec(b"- {op: drop, match: x}\n", "s.yaml")
    assert bare.rules[0].op == "drop"  # type: ignore[attr-defined]
    with pytest.raises(NotFoundError):
        load_spec(str(tmp_path / "missing.yaml"))


BAD = [
    ("rules: [{op: renmae, from: a, to: b}]", "rule 1: field 'op': unknown op 'renmae' (did you mean 'rename'?)"),
    ("rules: [{op: rename, from: 'a(b)', to: 'x\\2'}]", "rule 1 (rename): field 'to': \\2 refers to group 2"),
    ("rules: [{op: drop, match: a}, {op: cast, match: a, dtype: bfloat61}]", "rule 2 (cast): field 'dtype': unknown dtype 'bfloat61' (did you mean 'bfloat16'?)"),
    ("rules: [{op: cast, match: a, dtpye: float16}]", "rule 1 (cast): field 'dtpye': not a field of cast (did you mean 'dtype'?)"),
    ("rules: [{op: cast, match: a}]", "rule 1 (cast): field 'dtype': missing"),
    ("rules: [{op: cast, match: a, dtype: bool}]", "rule 1 (cast): field 'dtype': casting to bool is refused"),
    ("rules: [{op: cast, match: a, dtype: int8, rounding: up}]", "rule 1 (cast): field 'rounding': expected one of nearest"),
    ("rules: [{op: resize, match: a, shape: [2, x]}]", "rule 1 (resize): field 'shape': expected an integer"),
    ("rules: [{op: resize, match: a, shape: [2], init: norml}]", "rule 1 (resize): field 'init': unknown initialiser 'norml'"),
    ("rules: [{op: reshape, match: a, shape: [-1, -1]}]", "rule 1 (reshape): field 'shape': at most one dimension may be -1"),
    ("rules: [{op: transpose, match: a, axes: [0, 0]}]", "rule 1 (transpose): field 'axes': [0, 0] is not a permutation"),
    ("rules: [{op: split, match: a, into: [b, c], axis: 0, sizes: [1]}]", "rule 1 (split): field 'sizes': 1 sizes for 2 outputs"),
    ("rules: [{op: split, match: a, into: [b], axis: 0}]", "rule 1 (split): field 'into': expected a list of at least 2"),
    ("rules: [{op: concat, from: ['a(\\d)', 'b'], to: c, axis: 0}]", "rule 1 (concat): field 'from': every pattern must have the same number of groups"),
    ("rules: [{op: add, name: 'params..w', shape: [2]}]", "rule 1 (add): field 'name': expected a dotted leaf name"),
    ("rules: [{op: add, name: params.w, shape: [2], init: lecun_normal}]", "rule 1 (add): field 'init': lecun_normal needs fans"),
    ("rules: [{op: set, match: step, value: zero}]", "rule 1 (set): field 'value': expected a number"),
    ("rules: [{op: python, match: a, function: 'not a function'}]", "rule 1 (python): field 'function': expected MODULE:FUNCTION"),
    ("rules: [{op: drop, match: a, follow_optimizer: maybe}]", "rule 1 (drop): field 'follow_optimizer': expected true or false"),
    ("rules: [{op: keep_only, match: a, follow_optimizer: true}]", "rule 1 (keep_only): field 'follow_optimizer': not a field of keep_only"),
    ("rules: [drop]", "rule 1: expected a mapping with an `op`"),
    ("rules: []", "field 'rules': expected a non-empty list"),
    ("version: 2\nrules: [{op: drop, match: a}]", "field 'version': only version 1 exists"),
    ("seed: -1\nrules: [{op: drop, match: a}]", "field 'seed': expected a non-negative integer"),
    ("rulez: []", "unknown top-level field 'rulez' (did you mean 'rules'?)"),
    ("rules: [{op: drop, match: 'a'", "is not valid YAML"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_specs_name_the_rule_and_the_field(text: str, message: str) -> None:
    with pytest.raises(RefusedError) as info:
        parse_spec(text.encode(), "bad.yaml")
    line = str(info.value)
    assert "\n" not in line
    assert line.startswith("spec bad.yaml")
    assert message in line
    assert info.value.exit_code == 3


@pytest.mark.parametrize(
    ("text", "field", "pattern"),
    [
        ("rules: [{op: rename, from: 'params.(', to: b}]", "rule 1 (rename): field 'from'", "params.("),
        ("rules: [{op: drop, match: x, exclude: ['(?=a)']}]", "rule 1 (drop): field 'exclude'", "(?=a)"),
        ("rules: [{op: concat, from: [a, 're:b)'], to: c, axis: 0}]", "rule 1 (concat): field 'from'", "re:b)"),
    ],
)  # fmt: skip
def test_a_bad_pattern_is_a_usage_error_of_the_spec(text: str, field: str, pattern: str) -> None:
    """As for --filter: exit 2, one line naming the rule, the field, the pattern and RE2's reason."""
    with pytest.raises(UsageError) as info:
        parse_spec(text.encode(), "bad.yaml")
    line = str(info.value)
    assert "\n" not in line and info.value.exit_code == 2
    assert line.startswith(f"spec bad.yaml: {field} {pattern!r} is not a valid pattern (RE2: ")
    assert "docs/reference/layouts.md#leaf-patterns" in (info.value.hint or "")


def test_spec_patterns_are_leaf_patterns_matched_against_the_whole_name() -> None:
    """The one language of --filter and reshard rules: a glob, an RE2 regex, or re:REGEX."""
    spec = parse_spec(
        b"rules: [{op: drop, match: ['params.*kernel', 're:opt_state\\..*', 'step|rng']}]\n",
        "s.yaml",
    )
    (rule,) = spec.rules
    for name in ("params.Dense_0.kernel", "opt_state.0.mu.x", "step", "rng"):
        assert rule.selects(name), name
    for name in ("params.Dense_0.kernel_scale", "xparams.Dense_0.kernel", "steps"):
        assert not rule.selects(name), name
