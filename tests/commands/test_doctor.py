"""``ckpt doctor`` on the command line: its exit codes, its one-line usage errors, its spec file."""

from __future__ import annotations

from pathlib import Path

from ckpt_cli.core.spec.language import load_spec
from tests.support.paths import FIXTURES


def test_a_checkpoint_like_itself_restores_exit_0(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("doctor", FIXTURES / "seed_mlp", "--like", FIXTURES / "seed_mlp", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["verdict"] == "restores" and doc["differences"] == [] and doc["reason"] is None
    assert doc["memory"]["arrays"] > 0 and doc["memory"]["largest_array"]


def test_steps_of_different_dtypes_restore_with_a_cast_note(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("doctor", FIXTURES / "bf16", "--like", FIXTURES / "bf16")
    assert r.code == 0 and "restores as is" in r.stdout, r.stderr


def test_neither_or_both_targets_is_a_usage_error(cli) -> None:  # type: ignore[no-untyped-def]
    for extra in ([], ["--like", str(FIXTURES / "seed_mlp"), "--target", "m:f"]):
        r = cli("doctor", FIXTURES / "seed_mlp", *extra)
        assert r.code == 2, r.stderr
        assert "--target MODULE:FUNCTION or --like PATH" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_not_a_checkpoint_and_a_bad_target_exit_3(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("doctor", tmp_path, "--like", FIXTURES / "seed_mlp")
    assert r.code == 3 and "Traceback" not in r.stderr
    r = cli("doctor", FIXTURES / "seed_mlp", "--target", "no_such_module_here:f")
    assert r.code == 3 and "cannot import no_such_module_here" in r.stderr


def test_the_written_spec_is_a_migrate_spec_with_its_reasons(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "fix.yaml"
    r = cli("doctor", FIXTURES / "seed_mlp", "--like", FIXTURES / "bf16", "--write-spec", spec)
    assert r.code in (0, 1), r.stderr
    text = spec.read_text()
    assert text.startswith("# written by ckpt doctor")
    assert "# verdict:" in text
    if r.code == 1:
        assert load_spec(str(spec)).rules
    assert not [p for p in tmp_path.iterdir() if p.name != "fix.yaml"]  # no temporary left
