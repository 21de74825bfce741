"""``disk_usage`` on real Orbax saves: sizes equal to the files, exact logical bytes, leaf bytes
equal to what TensorStore reads for each chunk key, and garbage planted or made by a rewrite."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from ckpt_cli.core.du import Duplicate, DuReport, disk_usage
from ckpt_cli.core.du import run as du_run
from ckpt_cli.core.du import wave as du_wave
from ckpt_cli.core.du.types import LEFTOVER_KINDS
from ckpt_cli.core.storage import Location, open_location
from tests.support.du_saves import LAYOUTS, TREE, save
from tests.support.paths import FIXTURES


def walked(path: Path) -> int:
    return sum(os.lstat(Path(d) / f).st_size for d, _, fs in os.walk(path) for f in fs)


def check_sums(report: DuReport, path: Path) -> None:
    """Every figure adds up, and the step figures equal the files (os.walk)."""
    assert report.total_bytes == walked(path)
    leftovers = sum(g.bytes for g in report.garbage if g.kind in LEFTOVER_KINDS)
    assert report.total_bytes == report.steps_bytes + report.other_bytes + leftovers
    assert report.steps
    for s in report.steps:
        assert s.bytes == walked(Path(s.path))
        inside = sum(g.bytes for g in report.garbage if g.kind == "tmp-item" and g.step == s.step)
        assert s.leftover_bytes == inside
        assert s.bytes == sum(i.bytes for i in s.items) + s.files_bytes + inside
        for i in s.items:
            assert i.bytes == walked(Path(i.path)) or i.path == s.path
            assert i.bytes == i.leaf_bytes + i.metadata_bytes + i.garbage_bytes
            assert i.metadata_bytes > 0


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(tmp_path_factory.mktemp(request.param) / "run", request.param)


def test_sizes_equal_the_files_and_logical_bytes_are_exact(saved: Path) -> None:
    report = disk_usage(open_location(str(saved)))
    check_sums(report, saved)
    assert [s.step for s in report.steps] == [1, 2]
    assert not report.garbage, report.garbage  # a fresh save of these layouts has none
    for s in report.steps:
        (item,) = s.items
        leaves = {leaf.name: leaf for leaf in item.leaves}
        assert set(leaves) == set(TREE)
        for name, (shape, dtype) in TREE.items():
            leaf = leaves[name]
            assert leaf.shape == shape and leaf.dtype == dtype
            itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
            assert leaf.logical_bytes == int(np.prod(shape)) * itemsize
            assert leaf.bytes > 0
        # Random float32 values hardly compress: the kernel's stored bytes are near its size.
        kernel = leaves["params.dense.kernel"]
        assert 0.8 * 64 * 48 * 4 < kernel.bytes < 1.2 * 64 * 48 * 4


def test_leaf_bytes_are_the_values_tensorstore_reads(saved: Path) -> None:
    """OCDBT: a leaf's bytes are the lengths of its chunk values, read back through
    TensorStore's own OCDBT driver (an independent route to the same b-tree)."""
    import tensorstore as ts

    item = saved / "2" / "default"
    report = disk_usage(open_location(str(item)))
    check_sums(report, item)
    leaves = {leaf.name: leaf.bytes for leaf in report.steps[0].items[0].leaves}
    assert leaves
    if not (item / "manifest.ocdbt").exists():
        for name, size in leaves.items():
            assert size == walked(item / name)
        return
    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{item}"}).result()
    expect: dict[str, int] = {}
    for key in kv.list().result():
        name, _, part = key.decode().partition("/")
        if part not in (".zarray", "zarr.json"):
            expect[name] = expect.get(name, 0) + len(kv.read(key).result().value)
    assert expect == leaves


