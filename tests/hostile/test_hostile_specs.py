"""Specs (and reshard rule files) as an attack surface.

A size limit on spec files; YAML aliases refused; patterns that run in linear time (or under a
bound); ``--target`` must return an abstract tree. Each run is a subprocess under the address
space limit and a timeout, so a failure today costs seconds, not the machine.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.support.ckpt_process import INTERNAL_ERROR, ckpt
from tests.support.paths import FIXTURES

SRC = FIXTURES / "seed_mlp"
IDENTITY = "rules:\n  - {op: rename, from: 'step', to: 'step'}\n"


def billion_laughs() -> str:
    """421 bytes: nine anchors of nine aliases each, 9**9 strings once expanded."""
    levels = "abcdefghi"
    lines = ["version: 1", "comment:", "  - &a [" + ",".join(['"lol"'] * 9) + "]"]
    for prev, cur in itertools.pairwise(levels):
        lines.append(f"  - &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join([*lines, IDENTITY.rstrip()]) + "\n"


def _one_line_exit_3(run_code: int, stderr: str, phrase: str) -> None:
    assert run_code != -9, "hung"
    assert INTERNAL_ERROR not in stderr, stderr
    assert run_code == 3, stderr
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and phrase in lines[0].lower(), stderr


def test_spec_from_dev_zero_is_refused_by_size(tmp_path: Path) -> None:
    run = ckpt("migrate", SRC, tmp_path / "D", "--spec", "/dev/zero", "--dry-run", timeout=60)
    _one_line_exit_3(run.code, run.stderr, "larger than")


def test_spec_with_yaml_aliases_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "laughs.yaml"
    spec.write_text(billion_laughs())
    run = ckpt("migrate", SRC, tmp_path / "D", "--spec", spec, timeout=30)
    _one_line_exit_3(run.code, run.stderr, "alias")
    assert not (tmp_path / "D" / "500").exists()


def test_reshard_rules_with_yaml_aliases_are_refused(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("x: &a [data]\n" + "".join(f"params.Dense_{i}.kernel: *a\n" for i in range(2)))
    run = ckpt("reshard", SRC, tmp_path / "D", "--mesh", "data=8", "--rules", rules, timeout=60)
    _one_line_exit_3(run.code, run.stderr, "alias")


def test_catastrophic_pattern_in_a_spec_finishes(tmp_path: Path) -> None:
    """``(.|.)*!`` backtracks exponentially in Python's ``re``: even ``--dry-run`` hangs."""
    spec = tmp_path / "redos.yaml"
    spec.write_text("rules:\n  - {op: drop, match: '(.|.)*!'}\n")
    run = ckpt("migrate", SRC, tmp_path / "D", "--spec", spec, "--dry-run", timeout=30)
    # The rule matches no leaf: refused as such (exit 3), in linear time.
    _one_line_exit_3(run.code, run.stderr, "matched no leaf")


def test_catastrophic_pattern_in_a_reshard_rule_finishes(tmp_path: Path) -> None:
    run = ckpt(
        "reshard", SRC, tmp_path / "D", "--mesh", "data=8", "--rule", "(.|.)*!=[data]",
        "--dry-run", timeout=30,
    )  # fmt: skip
    assert run.code != -9, "hung"
    assert run.code == 0 and "matched no leaf" in run.stderr, run.stderr


@pytest.mark.parametrize("target", ["builtins:exit", "builtins:quit", "os:getpid"])
def test_target_must_return_an_abstract_tree(tmp_path: Path, target: str) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(IDENTITY)
    run = ckpt("migrate", SRC, tmp_path / "D", "--spec", spec, "--target", target, timeout=60)
    _one_line_exit_3(run.code, run.stderr, "abstract")
    assert not (tmp_path / "D" / "500").exists()


def test_a_large_but_sane_spec_still_loads(tmp_path: Path) -> None:
    """The limits leave room for real specs: 2,000 rules (about 150 KB)."""
    spec = tmp_path / "big.yaml"
    rules = "".join(
        f"  - {{op: rename, from: 'params\\.nothing_{i}', to: 'params.x_{i}'}}\n"
        for i in range(2000)
    )
    spec.write_text("rules:\n" + rules + "  - {op: rename, from: 'step', to: 'step'}\n")
    run = ckpt("migrate", SRC, tmp_path / "D", "--spec", spec, "--allow-unused", "--dry-run")
    assert run.code == 0, run.stderr[-300:]


def test_a_pattern_re2_cannot_take_is_one_line(tmp_path: Path) -> None:
    """Backreferences and lookaround need backtracking: refused, never run by another engine."""
    run = ckpt("inspect", SRC, "--filter", r"(Dense)_\1", timeout=60)
    assert run.code == 2 and len(run.lines) == 1, run.stderr
    assert "not a valid pattern" in run.stderr and "RE2" in run.stderr, run.stderr
    spec = tmp_path / "look.yaml"
    spec.write_text("rules:\n  - {op: drop, match: '(?=params).*'}\n")
    run = ckpt("migrate", SRC, tmp_path / "D", "--spec", spec, "--dry-run", timeout=60)
    assert run.code == 2 and len(run.lines) == 1, run.stderr  # a usage error, as --filter's
    assert "field 'match' '(?=params).*' is not a valid pattern (RE2: " in run.stderr
    assert not (tmp_path / "D").exists()
