"""``verify --deep`` sums a local OCDBT data file's CRC-32 from the ranges its decoder read
(``filesums.ReadTaps``) and the bytes no reader read, instead of reading the file a second
time: the same CRC-32s, a change anywhere in the file still found, and the re-read bytes
counted."""

from __future__ import annotations

import json
import random
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.core.digest.filesums import ReadTaps, join_ranges
from ckpt_cli.core.digest.records import DIGEST_FILE
from ckpt_cli.core.verify import deep
from tests.support.cli import run_cli
from tests.support.read_count import save_one_chunk_leaves

pytestmark = pytest.mark.xdist_group("read_taps")


def _joined(taps: ReadTaps, rel: str, data: bytes) -> Any:
    pieces, gaps = taps.pieces(rel, len(data))
    read = [(r, a, b - a, zlib.crc32(data[a:b])) for r, a, b in gaps]
    assert sum(p[2] for p in pieces) + sum(p[2] for p in read) == len(data)
    return join_ranges([*pieces, *read])[0][1], pieces, gaps


@pytest.mark.parametrize("seed", range(12))
def test_tapped_ranges_and_the_gaps_join_to_the_file_crc(seed: int) -> None:
    """Readers on several threads, each reading a chunk front to back in ranges, chunks read
    in any order, some bytes read twice (a shard's index) and some never: the pieces and the
    gaps cover the file once and join to its CRC-32; one chunk's ranges are one piece."""
    rng = random.Random(seed)
    data = rng.randbytes(rng.randrange(50_000, 300_000))
    cuts = sorted(rng.sample(range(1, len(data)), 12))
    chunks = [(a, b) for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    read = [c for c in chunks if rng.random() < 0.7]  # the others: bytes no reader read
    assert read
    rng.shuffle(read)
    taps = ReadTaps()
    tap = taps.tap("d/x")

    def reader(a: int, b: int) -> None:
        step = rng.randrange(1000, 20_000)
        for at in range(a, b, step):
            tap(at, memoryview(data[at : min(b, at + step)]))
        if rng.random() < 0.3:  # read again: a tail read overlapping the chunk
            tap(max(a, b - 20), memoryview(data[max(a, b - 20) : b]))

    threads = [threading.Thread(target=reader, args=c) for c in read]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got, pieces, _ = _joined(taps, "d/x", data)
    assert got.crc32 == f"{zlib.crc32(data):08x}" and got.size == len(data)
    assert pieces and len(pieces) <= len(read)  # a chunk's ranges joined into one piece


def test_ranges_read_in_file_order_make_one_piece() -> None:
    data = bytes(range(256)) * 1000
    taps = ReadTaps()
    for at in range(0, 200_000, 4096):
        taps.add("f", at, memoryview(data[at : at + 4096]))
    got, pieces, gaps = _joined(taps, "f", data)
    assert [(p[1], p[2]) for p in pieces] == [(0, 200_704)]
    assert gaps == [("f", 200_704, len(data))]
    assert got.crc32 == f"{zlib.crc32(data):08x}"


@pytest.fixture
def recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A step of two one-chunk leaves (8 MiB: streamed from its data file; 2 MiB: read
    through TensorStore) with its digests recorded."""
    save_one_chunk_leaves(tmp_path / "src")
    got = run_cli(["verify", str(tmp_path / "src"), "--record"], capsys)
    assert got.code == 0, got.stderr
    return tmp_path / "src" / "0" / "default"


def _data_files(item: Path) -> list[Path]:
    files = sorted(p for p in (item / "ocdbt.process_0" / "d").iterdir() if p.is_file())
    assert files
    return files


def _deep(item: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    got = run_cli(["verify", str(item.parent.parent), "--deep", "--json"], capsys)
    doc: dict[str, Any] = json.loads(got.stdout)
    return doc


def test_the_recorded_crcs_are_the_files_and_only_unread_bytes_are_read_again(
    recorded: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    record = json.loads((recorded / DIGEST_FILE).read_text())["files"]
    files = _data_files(recorded)
    assert all(str(f.relative_to(recorded)) in record for f in files)
    for rel, rec in record.items():  # summed by --record from the decoder's reads too
        assert rec["crc32"] == f"{zlib.crc32((recorded / rel).read_bytes()):08x}", rel
    again: list[int] = []
    real = deep._range_sum

    def counted(facts: Any, rel: str, start: int, end: int, progress: Any) -> Any:
        again.append(end - start)
        return real(facts, rel, start, end, progress)

    monkeypatch.setattr(deep, "_range_sum", counted)
    doc = _deep(recorded, capsys)
    assert doc["ok"] is True, doc["problems"]
    stored = sum(f.stat().st_size for f in files)
    assert stored > 8 << 20
    # The 8 MiB chunk was summed as it was decoded; the rest (the 2 MiB chunk TensorStore
    # read, the b-tree) read again: well under half.
    assert sum(again) < stored // 2, (sum(again), stored)


def _place(item: Path, leaf: str) -> tuple[Path, int, int]:
    from ckpt_cli.core.format.resolve import resolve_items
    from ckpt_cli.core.storage import open_location
    from ckpt_cli.core.verify.structure import check_item

    loc = open_location(str(item.parent.parent))
    facts = check_item(resolve_items(loc, None)[0].location, "x", loc, True)
    assert facts.inventory is not None
    key = next(k for k in facts.keys if k.startswith(f"{leaf}/".encode()) and b".z" not in k)
    ref = facts.keys[key]
    assert ref is not None
    return item / ref.file, ref.offset, ref.length


@pytest.mark.parametrize(("leaf", "where"), [("params.w", "tapped"), ("params.b", "re-read")])
def test_a_changed_byte_is_found_whether_the_decoder_read_it_or_not(
    recorded: Path, capsys: pytest.CaptureFixture[str], leaf: str, where: str
) -> None:
    """One byte changed in the middle of a chunk's stored bytes (random values: zstd stored
    them raw, so the chunk still decodes): the file's CRC-32 no longer matches, both for the
    chunk the decoder streamed from the file (``tapped``) and for the one TensorStore read
    (its bytes read again for the sum)."""
    path, offset, length = _place(recorded, leaf)
    with path.open("r+b") as f:
        f.seek(offset + length // 2)
        byte = f.read(1)
        f.seek(offset + length // 2)
        f.write(bytes([byte[0] ^ 0x10]))
    doc = _deep(recorded, capsys)
    mismatched = {p["file"] for p in doc["problems"] if p["code"] == "datafile-checksum-mismatch"}
    assert any(m.endswith(path.name) for m in mismatched), (where, doc["problems"])
