"""Symlinks inside a step. Readers do not follow links out of the checkpoint;
writers never copy a link or what it points to (they refuse the source: exit 3, one line naming
the link and pointing at ``ckpt verify``, which reports it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.support.ckpt_process import INTERNAL_ERROR, ckpt, copy_fixture, edit_json
from tests.support.paths import REPO

HANDLER = "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler"


def _linked_item(tmp_path: Path) -> tuple[Path, Path]:
    """composite_best with ``4/evil`` -> a directory outside the root (a copy of a real JSON
    item), named in item_handlers like the other items."""
    src = copy_fixture("composite_best", tmp_path / "S")
    outside = tmp_path / "outside" / "evil"
    shutil.copytree(src / "4" / "extra", outside)
    os.symlink(outside, src / "4" / "evil")
    edit_json(
        src / "4" / "_CHECKPOINT_METADATA",
        lambda m: m["item_handlers"].__setitem__("evil", HANDLER),
    )
    return src, tmp_path / "outside"


def _linked_metrics(tmp_path: Path) -> tuple[Path, Path]:
    src = copy_fixture("composite_best", tmp_path / "S")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "metrics.json").write_text('{"loss": 0.001}')
    metrics = src / "4" / "metrics" / "metrics"
    metrics.unlink()
    os.symlink(outside / "metrics.json", metrics)
    return src, outside


def _links_below(path: Path) -> list[str]:
    return [str(p.relative_to(path)) for p in path.rglob("*") if p.is_symlink()]


@pytest.mark.parametrize("make", [_linked_item, _linked_metrics], ids=["item-dir", "metrics-file"])
@pytest.mark.parametrize("command", ["reshard", "migrate"])
def test_writer_never_copies_a_link(tmp_path: Path, make, command: str) -> None:  # type: ignore[no-untyped-def]
    src, _outside = make(tmp_path)
    dst = tmp_path / "D"
    if command == "reshard":
        run = ckpt("reshard", src, dst, "--mesh", "data=8", "--item", "state")
    else:
        spec = tmp_path / "spec.yaml"
        spec.write_text("rules:\n  - {op: rename, from: 'w', to: 'w'}\n")
        run = ckpt("migrate", src, dst, "--spec", spec, "--item", "state")
    assert INTERNAL_ERROR not in run.stderr
    if dst.exists():
        assert _links_below(dst) == []
        assert not (dst / "4" / "evil").exists()
        assert "0.001" not in "".join(
            p.read_text(errors="replace") for p in dst.rglob("metrics") if p.is_file()
        )
    assert run.code == 3, run.stdout[-300:]
    assert "symlink" in run.stderr and "ckpt verify" in run.stderr, run.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["ls", "{src}"],
        ["ls", "{src}", "--json"],
        ["inspect", "{src}", "--item", "evil"],
        ["verify", "{src}"],
        ["prune", "{src}", "--keep-best", "1", "--metric", "loss", "--dry-run"],
    ],
    ids=["ls", "ls-json", "inspect", "verify", "prune"],
)
def test_readers_do_not_follow_links_out(tmp_path: Path, args: list[str]) -> None:
    src, outside = _linked_item(tmp_path)
    metrics = src / "4" / "metrics" / "metrics"
    metrics.unlink()
    (outside / "metrics.json").write_text('{"loss": 0.001}')
    os.symlink(outside / "metrics.json", metrics)
    log = tmp_path / "watch.log"
    run = ckpt(
        *[a.format(src=src) for a in args],
        spec={"watch": str(outside), "watch_log": str(log)},
        mem_limit=None,
    )
    assert INTERNAL_ERROR not in run.stderr
    assert not log.exists(), log.read_text()


def test_writer_refuses_a_data_file_linked_outside(tmp_path: Path) -> None:
    """fixtures/damaged/symlink-outside: an OCDBT data file replaced by a link to ../_outside."""
    damaged = REPO / "fixtures" / "damaged"
    shutil.copytree(damaged / "symlink-outside", tmp_path / "S", symlinks=True)
    shutil.copytree(damaged / "_outside", tmp_path / "_outside")
    run = ckpt("reshard", tmp_path / "S", tmp_path / "D", "--mesh", "data=8")
    assert run.code == 3 and "symlink" in run.stderr, run.stdout[-300:]
    assert not (tmp_path / "D" / "500").exists()


def test_verify_reports_the_links(tmp_path: Path) -> None:
    """An item directory that is a link is reported too, not only links inside items."""
    src, _ = _linked_item(tmp_path)
    run = ckpt("verify", src, "--json", mem_limit=None)
    codes = {p["code"] for p in run.json()["problems"]}
    assert "symlink-outside" in codes, codes


def test_export_refuses_a_data_file_linked_outside(tmp_path: Path) -> None:
    """As reshard, migrate and cp: export never reads a link out of the checkpoint into its
    output (it used to exit 0 with the outside file's bytes in model.safetensors)."""
    damaged = REPO / "fixtures" / "damaged"
    shutil.copytree(damaged / "symlink-outside", tmp_path / "S", symlinks=True)
    shutil.copytree(damaged / "_outside", tmp_path / "_outside")
    assert _links_below(tmp_path / "S"), "the fixture holds its link"
    out = tmp_path / "E"
    run = ckpt("export", tmp_path / "S", out, "--json")
    assert INTERNAL_ERROR not in run.stderr
    assert run.code == 3, run.stdout[-300:]
    assert len(run.lines) == 1, run.stderr
    assert run.json()["error"]["code"] == "refused"
    assert "links outside the checkpoint" in run.stderr and "ckpt verify" in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["S", "_outside"]


def test_import_reads_a_hub_cache_snapshot_and_writes_no_link(tmp_path: Path) -> None:
    """Import's source is not a checkpoint: the Hugging Face hub cache keeps every file of a
    snapshot as a link into ``blobs/``, outside the snapshot directory, and import reads it
    (a refusal would turn away the usual source). What it writes holds no link."""
    import numpy as np
    import safetensors.numpy

    blobs, snapshot = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    value = np.arange(16, dtype=np.float32).reshape(4, 4)
    safetensors.numpy.save_file({"a.weight": value}, str(blobs / "0123abcd"))
    os.symlink("../../blobs/0123abcd", snapshot / "model.safetensors")
    run = ckpt("import", snapshot, tmp_path / "D")
    assert run.code == 0, run.stderr
    written = tmp_path / "D" / "0"
    assert (written / "commit_success.txt").is_file()
    assert _links_below(tmp_path / "D") == []
    assert ckpt("verify", tmp_path / "D", "--deep", mem_limit=None).code == 0
