"""``ckpt import`` through the real entry point: its refusals and their hints."""

from __future__ import annotations

from pathlib import Path

from tests.support.paths import FIXTURES


def test_unused_rule_hint_names_the_tensors(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A dry run refuses too, so the hint shows the names the patterns were matched against."""
    exported = tmp_path / "exported"
    assert cli("export", FIXTURES / "seed_mlp", exported).code == 0
    spec = tmp_path / "spec.yaml"
    spec.write_text("rules: [{op: drop, match: 'nothing\\..*'}]\n")
    r = cli("import", exported, tmp_path / "out", "--spec", spec, "--dry-run")
    assert r.code == 3 and "matched no tensor" in r.stderr
    assert "--dry-run lists" not in r.stderr
    assert "the tensors are named 'opt_state.0.count', " in r.stderr and " more;" in r.stderr
