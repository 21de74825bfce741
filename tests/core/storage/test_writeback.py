"""The kernel is asked to write back a writer's finished files as it goes (``Writeback``):
each finished file once, never one TensorStore is still writing (``*.__lock``), a file
replaced under its name again; passes every ``EVERY`` bytes at the least, thinning out as the
tree grows; and a real reshard hints its data files before its step is committed (the step's
sync before the marker is what makes them durable: ``tests/core/write/test_synced_at_commit``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ckpt_cli.core.storage import writeback
from ckpt_cli.core.storage.local import LocalLocation
from tests.support.paths import FIXTURES
from tests.support.sharded import assert_same_values, read_values

SHARDED = FIXTURES / "sharded_4x2"


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """(path, start, end) of every hint, in order."""
    calls: list[tuple[str, int, int]] = []

    def spy(fd: int, start: int, end: int) -> None:
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), start, end))

    monkeypatch.setattr(writeback, "start_writeback", spy)
    return calls


def _write(path: Path, nbytes: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * nbytes)
    return str(path)


def test_each_finished_file_is_hinted_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy(monkeypatch)
    first = {_write(tmp_path / "d" / "a", 10), _write(tmp_path / "manifest.ocdbt", 3)}
    _write(tmp_path / "d" / "b.__lock", 5)  # still being written by TensorStore
    wb = writeback.Writeback(str(tmp_path))
    wb.wrote(writeback.EVERY)
    wb.close()
    assert wb.passes == 1
    assert sorted(calls) == sorted((p, 0, os.path.getsize(p)) for p in first)

    calls.clear()
    os.rename(tmp_path / "d" / "b.__lock", tmp_path / "d" / "b")  # finished
    _write(tmp_path / "manifest.new", 4)
    os.replace(tmp_path / "manifest.new", tmp_path / "manifest.ocdbt")  # replaced: a new inode
    wb.wrote(writeback.EVERY)
    wb.close()
    assert wb.passes == 2
    assert sorted(p for p, _, _ in calls) == sorted(
        [str(tmp_path / "d" / "b"), str(tmp_path / "manifest.ocdbt")]
    )
    assert dict((p, e) for p, _, e in calls)[str(tmp_path / "d" / "b")] == 5


def test_passes_come_every_so_many_bytes_and_thin_out_as_the_tree_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _spy(monkeypatch)
    monkeypatch.setattr(writeback, "EVERY_PER_FILE", writeback.EVERY)
    for name in "abc":
        _write(tmp_path / name, 1)
    wb = writeback.Writeback(str(tmp_path))
    wb.wrote(writeback.EVERY - 1)
    wb.close()
    assert wb.passes == 0
    wb.wrote(1)
    wb.close()
    assert wb.passes == 1
    # Three files seen: the next pass waits for three times EVERY.
    wb.wrote(2 * writeback.EVERY)
    wb.close()
    assert wb.passes == 1
    wb.wrote(writeback.EVERY)
    wb.close()
    assert wb.passes == 2


def test_a_tree_removed_meanwhile_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _spy(monkeypatch)
    wb = writeback.Writeback(str(tmp_path / "gone"))
    wb.wrote(writeback.EVERY)
    wb.close()
    assert wb.passes == 1 and calls == []


def test_an_error_in_a_pass_stays_in_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread's exception would print a traceback: a pass's file system errors end the pass
    quietly, and the next one runs."""
    _write(tmp_path / "a", 1)
    raised: list[str] = []

    def failing(path: str) -> None:
        raised.append(path)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(writeback, "_hint", failing)
    hooked: list[object] = []
    monkeypatch.setattr("threading.excepthook", hooked.append)
    wb = writeback.Writeback(str(tmp_path))
    wb.wrote(writeback.EVERY)
    wb.close()
    _write(tmp_path / "b", 1)
    wb.wrote(writeback.EVERY)
    wb.close()
    assert wb.passes == 2 and hooked == []
    assert [os.path.basename(p) for p in raised] == ["a", "b"]


def test_only_local_directories_get_one(tmp_path: Path) -> None:
    assert isinstance(writeback.writeback_for(LocalLocation(str(tmp_path))), writeback.Writeback)
    assert writeback.writeback_for(object()) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_the_hint_is_the_kernels_sync_file_range(tmp_path: Path) -> None:
    path = _write(tmp_path / "f", 1 << 20)
    fd = os.open(path, os.O_RDONLY)
    try:
        writeback.start_writeback(fd, 0, 1 << 20)  # returns at once; errors are ignored
    finally:
        os.close(fd)
    fn = writeback._libc_fns["sync_file_range"]  # looked up by that call, with its argtypes
    assert fn is not None and len(fn.argtypes) == 4


def test_a_reshard_hints_its_data_files_before_the_commit(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _spy(monkeypatch)
    monkeypatch.setattr(writeback, "EVERY", 1)  # a pass after every block written
    r = cli("reshard", SHARDED, tmp_path / "out", "--mesh", "data=2,model=4", "--json")
    assert r.code == 0, r.stderr
    assert_same_values(read_values(SHARDED), read_values(tmp_path / "out"))
    step = Path(r.json()["output"])
    hinted = [Path(p) for p, _, _ in calls]
    assert hinted, "no file was hinted"
    # All in the tmp step (before the rename), data files among them, none TensorStore's partial.
    assert all(".orbax-checkpoint-tmp-" in p.relative_to(tmp_path / "out").parts[0] for p in hinted)
    assert any(p.parent.name == "d" for p in hinted), hinted
    assert not any(p.name.endswith(writeback.TS_PARTIAL_SUFFIX) for p in hinted)
    # The files hinted are the step's data files (the last ones may be left to the sync).
    data = {p.name for p in step.rglob("*") if p.is_file() and p.parent.name == "d"}
    assert data and {p.name for p in hinted if p.parent.name == "d"} <= data
