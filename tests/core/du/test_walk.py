"""``du``'s own walk of an item's OCDBT databases (each manifest and node read once, no
TensorStore) finds what TensorStore's walk of every version finds: the same latest values, the
same unreferenced files and unused ranges, on real saves, a rewrite in place and fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ckpt_cli.core.du.ocdbt import _walk_decoded, _walk_tensorstore, databases
from ckpt_cli.core.storage import Location, open_location
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