def test_a_planted_data_file_and_tmp_saves_are_garbage(tmp_path: Path) -> None:
    root = save(tmp_path / "run", "ocdbt-zarr2")
    planted = root / "2" / "default" / "d" / ("0" * 32)
    planted.write_bytes(os.urandom(1000))
    shutil.copytree(root / "1", root / "3.orbax-checkpoint-tmp-1712345678")
    shutil.copytree(root / "1" / "default", root / "2" / "default.orbax-checkpoint-tmp-99")
    report = disk_usage(open_location(str(root)))
    check_sums(report, root)
    assert [s.step for s in report.steps] == [1, 2]
    by_path = {g.path: g for g in report.garbage}
    assert by_path[str(planted)].kind == "unreferenced-file"
    assert by_path[str(planted)].bytes == 1000 and by_path[str(planted)].step == 2
    tmp = by_path[str(root / "3.orbax-checkpoint-tmp-1712345678")]
    assert tmp.kind == "tmp-save" and tmp.bytes == walked(root / "1")
    assert "--clean-tmp" in tmp.hint
    inner = by_path[str(root / "2" / "default.orbax-checkpoint-tmp-99")]
    assert inner.kind == "tmp-item" and inner.bytes == walked(root / "1" / "default")
    step2 = report.steps[1]
    assert step2.items[0].garbage_bytes == 1000
    assert step2.garbage_bytes == 1000 + inner.bytes
    assert len(report.garbage) == 3


def test_a_database_rewritten_in_place_leaves_garbage_ranges(tmp_path: Path) -> None:
    """New values written into the merged root: the old chunks in ocdbt.process_0's data file
    are no longer read; their bytes are garbage, the data file itself is still referenced."""
    import tensorstore as ts

    root = save(tmp_path / "run", "ocdbt-zarr2", steps=(1,))
    item = root / "1" / "default"
    before = disk_usage(open_location(str(item)))
    old = {leaf.name: leaf.bytes for leaf in before.steps[0].items[0].leaves}
    arr = ts.open(
        {
            "driver": "zarr",
            "kvstore": {
                "driver": "ocdbt",
                "base": f"file://{item}",
                "path": "params.dense.kernel/",
            },
        }
    ).result()
    arr.write(np.random.default_rng(9).standard_normal((64, 48), dtype=np.float32)).result()
    after = disk_usage(open_location(str(item)))
    check_sums(after, item)
    (ranges,) = [g for g in after.garbage if g.kind == "unreferenced-ranges"]
    assert ranges.bytes == old["params.dense.kernel"]
    assert ranges.path == str(item) and "reshard" in ranges.hint
    assert not [g for g in after.garbage if g.kind == "unreferenced-file"]


@pytest.mark.parametrize(
    "name", ["seed_mlp", "v1_zarr3", "unmerged_ocdbt", "composite_best", "multiprocess", "bf16"]
)
def test_committed_fixtures_have_no_garbage(name: str) -> None:
    """Real saves of several APIs (linen, v1, unmerged, Composite, multi-process): no false
    garbage, exact sums."""
    report = disk_usage(open_location(str(FIXTURES / name)))
    check_sums(report, FIXTURES / name)
    assert not report.garbage
    assert all(i.exact for s in report.steps for i in s.items)
    assert any(i.leaves for s in report.steps for i in s.items)


def test_leftover_saves_of_a_fixture_are_never_steps() -> None:
    path = FIXTURES / "with_tmp"
    report = disk_usage(open_location(str(path)))
    check_sums(report, path)
    assert [s.step for s in report.steps] == [1, 2]
    tmp = sorted(g.path for g in report.garbage if g.kind == "tmp-save")
    assert tmp == sorted(str(p) for p in path.iterdir() if ".orbax-checkpoint-tmp" in p.name)
    assert all(g.bytes == walked(Path(g.path)) for g in report.garbage)


