"""MaxText 0.2.5's own CPU pre-training run, checkpointed by MaxText
(``fixtures/frameworks/maxtext/``): steps 0, 2 and 3 (the last saved on completion), each one
item ``items`` (Orbax v1 ``PyTreeHandler``, zarr3 + OCDBT) holding the whole train state:
params, Adam state, step and ``nnx_aux`` with ``unsafe_rbg`` typed PRNG keys. Every command on
it, and every output loaded as MaxText loads a step (the v1 ``training.Checkpointer``'s
``load_checkpointables``: the checkpointable ``items``), with the values MaxText's own
checkpoint manager loaded (``truth.json``)."""

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

MT = framework("maxtext")
ROOT = MT.path
STEPS = MT.truth["all_steps"]
LATEST = STEPS[-1]
TRUTH = MT.truth["steps"][str(LATEST)]["items"]["items"]


def _loaded(orbax: OrbaxRestorer, root: Path) -> dict[str, Any]:
    """MaxText's view of ``root``: its one step's checkpointables, by the v1 loader."""
    assert orbax.steps(root) == [LATEST]
    got = orbax.step_items(root, LATEST)
    assert list(got) == ["items"]
    return got["items"]


def test_orbax_loads_every_step_as_maxtext_did(orbax: OrbaxRestorer) -> None:
    """The load the tests use on outputs gives, on the fixture, what MaxText returned."""
    assert orbax.steps(ROOT) == STEPS
    for step in STEPS:
        got = orbax.step_items(ROOT, step)
        assert list(got) == ["items"]
        assert_restored_as_truth(got["items"], MT.truth["steps"][str(step)]["items"]["items"])


def test_ls_lists_the_steps_maxtext_wrote(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("ls", ROOT, "--json")
    assert r.code == 0, r.stderr
    steps = r.json()["steps"]
    assert [s["step"] for s in steps] == STEPS == [0, 2, 3]
    assert all(s["items"] == ["items"] and s["status"] == "committed" for s in steps)


def test_inspect_reads_the_values_maxtext_loads(cli) -> None:  # type: ignore[no-untyped-def]
    ck = ckpt_cli.open(ROOT)
    for step in STEPS:
        item = ck.item(step=step)
        assert item.name == "items"
        want = truth_digests(MT.truth["steps"][str(step)]["items"]["items"])
        assert read_digests(item) == want, step
    r = cli("inspect", ROOT, "--step", LATEST, "--json")
    assert r.code == 0, r.stderr
    keys = [lf for lf in r.json()["leaves"] if lf["name"].endswith("rngs.aqt.key")]
    assert [(lf["dtype"], lf["shape"]) for lf in keys] == [("key<urbg>", [2]), ("key<urbg>", [])]


def test_verify_is_clean_and_a_flipped_byte_after_record_is_caught(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = writable(MT, tmp_path)
    assert_verify_clean_then_a_flip_caught(cli, ROOT, root, root / str(LATEST) / "items")


def test_migrate_casts_the_params_and_maxtext_loads_the_step(
    cli, tmp_path: Path, orbax: OrbaxRestorer
) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "cast.yaml"
    spec.write_text("rules:\n  - {op: cast, match: 'params\\..*', dtype: bfloat16}\n")
    out = tmp_path / "out"
    r = cli("migrate", ROOT, out, "--spec", spec)
    assert r.code == 0, r.stderr
    source = ckpt_cli.open(ROOT).item(step=LATEST)
    cast = (r"params\..*", "bfloat16")
    assert_restored_as_truth(_loaded(orbax, out), TRUTH, source, cast)


def test_reshard_writes_the_step_and_maxtext_loads_it(
    cli, tmp_path: Path, orbax: OrbaxRestorer
) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    rule = "params.params.token_embedder.embedding=[data, null]"
    r = cli("reshard", ROOT, out, "--mesh", "data=2", "--rule", rule)
    assert r.code == 0, r.stderr
    assert_restored_as_truth(_loaded(orbax, out), TRUTH)


def test_export_import_loads_as_maxtexts_items(cli, tmp_path: Path, orbax: OrbaxRestorer) -> None:  # type: ignore[no-untyped-def]
    st, back = tmp_path / "st", tmp_path / "back"
    assert cli("export", ROOT, st).code == 3  # typed PRNG keys: no safetensors form, refused
    assert cli("export", ROOT, st, "--params-only").code == 0
    r = cli("import", st, back, "--step", LATEST, "--json")
    assert r.code == 0, r.stderr
    assert r.json()["output"]["item"] == "items"  # the name export recorded
    params = {"leaves": [lf for lf in TRUTH["leaves"] if lf["keypath"][0][0] == "params"]}
    assert_restored_as_truth(_loaded(orbax, back), params)


def test_doctor_like_says_a_rewritten_step_restores(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    doc = doctor_like_a_reshard(cli, ROOT, tmp_path / "out")
    assert doc["item"] == "items"
