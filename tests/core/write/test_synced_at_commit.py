"""A written step is synced once, at its commit: TensorStore writes the arrays without an
``fsync`` each (``file_io_sync`` off in ``item.writer_context``), then ``StepWriter.commit`` syncs
every file and directory of the tmp step before the commit marker; a sync that fails leaves no
step and says so in one line."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from ckpt_cli.core.format.names import COMMIT_MARKER, TMP_MARKER
from tests.support.paths import FIXTURES, REPO
from tests.support.sharded import assert_same_values, read_values

SHARDED = FIXTURES / "sharded_4x2"


def test_the_writers_context_leaves_the_sync_to_the_commit() -> None:
    from ckpt_cli.core.write import item

    assert item.writer_context().spec.to_json()["file_io_sync"] is False


def test_a_worker_process_syncs_each_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``--workers`` process may run on another host: the driver's sync at the commit would
    not reach its writes, so it keeps TensorStore's sync after each one (and asks for no
    write-back: each write is on disk when it is done)."""
    from ckpt_cli.core.storage import writeback
    from ckpt_cli.core.write.distributed import WriteUnit, _RunState
    from ckpt_cli.core.write.item import ItemWriter

    unit = WriteUnit("run", 0, tmp_path.as_uri(), True, 1 << 26, ())
    worker = _RunState(unit).writer
    spec = worker.context.spec.to_json()
    assert spec["file_io_sync"] is True and "data_copy_concurrency" in spec

    asked: list[object] = []
    monkeypatch.setattr(writeback, "writeback_for", lambda loc: asked.append(loc))
    worker.write_regions([])
    assert asked == []
    driver = ItemWriter(worker.dest, use_ocdbt=True, use_zarr3=False, memory_limit=1 << 26)
    driver.write_regions([])
    assert asked == [worker.dest]


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ``os.fsync`` is called on, in order."""
    synced: list[str] = []
    fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return synced


def test_sync_tree_syncs_each_file_and_directory_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More files than it queues at once (four per sync in flight), in nested directories."""
    from ckpt_cli.core.storage.local import LocalLocation
    from ckpt_cli.core.threads import WRITE_FILE_IO

    wanted = {str(tmp_path)}
    for i in range(5 * WRITE_FILE_IO):
        sub = tmp_path / f"a{i % 3}" / f"b{i % 2}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i}").write_bytes(b"x")
        wanted |= {str(sub / f"f{i}"), str(sub), str(sub.parent)}
    synced = _spy(monkeypatch)
    LocalLocation(str(tmp_path)).sync_tree()
    assert len(synced) == len(wanted) and set(synced) == wanted


@pytest.mark.parametrize(
    "args",
    [
        ["reshard", "--mesh", "data=2,model=4"],
        ["migrate", "--spec", str(REPO / "examples" / "widen_64_to_128.yaml")],
    ],
    ids=["reshard", "migrate"],
)
def test_every_file_and_directory_is_synced_before_the_marker(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    source = SHARDED if args[0] == "reshard" else FIXTURES / "seed_mlp"
    synced = _spy(monkeypatch)
    r = cli(args[0], source, tmp_path / "out", *args[1:], "--json")
    assert r.code == 0, r.stderr
    step = Path(r.json()["output"])
    if args[0] == "reshard":
        assert_same_values(read_values(SHARDED), read_values(tmp_path / "out"))

    # The step's marker is synced as it is written (write_bytes): everything else before it.
    tmp_prefix = f"{step.name}{TMP_MARKER}-"
    marker = [
        i
        for i, p in enumerate(synced)
        if os.path.basename(p).startswith(f".{COMMIT_MARKER}")
        and Path(p).parent.name.startswith(tmp_prefix)
    ]
    assert len(marker) == 1, synced
    tmp_name = Path(synced[marker[0]]).parent.name
    before = {os.path.relpath(p, step.parent / tmp_name) for p in synced[: marker[0]]}
    wanted = {
        os.path.relpath(os.path.join(parent, name), step)
        for parent, dirs, files in os.walk(step)
        for name in [*files, "."]
        if name != COMMIT_MARKER
    }
    assert {w for w in wanted if "ocdbt" in w or w.startswith("d/")}, wanted  # array files
    assert wanted - before == set(), sorted(wanted - before)


def test_a_sync_that_fails_leaves_no_step(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsync = os.fsync

    def failing(fd: int) -> None:
        if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", failing)
    dst = tmp_path / "out"
    r = cli("reshard", SHARDED, dst, "--mesh", "data=2,model=4")
    assert r.code == 3 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) >= 1 and lines[0].startswith("ckpt: error: cannot sync"), r.stderr
    assert "Input/output error" in r.stderr
    assert not dst.exists() or list(dst.iterdir()) == [], list(dst.iterdir())