def frozen_duplicate(report: DuReport) -> Duplicate:
    """The one duplicate a root saved by ``save`` holds (params.frozen), its savings checked."""
    (dup,) = report.duplicates
    assert (dup.item, dup.leaf, dup.steps) == ("default", "params.frozen", (1, 2, 3))
    sizes = [
        leaf.bytes
        for s in report.steps
        for i in s.items
        for leaf in i.leaves
        if leaf.name == "params.frozen"
    ]
    assert len(sizes) == 3 and dup.bytes == sum(sizes)
    assert dup.saved_bytes == sum(sizes) - max(sizes) == report.duplicate_bytes
    assert dup.saved_bytes > 24 * 8 * 4  # two copies of incompressible float32 values
    return dup


@pytest.mark.parametrize("layout", ["ocdbt-zarr2", "plain-zarr3"])
def test_a_frozen_leaf_is_a_duplicate_with_deep_or_records(tmp_path: Path, layout: str) -> None:
    """Without records, only ``deep`` (values read, digests computed) finds the leaf whose
    values never change, with its steps and what one copy would save; nothing else is claimed.
    Recorded digests (``verify --deep --record``) then find the same, without reading values."""
    import ckpt_cli
    from ckpt_cli.core.digest.items import digest_path

    root = save(tmp_path / "run", layout, steps=(1, 2, 3))
    plain = disk_usage(open_location(str(root)))
    assert not plain.duplicates and not plain.deep
    assert plain.uncompared_leaves == 3 * len(TREE)  # every leaf is in every step
    deep = disk_usage(open_location(str(root)), deep=True, memory_limit=64 << 20)
    check_sums(deep, root)
    assert deep.deep and deep.uncompared_leaves == 0
    dup = frozen_duplicate(deep)
    expect = digest_path(str(root / "2" / "default")).digests()["params.frozen"]
    assert expect is not None and dup.digest == expect
    assert deep.to_json()["duplicates"] == [dup.to_json()]
    assert ckpt_cli.verify(root, deep=True, record=True).ok
    recorded = disk_usage(open_location(str(root)))
    check_sums(recorded, root)
    assert recorded.uncompared_leaves == 0
    assert frozen_duplicate(recorded) == dup


def test_deep_reads_only_leaves_no_record_covers(tmp_path: Path) -> None:
    """A step copied from a recorded one carries its record, and the record's digests compare
    with those ``deep`` computes; a root of one step has nothing to compare."""
    import ckpt_cli

    root = save(tmp_path / "run", "ocdbt-zarr2", steps=(1, 2))
    assert ckpt_cli.verify(root, deep=True, record=True).ok
    shutil.copytree(root / "2", root / "3")
    report = disk_usage(open_location(str(root)), deep=True)
    assert report.uncompared_leaves == 0
    dups = {d.leaf: d.steps for d in report.duplicates}
    assert dups["params.frozen"] == (1, 2, 3)
    assert dups["params.dense.kernel"] == (2, 3)  # step 3 is step 2 again
    single = save(tmp_path / "one", "ocdbt-zarr2", steps=(1,))
    alone = disk_usage(open_location(str(single)))
    assert alone.uncompared_leaves == 0 and not alone.duplicates


@pytest.mark.parametrize(
    "name", ["deleted-data-file", "deleted-manifest", "truncated-data-file", "symlink-outside"]
)
def test_a_damaged_database_reports_no_garbage(name: str) -> None:
    """Bytes a damaged item no longer references are no garbage to delete: the item is marked
    inexact with a note naming verify, and the sums still hold."""
    path = FIXTURES.parent / "damaged" / name
    report = disk_usage(open_location(str(path)))
    assert report.total_bytes == walked(path)
    assert not [g for g in report.garbage if g.kind.startswith("unreferenced")]
    damaged = [i for s in report.steps for i in s.items if not i.exact]
    assert damaged and all("verify" in (i.note or "") for i in damaged)
    for s in report.steps:
        for i in s.items:
            assert i.metadata_bytes >= 0
            assert i.bytes == i.leaf_bytes + i.metadata_bytes + i.garbage_bytes


