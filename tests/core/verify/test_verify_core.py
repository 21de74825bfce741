"""The verify library on real fixtures: digests, block geometry, OCDBT walk, targeted damage."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts

from ckpt_cli.core.digest.records import c_order_block, read_digests
from ckpt_cli.core.format.arrays import ItemStore, parse_zarr_header
from ckpt_cli.core.format.blocks import iter_blocks
from ckpt_cli.core.format.scan import read_block
from ckpt_cli.core.storage import LocalLocation
from ckpt_cli.core.verify.ocdbt import scan_database
from ckpt_cli.core.verify.run import verify_path
from ckpt_cli.core.verify.types import VerifyOptions
from tests.support.ldigest_reference import reference_digest
from tests.support.paths import FIXTURES


def _codes(path: Path, **options: object) -> set[str]:
    report = verify_path(LocalLocation(str(path)), VerifyOptions(**options))  # type: ignore[arg-type]
    return {p.code for p in report.problems}


def _record(path: Path, budget: int | None = None) -> dict[str, str]:
    opts = (
        VerifyOptions(record=True) if budget is None else VerifyOptions(record=True, budget=budget)
    )
    report = verify_path(LocalLocation(str(path)), opts)
    assert report.ok and report.recorded, report.to_json()
    item = path / report.recorded[0]
    record = read_digests(LocalLocation(str(item)))
    assert record is not None
    assert record.version == 2
    return {name: str(d.ld1) for name, d in record.leaves.items()}


def test_recorded_digest_is_the_reference_ld1_of_the_values(fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("multiprocess")
    digests = _record(root)
    assert digests
    for name, digest in digests.items():
        spec = {
            "driver": "zarr",
            "kvstore": {"driver": "ocdbt", "base": f"file://{root}/3/default/", "path": f"{name}/"},
        }
        values = ts.open(spec).result().read().result()
        assert reference_digest(np.asarray(values)) == digest


def test_digest_ignores_layout_chunking_and_block_size(fixture_copy) -> None:  # type: ignore[no-untyped-def]
    # Same values: merged vs per-process OCDBT (chunks spread over two databases), zarr2 vs
    # zarr3, and tiny read blocks that cut every chunk.
    assert _record(fixture_copy("multiprocess")) == _record(fixture_copy("unmerged_ocdbt"), 64)
    assert _record(fixture_copy("no_ocdbt")) == _record(fixture_copy("no_ocdbt_zarr3"), 8)


@pytest.mark.parametrize(
    ("shape", "chunks", "budget", "cap", "expected"),
    [
        ((64, 64), (8, 64), 4096, 1 << 20, (16, 64)),  # whole chunk rows, two at a time
        ((64, 64), (64, 8), 4096, 1 << 20, (64, 64)),  # a chunk-row fits the cap: decode once
        ((64, 64), (64, 8), 1024, 8192, (4, 64)),  # it does not: rows cut through the chunks
        ((64, 64), (64, 8), 1 << 20, 0, (64, 64)),  # everything fits the budget
        ((4, 1000), (4, 100), 400, 0, (1, 100)),  # a row is too big: split the last dim
        ((), (), 10, 0, ()),
    ],
)
def test_c_order_block(
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    budget: int,
    cap: int,
    expected: tuple[int, ...],
) -> None:
    header = {"zarr_format": 2, "shape": list(shape), "chunks": list(chunks), "dtype": "<f4"}
    info = parse_zarr_header("x", json.dumps(header).encode(), "test")
    block = c_order_block(info, budget, row_cap=cap)
    assert block == expected
    # Consecutive blocks are consecutive byte ranges of the C-order stream.
    flat = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    pieces = [flat[sl].reshape(-1) for sl in iter_blocks(info, block)]
    assert np.array_equal(np.concatenate(pieces) if shape else flat.reshape(-1), flat.reshape(-1))


def test_read_block_assembles_blocks_across_process_databases() -> None:
    merged = ItemStore(LocalLocation(str(FIXTURES / "multiprocess" / "3" / "default")), False)
    split = ItemStore(LocalLocation(str(FIXTURES / "unmerged_ocdbt" / "3" / "default")), False)
    info, label = split.read_headers(["params.big"])["params.big"]
    reader = split.reader("params.big", info, label)
    assert not reader.multi_chunk_blocks
    block = (slice(5, 37), slice(0, 64))  # cuts through chunks owned by both processes
    got = np.asarray(read_block(reader, block).result())
    want = merged.open_array("params.big")[block].read().result()
    assert np.array_equal(got, want)


def test_ocdbt_walk_lists_every_reference_inside_its_file() -> None:
    item = FIXTURES / "seed_mlp" / "500" / "default"

    def size(rel: str) -> int | None:
        p = item / rel
        return p.stat().st_size if p.exists() else None

    merged = scan_database(LocalLocation(str(item)), "", size)
    assert merged.complete and not merged.problems
    values = [r for r, key in merged.refs if key is not None]
    assert values and all(r.file.startswith("ocdbt.process_0/d/") for r in values)
    assert all(r.end <= (size(r.file) or 0) for r, _ in merged.refs)
    assert b"params.Dense_0.kernel/.zarray" in merged.keys
    proc = scan_database(LocalLocation(str(item)), "ocdbt.process_0", size)
    assert proc.complete and {r.file for r, _ in proc.refs} >= {r.file for r in values}


def test_crc_damage_in_a_tree_node_and_the_manifest(fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("seed_mlp")
    node = next((root / "500" / "default" / "d").iterdir())
    blob = bytearray(node.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    node.write_bytes(bytes(blob))
    assert "ocdbt-crc" in _codes(root, step=500)
    manifest = root / "400" / "default" / "ocdbt.process_0" / "manifest.ocdbt"
    blob = bytearray(manifest.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    manifest.write_bytes(bytes(blob))
    assert "ocdbt-crc" in _codes(root, step=400)


def test_unreferenced_data_file_and_missing_plain_chunk(fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("seed_mlp")
    (root / "500" / "default" / "d" / ("0" * 32)).write_bytes(b"left over")
    assert _codes(root, step=500) == {"unreferenced-file"}
    plain = fixture_copy("no_ocdbt")
    (plain / "0" / "default" / "params.Dense_0.kernel" / "0.0").unlink()
    assert _codes(plain) == {"chunk-missing"}


def test_step_without_metadata_and_item_left_as_tmp(fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("seed_mlp")
    (root / "500" / "_CHECKPOINT_METADATA").unlink()
    assert _codes(root, step=500) == {"step-metadata-missing"}
    os.rename(root / "400" / "default", root / "400" / "default.orbax-checkpoint-tmp")
    assert _codes(root, step=400) == {"tmp-dir", "item-missing"}


def test_changed_and_removed_leaves_of_a_recorded_item(fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("strings")
    _record(root)
    item = root / "0" / "default"
    strings = item / "_strings.json"
    strings.write_text(strings.read_text().replace("run-0042", "run-0043"))
    assert _codes(root) == {"digest-mismatch"}  # string digests are cheap: checked always
    assert _codes(root, deep=True) == {"digest-mismatch", "datafile-checksum-mismatch"}
    meta = json.loads((item / "_METADATA").read_text())
    del meta["tree_metadata"]["('name',)"]
    (item / "_METADATA").write_text(json.dumps(meta))
    assert "leaf-missing" in _codes(root)


def test_record_refused_on_errors(fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("no_ocdbt")
    (root / "0" / "default" / "step" / "0").unlink()
    report = verify_path(LocalLocation(str(root)), VerifyOptions(record=True))
    assert not report.ok and report.recorded == ()
    assert report.items[0].digests == "not-recorded"
    assert not (root / "0" / "default" / "_CKPT_DIGESTS.json").exists()


def test_verify_writes_nothing_without_record() -> None:
    # The fixtures are verified in place by the CLI tests: only --record may write.
    before = {p: p.stat().st_mtime_ns for p in (FIXTURES / "seed_mlp").rglob("*")}
    verify_path(LocalLocation(str(FIXTURES / "seed_mlp")), VerifyOptions(deep=True))
    assert before == {p: p.stat().st_mtime_ns for p in (FIXTURES / "seed_mlp").rglob("*")}
