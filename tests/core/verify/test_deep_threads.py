"""``verify --deep``'s file checksums: a pool of half the threads (at least 2 locally, 4 on a
bucket), and files larger than ``RANGE_BYTES`` checksummed in ranges joined to the whole file's
CRC-32."""

from __future__ import annotations

import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ckpt_cli.core import threads
from ckpt_cli.core.storage import open_location
from ckpt_cli.core.verify import deep


def _facts(base: Any, sizes: dict[str, int]) -> Any:
    return SimpleNamespace(inventory=SimpleNamespace(base=base, sizes=sizes))


@pytest.mark.parametrize(
    ("n", "parallel_reads", "workers"), [(1, 1, 2), (8, 1, 4), (13, 1, 6), (1, 32, 4), (13, 32, 13)]
)
def test_the_checksum_pool_follows_the_threads(
    n: int, parallel_reads: int, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(threads, "_chosen", n)
    base = SimpleNamespace(parallel_reads=parallel_reads)
    assert deep._file_workers(_facts(base, {})) == workers


@pytest.mark.parametrize("range_bytes", [1000, 4093, 65536])
def test_a_large_file_checksummed_in_ranges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, range_bytes: int
) -> None:
    data = bytes(range(256)) * 777 + b"tail"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "big").write_bytes(data)
    (tmp_path / "small").write_bytes(b"x" * 10)
    monkeypatch.setattr(deep, "RANGE_BYTES", range_bytes)
    facts = _facts(open_location(str(tmp_path)), {"d/big": len(data), "small": 10})
    seen: list[int] = []
    with ThreadPoolExecutor(3) as pool:
        sums = deep._submit_sums(pool, facts, ["d/big", "small"], seen.append)  # type: ignore[arg-type]
        got = {rel: s.result() for rel, s in sums}
    assert got["d/big"].crc32 == f"{zlib.crc32(data):08x}" and got["d/big"].size == len(data)
    assert got["small"].crc32 == f"{zlib.crc32(b'x' * 10):08x}"
    assert isinstance(sums[0][1], deep._Joined)
    assert len(sums[0][1].pieces) == -(-len(data) // range_bytes)
    assert sum(seen) == len(data) + 10  # progress counts every byte once
