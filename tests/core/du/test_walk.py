"""``du``'s own walk of an item's OCDBT databases (each manifest and node read once, no
TensorStore) finds what TensorStore's walk of every version finds: the same latest values, the
same unreferenced files and unused ranges, on real saves, a rewrite in place and fixtures."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from ckpt_cli.core.du import disk_usage
from ckpt_cli.core.du import ocdbt as du_ocdbt
from ckpt_cli.core.du.ocdbt import (
    _walk_decoded,
    _walk_tensorstore,
    databases,
    first_reads,
    walk_item,
    walk_items,
)
from ckpt_cli.core.format.ocdbt import read_manifest
from ckpt_cli.core.storage import Location, open_location
from ckpt_cli.errors import StorageError
from tests.support.du_saves import save
from tests.support.paths import FIXTURES


def files_of(item: Path) -> dict[str, int]:
    out = {}
    for d, _, names in os.walk(item):
        for n in names:
            p = Path(d) / n
            out[str(p.relative_to(item))] = os.lstat(p).st_size
    return out


class CountingReads:
    """Every (file, start, end) an item's walk reads in ranges."""

    def __init__(self, item: Location) -> None:
        self.reads: list[tuple[str, int, int]] = []
        real = item.read_ranges

        def read_ranges(ranges: list[tuple[Location, int, int]]) -> list[bytes]:
            self.reads += [(str(loc), a, b) for loc, a, b in ranges]
            return real(ranges)

        item.read_ranges = read_ranges  # type: ignore[method-assign]


def check_same(item: Path) -> None:
    files = files_of(item)
    assert databases(files)
    loc = open_location(str(item))
    counting = CountingReads(loc)
    mine = _walk_decoded(loc, files)
    theirs = _walk_tensorstore(open_location(str(item)), files)
    assert theirs.exact and mine.exact
    assert mine.values and mine.values == theirs.values
    assert (mine.unreferenced, mine.unused) == (theirs.unreferenced, theirs.unused)
    # Each node read once, in ranged reads (the manifests are whole files, read once each:
    # tests/commands/test_du_bucket.py counts the GETs).
    assert counting.reads and len(counting.reads) == len(set(counting.reads))
    assert not [r for r in counting.reads if r[0].endswith("manifest.ocdbt")]


@pytest.mark.parametrize("layout", ["ocdbt-zarr2", "ocdbt-zarr3"])
def test_the_walks_agree_on_a_save_and_a_rewrite_in_place(tmp_path: Path, layout: str) -> None:
    import tensorstore as ts

    root = save(tmp_path / "run", layout, steps=(1,))
    item = root / "1" / "default"
    check_same(item)
    (item / "d" / ("f" * 32)).write_bytes(os.urandom(700))  # a data file nothing references
    driver = "zarr3" if layout.endswith("zarr3") else "zarr"
    arr = ts.open(
        {
            "driver": driver,
            "kvstore": {"driver": "ocdbt", "base": f"file://{item}", "path": "params.embed/"},
        }
    ).result()
    arr.write(np.zeros((40, 16), dtype=arr.dtype.numpy_dtype)).result()
    files = files_of(item)
    found = _walk_decoded(open_location(str(item)), files)
    assert found.unreferenced == ["d/" + "f" * 32]
    assert sum(found.unused.values()) > 0  # the old values of params.embed
    check_same(item)


@pytest.mark.parametrize(
    "name", ["seed_mlp/500/default", "v1_zarr3", "unmerged_ocdbt", "multiprocess", "bf16"]
)
def test_the_walks_agree_on_fixtures(name: str) -> None:
    path = FIXTURES / name
    items = sorted(
        {p.parent for p in path.rglob("manifest.ocdbt") if "ocdbt.process" not in str(p)}
    )
    items += sorted(
        {p.parent.parent for p in path.rglob("ocdbt.process_*/manifest.ocdbt")} - set(items)
    )
    assert items
    for item in items:
        check_same(item)


class Batches:
    """Every ``read_ranges`` call on a location (one per wave of reads), and a failure to
    raise on a chosen call."""

    def __init__(self, where: Location, fail_on: int | None = None) -> None:
        self.calls: list[list[tuple[str, int, int]]] = []
        real = where.read_ranges

        def read_ranges(ranges: list[tuple[Location, int, int]]) -> list[bytes]:
            self.calls.append([(str(loc), a, b) for loc, a, b in ranges])
            if len(self.calls) == fail_on:
                raise StorageError("cannot read: the bucket answered 503")
            return real(ranges)

        where.read_ranges = read_ranges  # type: ignore[method-assign]


def steps_root(tmp_path: Path, n: int) -> Path:
    root = tmp_path / "run"
    for step in range(n):
        shutil.copytree(FIXTURES / "seed_mlp" / "500", root / str(step))
    return root


def items_of(root: Path, where: Location) -> list[tuple[Location, dict[str, int]]]:
    found = sorted(root.iterdir(), key=lambda p: int(p.name))
    return [(where.child(f"{p.name}/default"), files_of(p / "default")) for p in found]


