"""``verify --deep`` on workers cuts a data file larger than a unit into byte ranges checksummed
by different units; the driver joins their CRC-32s (``crc32_combine``) into the file's. The
findings and a recorded checksum equal the single process's, for a sound, a flipped and a
truncated data file."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.core.digest.crc import combine_py, crc32_combine
from ckpt_cli.core.digest.filesums import cut_ranges, join_ranges
from ckpt_cli.core.digest.records import FileSum
from ckpt_cli.core.storage import LocalLocation
from ckpt_cli.core.verify import distributed as dist
from ckpt_cli.core.verify.run import verify_path
from ckpt_cli.core.verify.types import VerifyOptions
from tests.support.spy_executor import Spy

DAMAGED = Path(__file__).resolve().parents[3] / "fixtures" / "damaged"
UNIT = 4096  # the fixtures' largest data file (17 KiB) spans five units


@pytest.mark.parametrize("sizes", [(0, 5), (7, 0), (1, 1), (1000, 12345), (3, 1 << 20)])
def test_crc32_combine_equals_the_crc32_of_the_joined_bytes(sizes: tuple[int, int]) -> None:
    a, b = os.urandom(sizes[0]), os.urandom(sizes[1])
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    assert combine_py(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)  # no isal


@pytest.mark.parametrize("len2", [1, 8, 255, 32 << 20, (1 << 40) + 12345, (1 << 62) - 1])
def test_combine_py_equals_isal_at_any_length(len2: int) -> None:
    """The operators ``combine_py`` keeps from call to call give ISA-L's CRC for lengths no
    test could hold in memory, called twice (the second call reuses them)."""
    isal_zlib = pytest.importorskip("isal.isal_zlib")
    for crc1, crc2 in ((0x12345678, 0x9ABCDEF0), (0xFFFFFFFF, 0)):
        want = isal_zlib.crc32_combine(crc1, crc2, len2)
        assert combine_py(crc1, crc2, len2) == want
        assert combine_py(crc1, crc2, len2) == want


def test_combine_py_from_threads_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads making the operators at once (none made yet) each get ISA-L's CRC."""
    from concurrent.futures import ThreadPoolExecutor

    from ckpt_cli.core.digest import crc

    isal_zlib = pytest.importorskip("isal.isal_zlib")
    monkeypatch.setattr(crc, "_ZEROS", [])
    lengths = [(1 << n) + n for n in range(20, 60, 5)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda n: combine_py(0x1234, 0x5678, n), lengths))
    assert got == [isal_zlib.crc32_combine(0x1234, 0x5678, n) for n in lengths]


def findings(report: Any) -> list[tuple[str, str | None, str | None]]:
    return sorted((p.code, p.leaf, p.file) for p in report.problems)


def copy(name: str, dst: Path) -> Path:
    import shutil

    shutil.copytree(DAMAGED / name, dst, symlinks=True)
    return dst


@pytest.mark.parametrize(("name", "cut"), [("flipped-byte", True), ("truncated-data-file", False)])
def test_a_file_cut_into_ranges_gives_the_single_process_findings(
    tmp_path: Path, name: str, cut: bool
) -> None:
    root = LocalLocation(str(copy(name, tmp_path / name)))
    single = verify_path(root, VerifyOptions(deep=True), None)
    spy = Spy()
    scaled = verify_path(root, VerifyOptions(deep=True), None, spy, UNIT)
    ranges = [r for u in spy.units for r in u.ranges]
    # The large data file, in ranges (a truncated one is a structure problem: not read).
    assert len(ranges) >= 3 if cut else not ranges
    assert single.ok == scaled.ok is False
    assert findings(scaled) == findings(single)


def test_a_record_taken_over_ranges_equals_the_single_process_record(tmp_path: Path) -> None:
    root = copy("flipped-byte", tmp_path / "one")
    next(root.rglob("_CKPT_DIGESTS.json")).unlink()
    other = copy("flipped-byte", tmp_path / "other")
    next(other.rglob("_CKPT_DIGESTS.json")).unlink()
    verify_path(LocalLocation(str(root)), VerifyOptions(deep=True, record=True), None)
    spy = Spy()
    options = VerifyOptions(deep=True, record=True)
    verify_path(LocalLocation(str(other)), options, None, spy, UNIT)
    assert [r for u in spy.units for r in u.ranges]
    files = json.loads(next(root.rglob("_CKPT_DIGESTS.json")).read_text())["files"]
    got = json.loads(next(other.rglob("_CKPT_DIGESTS.json")).read_text())["files"]
    assert got == files and len(files) >= 2


def test_ranges_cover_each_cut_file_once() -> None:
    pieces = [("d/x", 8, 4, zlib.crc32(b"cdef")), ("d/x", 0, 8, zlib.crc32(b"01234567"))]
    assert join_ranges(pieces) == [("d/x", FileSum(12, f"{zlib.crc32(b'01234567cdef'):08x}"))]
    failed = [*pieces, ("d/x", 12, 0, "cannot read d/x")]
    assert join_ranges(failed) == [("d/x", "cannot read d/x")]


@pytest.fixture(autouse=True)
def _no_kept_stores() -> None:
    dist._STORES.clear()


def test_cut_ranges_cover_every_byte_once() -> None:
    files = [("a", 10), ("b", 0), ("c", 3)]
    units = list(cut_ranges(files, 4))
    assert all(sum(e - s for _, s, e in u) <= 4 for u in units)
    covered = sorted(r for u in units for r in u)
    assert covered == [("a", 0, 4), ("a", 4, 8), ("a", 8, 10), ("b", 0, 0), ("c", 0, 3)]
