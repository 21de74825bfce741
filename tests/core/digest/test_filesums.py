"""A writer's file checksums on a local disk: byte ranges summed on the threads and joined
equal each file's CRC-32 read whole, at any thread count and range size."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from ckpt_cli.core import threads as _threads
from ckpt_cli.core.digest import filesums
from ckpt_cli.core.digest.records import FileSum
from ckpt_cli.core.storage import open_location


def _files(root: Path) -> dict[str, bytes]:
    data = {
        "d/big": os.urandom(5 * (1 << 20) + 12345),
        "d/small": os.urandom(777),
        "d/empty": b"",
        "manifest.ocdbt": os.urandom(3000),
    }
    for rel, raw in data.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(raw)
    return data


@pytest.mark.parametrize("threads", [1, 2, 5])
@pytest.mark.parametrize("range_bytes", [1 << 20, 4096, 32 << 20])
def test_local_file_sums_equal_whole_file_crcs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int, range_bytes: int
) -> None:
    data = _files(tmp_path)
    monkeypatch.setattr(filesums, "LOCAL_RANGE_BYTES", range_bytes)
    monkeypatch.setattr(_threads, "_chosen", threads)
    sums = filesums.file_sums(open_location(str(tmp_path)))
    assert sums and set(sums) <= set(data)
    assert "d/big" in sums and "d/empty" in sums
    for rel, got in sums.items():
        raw = data[rel]
        assert got == FileSum(len(raw), f"{zlib.crc32(raw):08x}"), rel


def test_a_file_gone_midway_raises_one_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckpt_cli.errors import StorageError

    _files(tmp_path)
    monkeypatch.setattr(filesums, "LOCAL_RANGE_BYTES", 1 << 20)
    monkeypatch.setattr(_threads, "_chosen", 3)
    real = filesums.range_checksum

    def vanish(location: object, rel: str, start: int, end: int) -> filesums.Piece:
        if rel == "d/big" and start > 0:
            (tmp_path / "d" / "big").unlink(missing_ok=True)
        return real(location, rel, start, end)  # type: ignore[arg-type]

    monkeypatch.setattr(filesums, "range_checksum", vanish)
    with pytest.raises(StorageError, match="cannot read back d/big"):
        filesums.file_sums(open_location(str(tmp_path)))