def test_walk_items_reads_each_level_of_every_item_in_one_batch(tmp_path: Path) -> None:
    """Six steps, each a merged root (one node) over ``ocdbt.process_0``: one batched read of
    the six root nodes, not six reads; each item's answer the one its own walk gives."""
    root = steps_root(tmp_path, 6)
    where = open_location(str(root))
    batches = Batches(where)
    items = items_of(root, where)
    walks = walk_items(where, items)
    assert len(batches.calls) == 1 and len(batches.calls[0]) == 6
    steps = {r[0].split("/run/")[1].split("/")[0] for r in batches.calls[0]}
    assert steps == {str(s) for s in range(6)}
    alone = [
        walk_item(open_location(str(root / p.name / "default")), f)
        for p, (_, f) in zip(sorted(root.iterdir(), key=lambda p: int(p.name)), items, strict=True)
    ]
    assert len(walks) == 6
    for mine, theirs in zip(walks, alone, strict=True):
        assert mine.exact and mine.values and mine.values == theirs.values
        assert (mine.unreferenced, mine.unused) == (theirs.unreferenced, theirs.unused) == ([], {})


def test_walk_items_walks_a_damaged_item_and_a_failed_wave_on_their_own(tmp_path: Path) -> None:
    """A step whose data file is cut short stops the decoder: that item alone goes to
    TensorStore's walk (damaged, no garbage); the others' nodes are still read together. When
    the batched read itself fails, every item of it is walked again on its own, to the same
    answers."""
    root = steps_root(tmp_path, 4)
    data = root / "2" / "default" / "ocdbt.process_0" / "d" / "c580382fa02320644994b4d71544e9fb"
    data.write_bytes(data.read_bytes()[:50])
    where = open_location(str(root))
    batches = Batches(where)
    walks = walk_items(where, items_of(root, where))
    assert len(walks) == 4
    assert not walks[2].exact and walks[2].note and "damaged" in walks[2].note
    assert [w.exact for i, w in enumerate(walks) if i != 2] == [True] * 3
    assert batches.calls and len(batches.calls[0]) == 3  # the three sound items' root nodes

    good = steps_root(tmp_path / "good", 3)
    where = open_location(str(good))
    failing = Batches(where, fail_on=1)
    again = walk_items(where, items_of(good, where))
    assert len(failing.calls) == 1 and len(failing.calls[0]) == 3
    assert len(again) == 3 and all(w.exact and w.values for w in again)
    assert again[0].values == again[1].values == again[2].values


def test_the_walks_agree_past_the_versions_a_manifest_holds(tmp_path: Path) -> None:
    """A real save whose database was rewritten in place 20 times: more versions than its
    manifest holds (16), the older ones in version tree nodes, which this walk reads (each
    once, beside the b-tree nodes) instead of handing the item to TensorStore."""
    import tensorstore as ts

    root = save(tmp_path / "run", "ocdbt-zarr3", steps=(1,))
    item = root / "1" / "default"
    arr = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "ocdbt", "base": f"file://{item}", "path": "params.embed/"},
        }
    ).result()
    for i in range(20):
        arr.write(np.full((40, 16), i, dtype=arr.dtype.numpy_dtype)).result()
    _, nodes, _ = read_manifest((item / "manifest.ocdbt").read_bytes())
    assert nodes
    check_same(item)
    report = disk_usage(open_location(str(root)))
    (usage,) = report.steps[0].items
    assert usage.exact and usage.note is None and usage.garbage_bytes > 0
    loc = open_location(str(item))
    counting = CountingReads(loc)
    _walk_decoded(loc, files_of(item))
    wanted = {(str(loc.child(v.path)), v.offset, v.offset + v.length) for v in nodes}
    assert wanted <= set(counting.reads)


def test_first_reads_are_every_manifest_and_the_merged_roots_node_files(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read before any walk: every manifest, and the data files of each merged root beside
    per-process databases (its b-tree nodes), never a per-process database's data files nor
    those of a database with no merged root over it; past ``FIRST_READ_BYTES``, no more."""
    root = FIXTURES / "multiprocess"
    files = files_of(root)
    merged = sorted(r for r in files if r.startswith("3/default/d/"))
    assert merged and [r for r in files if "/ocdbt.process_" in r and "/d/" in r]
    got = first_reads(files)
    manifests = sorted(r for r in files if r.endswith("manifest.ocdbt"))
    assert len(manifests) == 3
    assert sorted(got) == sorted(manifests + merged)
    unmerged = files_of(FIXTURES / "unmerged_ocdbt")
    assert sorted(first_reads(unmerged)) == sorted(
        r for r in unmerged if r.endswith("manifest.ocdbt")
    )
    monkeypatch.setattr(du_ocdbt, "FIRST_READ_BYTES", files[merged[0]] - 1)
    assert sorted(first_reads(files)) == manifests


def test_a_walk_from_first_reads_needs_no_more_reads(tmp_path: Path) -> None:
    """Three steps of a real save read together by ``first_reads``: every node the walks
    decode lies in those files (the merged roots' nodes), and the walks give what they give
    without them."""
    root = steps_root(tmp_path, 3)
    files = files_of(root)
    first = set(first_reads(files))
    where = open_location(str(root))
    batches = Batches(where)
    walks = walk_items(where, items_of(root, where))
    assert len(walks) == 3 and all(w.exact and w.values for w in walks)
    read = [r for call in batches.calls for r in call]
    assert read and {str(Path(f).relative_to(root)) for f, _, _ in read} <= first
