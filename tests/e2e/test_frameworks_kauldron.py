"""A Kauldron 1.4.4 ``kd.train.Trainer`` run, checkpointed by Kauldron itself
(``fixtures/frameworks/kauldron/``): steps ``ckpt_0``, ``ckpt_2``, ``ckpt_4``, each holding the
train state as ``default``, the data iterator as ``ds_iter`` (Kauldron's ``NoopHandler``: an
empty directory but for Orbax's commit file) and the ``timer`` JSON. Every command on it, and
every output restored by Orbax under the names Kauldron asks for (``CheckpointManager`` with
``step_prefix="ckpt"``, ``default`` through ``StandardRestore`` as
``kd.ckpts.Checkpointer.restore(StandardCheckpointItem())`` does, ``timer`` through its JSON
handler), with the values Kauldron's own restore returned (``truth.json``)."""

from __future__ import annotations

from pathlib import Path

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

KD = framework("kauldron")
ROOT = KD.path
STEPS = KD.truth["all_steps"]
LATEST = STEPS[-1]
TRUTH = KD.truth["steps"][str(LATEST)]
NAMES = {"default": "pytree", "timer": "json"}  # what Kauldron restores by name
OPTIONS = KD.truth["manager_options"]  # step_prefix="ckpt"
NOOP = "kauldron.data.iterators.noop_handler.NoopHandler"


def _restored(orbax: OrbaxRestorer, root: Path) -> dict[str, dict[str, object]]:
    """Kauldron's view of ``root``: its one step, restored by item name."""
    assert orbax.steps(root, OPTIONS) == [LATEST]
    assert (root / f"ckpt_{LATEST}" / "ds_iter").is_dir()  # the no-op item: carried as it is
    return orbax.step_items(root, LATEST, NAMES, OPTIONS)


def test_orbax_restores_every_step_as_kauldron_did(orbax: OrbaxRestorer) -> None:
    """The restore the tests use on outputs gives, on the fixture, what Kauldron returned."""
    assert orbax.steps(ROOT, OPTIONS) == STEPS
    for step in STEPS:
        got = orbax.step_items(ROOT, step, NAMES, OPTIONS)
        truth = KD.truth["steps"][str(step)]["items"]
        assert_restored_as_truth(got["default"], truth["default"])
        assert got["timer"]["value"] == truth["timer"]["value"]


def test_ls_lists_the_steps_and_items_kauldron_wrote(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("ls", ROOT, "--json")
    assert r.code == 0, r.stderr
    steps = r.json()["steps"]
    assert [s["step"] for s in steps] == STEPS == [0, 2, 4]
    assert all(s["status"] == "committed" for s in steps)
    assert all(sorted(s["items"]) == ["default", "ds_iter", "timer"] for s in steps)


def test_inspect_reads_the_values_kauldron_restores() -> None:
    ck = ckpt_cli.open(ROOT)
    for step in STEPS:
        item = ck.item(step=step)  # the one state item, picked by ckpt
        assert item.name == "default"
        want = truth_digests(KD.truth["steps"][str(step)]["items"]["default"])
        assert read_digests(item) == want, step


def test_inspect_shows_every_item_the_empty_one_with_its_handler(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", ROOT, "--step", LATEST)
    assert r.code == 0, r.stderr
    assert "item 'default'" in r.stdout
    empty = cli("inspect", ROOT, "--step", LATEST, "--item", "ds_iter", "--json")
    assert empty.code == 0, empty.stderr
    doc = empty.json()
    assert (doc["kind"], doc["handler"], doc["leaves"]) == ("empty", NOOP, [])
    text = cli("inspect", ROOT, "--step", LATEST, "--item", "ds_iter")
    assert text.code == 0 and "empty item" in text.stdout and NOOP in text.stdout
    timer = ckpt_cli.open(ROOT).item(step=LATEST, item="timer")
    assert timer.read_tree() == TRUTH["items"]["timer"]["value"]


def test_verify_is_clean_and_a_flipped_byte_after_record_is_caught(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = writable(KD, tmp_path)
    assert_verify_clean_then_a_flip_caught(cli, ROOT, root, root / f"ckpt_{LATEST}" / "default")


def test_migrate_casts_the_step_whole_and_kauldron_restores_it(
    cli, tmp_path: Path, orbax: OrbaxRestorer
) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "cast.yaml"
    spec.write_text("rules:\n  - {op: cast, match: 'params\\..*', dtype: bfloat16}\n")
    out = tmp_path / "out"
    r = cli("migrate", ROOT, out, "--spec", spec)
    assert r.code == 0, r.stderr
    got = _restored(orbax, out)
    source = ckpt_cli.open(ROOT).item(step=LATEST)
    cast = (r"params\..*", "bfloat16")
    assert_restored_as_truth(got["default"], TRUTH["items"]["default"], source, cast)
    assert got["timer"]["value"] == TRUTH["items"]["timer"]["value"]


def test_reshard_writes_the_step_whole_and_kauldron_restores_it(
    cli, tmp_path: Path, orbax: OrbaxRestorer
) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    rule = "params.encoder.kernel=[data, null]"
    r = cli("reshard", ROOT, out, "--mesh", "data=2", "--rule", rule)
    assert r.code == 0, r.stderr
    got = _restored(orbax, out)
    assert_restored_as_truth(got["default"], TRUTH["items"]["default"])
    assert got["timer"]["value"] == TRUTH["items"]["timer"]["value"]


def test_export_import_restores_as_kauldrons_default_item(
    cli, tmp_path: Path, orbax: OrbaxRestorer
) -> None:  # type: ignore[no-untyped-def]
    st, back = tmp_path / "st", tmp_path / "back"
    assert cli("export", ROOT, st).code == 0
    r = cli("import", st, back, "--step", LATEST, "--json")
    assert r.code == 0, r.stderr
    assert r.json()["output"]["item"] == "default"
    assert orbax.steps(back, OPTIONS) == [LATEST]  # ckpt_4, named as the exported step
    got = orbax.step_items(back, LATEST, {"default": "pytree"}, OPTIONS)
    assert_restored_as_truth(got["default"], TRUTH["items"]["default"])


def test_export_import_into_a_new_root_keeps_kauldrons_step_name(
    cli, tmp_path: Path, orbax: OrbaxRestorer
) -> None:  # type: ignore[no-untyped-def]
    """Export records the step's directory name (``ckpt_4``); an import into a new root names
    its step the same way, so Kauldron's manager (``step_prefix="ckpt"``) lists it."""
    st, back = tmp_path / "st", tmp_path / "back"
    assert cli("export", ROOT, st).code == 0
    assert cli("import", st, back, "--step", LATEST + 2).code == 0
    assert [p.name for p in back.iterdir()] == [f"ckpt_{LATEST + 2}"]
    assert orbax.steps(back, OPTIONS) == [LATEST + 2]


def test_doctor_like_says_a_rewritten_step_restores(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    doc = doctor_like_a_reshard(cli, ROOT, tmp_path / "out")
    assert doc["item"] == "default"
