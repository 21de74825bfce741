"""``LocalLocation.scan``: a file's byte range in pieces read into one buffer a thread reuses
(what the CRC-32 passes read: a writer's output read back, ``verify --deep``'s gaps), with the
same bytes and the same errors as ``read_ranges``."""

from __future__ import annotations

import os
import threading
import zlib
from pathlib import Path

import pytest

from ckpt_cli.core.digest.filesums import file_sums, range_checksum
from ckpt_cli.core.digest.records import file_checksum
from ckpt_cli.core.storage import local as local_mod
from ckpt_cli.core.storage.local import SCAN_PIECE, LocalLocation
from ckpt_cli.core.threads import Spare
from ckpt_cli.errors import NotFoundError, StorageError

SIZE = 3 * SCAN_PIECE + 12_345


@pytest.fixture
def data(tmp_path: Path) -> tuple[LocalLocation, bytes]:
    raw = os.urandom(SIZE)
    (tmp_path / "f.bin").write_bytes(raw)
    return LocalLocation(str(tmp_path / "f.bin")), raw


@pytest.mark.parametrize(
    ("start", "end", "piece"),
    [
        (0, SIZE, 4 << 20),  # pieces clamped to SCAN_PIECE
        (0, SIZE, 1000),
        (17, SIZE - 3, SCAN_PIECE),
        (SCAN_PIECE - 1, SCAN_PIECE + 1, 1 << 20),
        (5, 5, 1 << 20),
    ],
)
def test_a_range_reads_the_bytes_read_ranges_reads(
    data: tuple[LocalLocation, bytes], start: int, end: int, piece: int
) -> None:
    loc, raw = data
    pieces = [bytes(v) for v in loc.scan(start, end, piece)]
    assert b"".join(pieces) == raw[start:end] == b"".join(loc.read_ranges([(loc, start, end)]))
    assert all(0 < len(p) <= min(piece, SCAN_PIECE) for p in pieces)
    assert len(pieces) == -(-(end - start) // min(piece, SCAN_PIECE))


def test_an_open_end_reads_to_the_end_and_an_empty_file_gives_nothing(
    data: tuple[LocalLocation, bytes], tmp_path: Path
) -> None:
    loc, raw = data
    assert b"".join(bytes(v) for v in loc.scan()) == raw
    (tmp_path / "empty").write_bytes(b"")
    assert list(LocalLocation(str(tmp_path / "empty")).scan()) == []


def test_one_buffer_serves_every_piece_and_the_next_scan_on_the_thread(
    data: tuple[LocalLocation, bytes],
) -> None:
    loc, _ = data
    owners = [v.obj for v in loc.scan(0, SIZE)] + [v.obj for v in loc.scan()]
    assert len(owners) == 2 * 4
    assert all(o is owners[0] for o in owners)


def test_a_scan_inside_another_on_one_thread_leaves_the_outer_pieces_intact(
    data: tuple[LocalLocation, bytes],
) -> None:
    loc, raw = data
    outer = loc.scan(0, SIZE)
    first = next(outer)
    expected = bytes(first)
    inner = b"".join(bytes(v) for v in loc.scan(SIZE // 2, SIZE))
    assert inner == raw[SIZE // 2 :]
    assert bytes(first) == expected == raw[: len(expected)]
    assert expected + b"".join(bytes(v) for v in outer) == raw


def test_threads_at_once_each_read_their_own_bytes(data: tuple[LocalLocation, bytes]) -> None:
    loc, raw = data
    cuts = [(i * 700_001, min(SIZE, (i + 1) * 700_001)) for i in range(6)]
    got: dict[int, bytes] = {}

    def run(i: int) -> None:
        got[i] = b"".join(bytes(v) for v in loc.scan(*cuts[i], 64 << 10))

    workers = [threading.Thread(target=run, args=(i,)) for i in range(len(cuts))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(got) == len(cuts)
    assert all(got[i] == raw[a:b] for i, (a, b) in enumerate(cuts))


def test_a_file_shorter_than_the_range_is_one_storage_error(
    data: tuple[LocalLocation, bytes],
) -> None:
    loc, _ = data
    with pytest.raises(StorageError) as e:
        b"".join(bytes(v) for v in loc.scan(SIZE - 10, SIZE + 5))
    assert str(e.value) == f"cannot read {loc.path}: 10 bytes at {SIZE - 10}, not 15"
    with pytest.raises(NotFoundError, match="does not exist"):
        list(loc.parent.child("missing").scan(0, 10))


def test_a_scan_left_early_or_failed_closes_its_file(data: tuple[LocalLocation, bytes]) -> None:
    loc, _ = data
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(20):
        it = loc.scan(0, SIZE)
        next(it)
        it.close()
        with pytest.raises(StorageError):
            list(loc.scan(SIZE - 1, SIZE + 1))
    assert set(os.listdir("/proc/self/fd")) <= before


def test_the_checksums_read_through_it_equal_zlib(
    data: tuple[LocalLocation, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    loc, raw = data
    given: list[bytearray] = []  # kept: identities stay unique

    class Counted(Spare[bytearray]):
        def give(self, obj: bytearray) -> None:
            given.append(obj)
            super().give(obj)

    monkeypatch.setattr(local_mod, "_idle_buffers", Counted())
    fs = file_checksum(loc)
    assert (fs.size, fs.crc32) == (SIZE, f"{zlib.crc32(raw):08x}")
    piece = range_checksum(loc.parent, "f.bin", 100, SIZE - 100)
    assert piece == ("f.bin", 100, SIZE - 200, zlib.crc32(raw[100:-100]))
    assert len(given) == 2  # one scan each
    assert given[0] is given[1]  # one buffer for both passes, not one a piece
    sums = file_sums(loc.parent)
    assert sums["f.bin"].crc32 == f"{zlib.crc32(raw):08x}"
