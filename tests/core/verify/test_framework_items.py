"""verify on what frameworks write beside their state: committed v1 checkpoints are clean, and
an item named in ``item_handlers`` that ckpt does not read is a note, never a problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import ckpt_cli
from tests.support.paths import REPO

V1 = REPO / "fixtures" / "frameworks" / "orbax_v1"


@pytest.mark.parametrize("where", ["training", "pytree_zarr3"])
def test_a_v1_checkpoint_has_no_problem(where: str) -> None:
    report = ckpt_cli.verify(V1 / where)
    assert [p.to_json() for p in report.problems] == []
    assert report.to_json()["notes"] == []


def _with_items(tmp_path: Path, handlers: dict[str, str], files: dict[str, bytes]) -> Path:
    """The v1 root's step 5 with extra item directories (``files``: rel path -> bytes; a path
    ending in ``/`` makes an empty directory) named in its ``item_handlers``."""
    root = shutil.copytree(V1 / "training", tmp_path / "training")
    step = root / "5"
    meta = json.loads((step / "_CHECKPOINT_METADATA").read_text())
    meta["item_handlers"].update(handlers)
    (step / "_CHECKPOINT_METADATA").write_text(json.dumps(meta))
    for rel, data in files.items():
        target = step / rel
        if rel.endswith("/"):
            target.mkdir(parents=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return root


def test_empty_and_unknown_items_are_notes(tmp_path: Path) -> None:
    root = _with_items(
        tmp_path,
        {
            "ds_iter": "kauldron.data.iterators.noop_handler.NoopHandler",
            "custom": "my_lab.checkpointing.TokenizerHandler",
        },
        {"ds_iter/": b"", "custom/vocab.txt": b"a\nb\n", "custom/sub/merges.bin": b"\x00\x01"},
    )
    report = ckpt_cli.verify(root, step=5, deep=True)
    assert report.ok and [p.to_json() for p in report.problems] == []
    notes = {n["item"]: (n["kind"], n["handler"]) for n in report.to_json()["notes"]}
    assert notes == {
        "5/ds_iter": ("empty", "kauldron.data.iterators.noop_handler.NoopHandler"),
        "5/custom": ("unknown", "my_lab.checkpointing.TokenizerHandler"),
    }


def test_an_orbax_tree_item_emptied_is_still_damage(tmp_path: Path) -> None:
    """Orbax refuses to save an empty tree: its handler's item without files lost them."""
    root = _with_items(
        tmp_path,
        {
            "params": "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler"
        },
        {"params/": b""},
    )
    report = ckpt_cli.verify(root, step=5)
    assert [p.code for p in report.problems] == ["metadata-missing"]
