"""gemma 4.0.1's own ``gm.ckpts.save_params`` of a tiny Gemma (``gm.testing.DummyGemma``'s
bfloat16 params; ``fixtures/frameworks/gemma/``): one ``StandardCheckpointer`` directory, no
manager, no step number. Every command on it, and every output restored as
``gm.ckpts.load_params(STEP_DIR)`` restores it (Orbax's restore of the step's ``default`` item,
the sub-directory gemma's loader looks in when the directory holds ``_CHECKPOINT_METADATA``),
with the values gemma's own loader returned (``truth.json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ckpt_cli
from tests.support.frameworks import (
    assert_restored_as_truth,
    assert_verify_clean_then_a_flip_caught,
    doctor_like_a_reshard,
    framework,
    read_digests,
    truth_digests,
    writable,
)
from tests.support.orbax_restorer import OrbaxRestorer

pytestmark = pytest.mark.slow

GM = framework("gemma")
CKPT = GM.path
TRUTH = GM.truth["items"]["default"]


def _loaded(orbax: OrbaxRestorer, root: Path) -> dict[str, Any]:
    """What gemma's loader finds in ``root``'s one step: its ``default`` item."""
    steps = [p for p in root.iterdir() if p.is_dir()]
    assert [p.name for p in steps] == ["0"]
    assert (steps[0] / "_CHECKPOINT_METADATA").is_file()
    return orbax.item(steps[0] / "default")


def test_orbax_restores_the_checkpoint_as_gemma_did(orbax: OrbaxRestorer) -> None:
    """The restore the tests use on outputs gives, on the fixture, what gemma returned."""
    assert_restored_as_truth(orbax.item(CKPT), TRUTH)


def test_ls_shows_one_checkpoint_without_a_step(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("ls", CKPT, "--json")
    assert r.code == 0, r.stderr
    (step,) = r.json()["steps"]
    assert (step["step"], step["items"], step["status"]) == (None, ["default"], "committed")


def test_inspect_reads_the_values_gemma_loads(cli) -> None:  # type: ignore[no-untyped-def]
    item = ckpt_cli.open(CKPT).item()
    assert read_digests(item) == truth_digests(TRUTH)
    r = cli("inspect", CKPT, "--json")
    assert r.code == 0, r.stderr
    assert {lf["dtype"] for lf in r.json()["leaves"]} == {"bfloat16"}


def test_verify_is_clean_and_a_flipped_byte_after_record_is_caught(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = writable(GM, tmp_path)
    assert_verify_clean_then_a_flip_caught(cli, CKPT, path, path)


def test_migrate_casts_to_float32_and_gemma_loads_it(
    cli, tmp_path: Path, orbax: OrbaxRestorer
) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "cast.yaml"
    spec.write_text("rules:\n  - {op: cast, match: '.*', dtype: float32}\n")
    out = tmp_path / "out"
    r = cli("migrate", CKPT, out, "--spec", spec)
    assert r.code == 0, r.stderr
    source = ckpt_cli.open(CKPT).item()
    assert_restored_as_truth(_loaded(orbax, out), TRUTH, source, (".*", "float32"))


def test_reshard_writes_a_step_gemma_loads(cli, tmp_path: Path, orbax: OrbaxRestorer) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    rule = "layer_0.mlp.linear=[data, null]"
    r = cli("reshard", CKPT, out, "--mesh", "data=2", "--rule", rule)
    assert r.code == 0, r.stderr
    assert_restored_as_truth(_loaded(orbax, out), TRUTH)


def test_export_import_round_trip_loads_in_gemma(cli, tmp_path: Path, orbax: OrbaxRestorer) -> None:  # type: ignore[no-untyped-def]
    st, back = tmp_path / "st", tmp_path / "back"
    assert cli("export", CKPT, st).code == 0
    r = cli("import", st, back, "--json")
    assert r.code == 0, r.stderr
    assert r.json()["output"]["item"] == "default"
    assert_restored_as_truth(_loaded(orbax, back), TRUTH)


def test_doctor_like_says_a_rewritten_checkpoint_restores(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    doctor_like_a_reshard(cli, CKPT, tmp_path / "out")
