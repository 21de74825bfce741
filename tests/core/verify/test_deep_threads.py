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
from tests.support.file_values import spy_file_values


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


def test_streamed_chunks_are_read_from_the_data_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local OCDBT item's large chunks are read from its data files at the places the
    structure pass found (not through the kvstore), with the same values; a place past the
    end of its file is an error, not a short read."""
    import numpy as np
    import orbax.checkpoint as ocp

    from ckpt_cli.core.format import chunkstream, scan
    from ckpt_cli.core.format.chunkread import Place
    from ckpt_cli.core.format.resolve import resolve_items
    from ckpt_cli.core.verify.gate import chunk_locator
    from ckpt_cli.core.verify.structure import check_item

    rng = np.random.default_rng(9)
    state = {f"w{i}": rng.standard_normal((1280, 1024), dtype=np.float32) for i in range(2)}
    with ocp.CheckpointManager(tmp_path / "root") as mgr:
        mgr.save(0, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
    loc = open_location(str(tmp_path / "root"))
    facts = check_item(resolve_items(loc, None)[0].location, "x", loc, True)
    locate = chunk_locator(facts)
    assert locate is not None
    real = chunkstream.FileValue
    opened = spy_file_values(monkeypatch)
    tasks = [scan.ScanTask(n, facts.arrays[n][0], facts.arrays[n][1], ld1=True) for n in state]
    direct = [scan.ld1_of(s) for s in scan.scan_leaves(facts.store, tasks, locate=locate)]
    assert len(opened) == 2 and all(Path(p.path).is_file() for p in opened)
    through_kv = [scan.ld1_of(s) for s in scan.scan_leaves(facts.store, tasks)]
    assert len(opened) == 2
    assert direct == through_kv and all(direct)
    path, offset = opened[0].path, opened[0].offset
    with pytest.raises(Exception, match="shorter than the chunk"):
        real(Place(path, offset, Path(path).stat().st_size - offset + 1))