@pytest.mark.parametrize(("keys", "waves"), [(None, 1), (60, 3)])
def test_steps_walk_together_within_a_budget_of_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keys: int | None, waves: int
) -> None:
    """Where reads overlap (a bucket), the steps' root nodes are read in one batch, or in
    batches of as many steps as ``WALK_KEYS`` allows (seed_mlp's merged root holds 30 keys:
    two steps a batch under 60): the same figures either way."""
    root = tmp_path / "run"
    for step in range(6):
        shutil.copytree(FIXTURES / "seed_mlp" / "500", root / str(step))
    if keys is not None:
        monkeypatch.setattr(du_run, "WALK_KEYS", keys)
    loc = open_location(str(root))
    loc.parallel_reads = 64  # type: ignore[misc]  # as on a bucket
    calls: list[int] = []
    real = loc.read_ranges

    def read_ranges(ranges: list[tuple[Location, int, int]]) -> list[bytes]:
        calls.append(len(ranges))
        return real(ranges)

    loc.read_ranges = read_ranges  # type: ignore[method-assign]
    report = disk_usage(loc)
    assert calls == [6 // waves] * waves
    alone = disk_usage(open_location(str(root)))
    assert report.to_json() == alone.to_json()
    assert len(report.steps) == 6 and all(s.items[0].exact for s in report.steps)


def test_first_reads_are_plain_headers_records_and_ocdbt_metadata(tmp_path: Path) -> None:
    """What ``du`` fetches at once on a bucket: the zarr headers of a step saved without
    OCDBT and its digest record, an OCDBT step's manifests and merged-root node file; never
    the headers of an unfinished save, nor the per-process data files."""
    root = tmp_path / "run"
    shutil.copytree(FIXTURES / "no_ocdbt" / "0", root / "0")
    shutil.copytree(FIXTURES / "no_ocdbt" / "0", root / "1.orbax-checkpoint-tmp-5")
    shutil.copytree(FIXTURES / "seed_mlp" / "500", root / "2")
    (root / "0" / "default" / "_CKPT_DIGESTS.json").write_text("{}")
    files = {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}
    got = du_wave.wave_files(files)
    assert len(got) == len(set(got))
    headers = sorted(r for r in got if r.endswith(".zarray"))
    assert headers and all(r.startswith("0/default/") for r in headers)
    assert headers == sorted(r for r in files if r.startswith("0/") and r.endswith(".zarray"))
    assert "0/default/_CKPT_DIGESTS.json" in got
    rest = sorted(set(got) - set(headers) - {"0/default/_CKPT_DIGESTS.json"})
    assert rest and all(r.startswith("2/default/") for r in rest)
    assert not [r for r in rest if "ocdbt.process_0/d/" in r]
    assert len([r for r in rest if r.endswith("manifest.ocdbt")]) == 2


def test_deep_reads_large_chunks_from_the_data_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``du --deep`` digests a local OCDBT item's large chunks from its data files at the
    places its structure pass found (``verify.gate.item_locator``), as ``digest`` does."""
    import orbax.checkpoint as ocp

    from tests.support.file_values import spy_file_values

    frozen = np.random.default_rng(2).standard_normal((1280, 1024), dtype=np.float32)  # 5 MiB
    with ocp.CheckpointManager(tmp_path / "run") as mgr:
        for step in (1, 2):
            mgr.save(step, args=ocp.args.StandardSave({"frozen": frozen, "step": np.int32(step)}))
        mgr.wait_until_finished()
    opened = spy_file_values(monkeypatch)
    report = disk_usage(open_location(str(tmp_path / "run")), deep=True, memory_limit=64 << 20)
    assert len(opened) == 2 and all(Path(p.path).is_file() for p in opened)  # once a step
    (dup,) = report.duplicates
    assert (dup.leaf, dup.steps) == ("frozen", (1, 2))
