"""Nothing written outside the destination, nothing read outside the source.

Every name read from a checkpoint (item names of ``_CHECKPOINT_METADATA``'s ``item_handlers``,
step names, file names in metadata) is validated before it touches a path, and every path a
writer writes lies under the destination: proven by a snapshot of the parent directory (all of
it: source, destination and a bystander directory) before and after each run.
Leaf keys ('', 'trailing/', '..') as storage paths are read in ``tests/e2e/test_matrix_layouts.py``
and written in ``tests/e2e/test_reshard_matrix.py``; here only the guarantee that whatever a
leaf is called, nothing lands outside the destination.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.ckpt_process import (
    INTERNAL_ERROR,
    changed_outside,
    ckpt,
    copy_fixture,
    edit_json,
    snapshot,
)

HANDLER = "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler"


def _world(tmp_path: Path, item_name: str) -> tuple[Path, Path, Path]:
    """W/a/S (a composite root whose step 4 names a hostile item), W/outside/exfil (a bystander
    directory holding a file), W/b/c/D (the destination to be)."""
    w = tmp_path / "W"
    (w / "outside" / "exfil").mkdir(parents=True)
    (w / "outside" / "exfil" / "data").write_text("bystander")
    (w / "a").mkdir()
    (w / "b" / "c").mkdir(parents=True)
    src = copy_fixture("composite_best", w / "a" / "S")
    edit_json(
        src / "4" / "_CHECKPOINT_METADATA",
        lambda m: m["item_handlers"].__setitem__(item_name, HANDLER),
    )
    return w, src, w / "b" / "c" / "D"


HOSTILE_ITEMS = [
    pytest.param("../../../outside/exfil", id="dotdot"),
    pytest.param("{abs}", id="absolute"),
    pytest.param("sub/dir", id="slash"),
    pytest.param("..", id="parent"),
    pytest.param(".", id="self"),
]


@pytest.mark.parametrize("item_name", HOSTILE_ITEMS)
@pytest.mark.parametrize("command", ["reshard", "migrate"])
def test_hostile_item_name_is_refused_and_nothing_lands_outside(
    tmp_path: Path, item_name: str, command: str
) -> None:
    abs_target = tmp_path / "W" / "abs_target"
    item_name = item_name.format(abs=abs_target)
    w, src, dst = _world(tmp_path, item_name)
    before = snapshot(w)
    if command == "reshard":
        run = ckpt("reshard", src, dst, "--mesh", "data=8", "--item", "state")
    else:
        spec = tmp_path / "spec.yaml"
        spec.write_text("rules:\n  - {op: rename, from: 'step', to: 'step'}\n")
        run = ckpt("migrate", src, dst, "--spec", spec, "--item", "state")
    after = snapshot(w)
    assert changed_outside(before, after, "b/c/D") == []
    assert not abs_target.exists()
    assert run.code == 3, run.stdout[-400:]
    assert len(run.lines) == 1 and repr(item_name) in run.stderr, run.stderr
    assert "ckpt verify" in run.stderr
    # Nothing that looks committed was left in the destination.
    assert not (dst / "4").exists()


def test_reader_does_not_follow_an_item_name_out_of_the_checkpoint(tmp_path: Path) -> None:
    w, src, _ = _world(tmp_path, "../../../outside/exfil")
    log = tmp_path / "watch.log"
    spec = {"watch": str(w / "outside"), "watch_log": str(log)}
    run = ckpt("inspect", src, "--step", "4", "--item", "../../../outside/exfil", spec=spec)
    assert not log.exists(), log.read_text()
    assert run.code == 3 and "../../../outside/exfil" in run.stderr, run.stderr
    listing = ckpt("verify", src, spec=spec)
    assert not log.exists(), log.read_text()
    assert listing.code == 1 and "../../../outside/exfil" in listing.stdout


def test_a_leaf_key_that_climbs_writes_nothing_outside(tmp_path: Path) -> None:
    """A plain-zarr leaf key ``bias/../../../../../../escaped``: TensorStore refuses the key, the
    write fails with one line, and nothing exists outside the destination afterwards."""
    w = tmp_path / "W"
    (w / "b").mkdir(parents=True)
    src = copy_fixture("no_ocdbt", w / "a" / "S")

    def climb(m: dict) -> None:
        tree = m["tree_metadata"]
        entry = tree.pop("('params', 'Dense_0', 'bias')")
        entry["key_metadata"][2]["key"] = "bias/../../../../../../escaped"
        tree["('params', 'Dense_0', 'bias/../../../../../../escaped')"] = entry

    edit_json(src / "0" / "default" / "_METADATA", climb)
    before = snapshot(w)
    run = ckpt("reshard", src, w / "b" / "D", "--mesh", "data=8", "--no-ocdbt")
    assert changed_outside(before, snapshot(w), "b/D") == []
    assert run.code == 3 and len(run.lines) == 1 and INTERNAL_ERROR not in run.stderr
    assert not (w / "b" / "D" / "0").exists()


def test_recorded_file_names_that_climb_are_not_read(tmp_path: Path) -> None:
    """``_CKPT_DIGESTS.json`` naming ``../../../outside/secret``: verify reports it and never
    opens the file outside the item."""
    src = copy_fixture("seed_mlp", tmp_path / "S")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("secret\n")
    assert ckpt("verify", src, "--step", "500", "--record").code == 0
    digests = src / "500" / "default" / "_CKPT_DIGESTS.json"
    doc = json.loads(digests.read_text())
    doc["files"]["../../../outside/secret"] = {"size": 7, "crc32": "00000000"}
    digests.write_text(json.dumps(doc))
    log = tmp_path / "watch.log"
    run = ckpt(
        "verify",
        src,
        "--step",
        "500",
        "--deep",
        spec={"watch": str(tmp_path / "outside"), "watch_log": str(log)},
    )
    assert not log.exists(), log.read_text()
    assert run.code == 1 and "../../../outside/secret" in run.stdout
