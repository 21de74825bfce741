"""``disk_usage`` on Orbax 0.12.x layouts (``fixtures/orbax012/layouts/``): every per-process
database read whatever its name (custom process ids, replica-separate folders, a v1 partial
save's renamed databases) and the split ``ocdbt_meta/``/``ocdbt_data/`` folders; sizes equal to
the files, leaves as Orbax restores them (storage casts, no compression, size-capped data
files), and garbage exactly the data files no version of any database references
(TensorStore's own walk, in the truth)."""

from __future__ import annotations

import pytest

from ckpt_cli.core.du import disk_usage
from ckpt_cli.core.du.ocdbt import _walk_decoded, _walk_tensorstore, first_reads, item_dirs
from ckpt_cli.core.storage import open_location
from tests.support.orbax012_layouts import (
    LAYOUTS,
    NAMES,
    STEP,
    WITH_GARBAGE,
    item_dir,
    item_files,
    truth,
)


def _leaf_values(item: str) -> dict[str, int]:
    """Bytes of each leaf's chunk values, as TensorStore's OCDBT driver reads them."""
    import tensorstore as ts

    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{item}/"}).result()
    out: dict[str, int] = {}
    for key in kv.list().result():
        name, _, part = key.decode().partition("/")
        if part not in (".zarray", "zarr.json"):
            out[name] = out.get(name, 0) + len(kv.read(key).result().value)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_du_is_exact_and_its_garbage_is_what_no_version_references(name: str) -> None:
    root = LAYOUTS / name
    t = truth(name)
    report = disk_usage(open_location(str(root)))
    assert report.total_bytes == sum(t["files"].values())
    (step,) = report.steps
    assert step.step == STEP and step.bytes == sum(t["files"].values())
    (item,) = step.items
    assert item.format == "ocdbt" and item.exact
    assert item.bytes == sum(item_files(name).values())
    assert item.bytes == item.leaf_bytes + item.metadata_bytes + item.garbage_bytes
    files = sorted(g.path for g in report.garbage if g.kind == "unreferenced-file")
    assert files == sorted(str(root / rel) for rel in t["unreferenced"])
    ranges = [(g.path, g.bytes, g.files) for g in report.garbage if g.kind == "unreferenced-ranges"]
    uncovered = t["uncovered"]
    assert ranges == ([(item.path, sum(uncovered.values()), len(uncovered))] if uncovered else [])
    assert len(report.garbage) == len(files) + len(ranges)
    unreferenced = sum(t["files"][rel] for rel in t["unreferenced"])
    assert item.garbage_bytes == unreferenced + sum(uncovered.values())
    leaves = {leaf.name: leaf for leaf in item.leaves}
    restored = t["restored"]
    assert leaves and set(leaves) == set(restored)
    for leaf_name, leaf in leaves.items():
        # The storage dtype (a cast at save) is what Orbax restores without a target.
        assert leaf.dtype == restored[leaf_name]["dtype"]
        assert list(leaf.shape or ()) == restored[leaf_name]["shape"]
    assert {n: leaf.bytes for n, leaf in leaves.items()} == _leaf_values(str(root / item_dir(name)))


@pytest.mark.parametrize("name", NAMES)
def test_du_own_walk_and_tensorstores_find_the_same_values_and_garbage(name: str) -> None:
    """``du`` decodes the databases itself; where its decoder stops, TensorStore's walk takes
    over: both read every per-process database and the split folders alike."""
    item = open_location(str(LAYOUTS / name / item_dir(name)))
    files = item_files(name)
    mine, theirs = _walk_decoded(item, files), _walk_tensorstore(item, files)
    assert mine.values and mine.values == theirs.values
    assert mine.exact and theirs.exact
    assert (mine.unreferenced, mine.unused) == (theirs.unreferenced, theirs.unused)
    prefix = item_dir(name) + "/"
    assert mine.unreferenced == sorted(rel[len(prefix) :] for rel in truth(name)["unreferenced"])
    uncovered = {rel[len(prefix) :]: n for rel, n in truth(name)["uncovered"].items()}
    assert mine.unused == uncovered


@pytest.mark.parametrize("name", WITH_GARBAGE)
@pytest.mark.parametrize("level", ["step", "item"])
def test_garbage_in_any_per_process_database_is_found_from_a_step_or_an_item(
    name: str, level: str
) -> None:
    item = LAYOUTS / name / item_dir(name)
    where = item if level == "item" else item.parent
    report = disk_usage(open_location(str(where)))
    found = sorted(g.path for g in report.garbage if g.kind == "unreferenced-file")
    assert found and found == sorted(
        str(LAYOUTS / name / rel) for rel in truth(name)["unreferenced"]
    )


def test_the_garbage_roots_hold_garbage_in_every_kind_of_database() -> None:
    """What the tests above stand on: the truth names garbage in a custom process id's, a
    replica folder's, a renamed partial save's and a split database, and Orbax's own leftover
    (a clean v1 save's retried write) in ``ocdbt.process_0/d/``."""
    where = {tuple(rel.split("/")[-3:-1]) for n in WITH_GARBAGE for rel in truth(n)["unreferenced"]}
    renamed = {(db, d) for db, d in where if db.startswith("ocdbt.process_0") and len(db) > 30}
    assert renamed and {d for _, d in renamed} == {"d"}
    assert where - renamed == {
        ("ocdbt.process_controller", "d"),
        ("ocdbt.process_replica_0", "d"),
        ("ocdbt.process_0", "ocdbt_data"),
        ("ocdbt.process_0", "d"),
    }
    assert truth("commit_race")["unreferenced"] and not truth("commit_race")["derived"]


@pytest.mark.parametrize("name", ["split_folders", "partial_finalized"])
def test_the_first_wave_reads_every_merged_roots_node_files(name: str) -> None:
    """Each merged root's node files (``d/``, or ``ocdbt_meta/`` when stored apart) are read
    with the manifests, beside per-process databases of any name."""
    files = truth(name)["files"]
    item = item_dir(name) + "/"
    assert item_dirs(files) == {item}
    wave = first_reads(files)
    nodes = [rel for rel in files if rel.startswith((item + "d/", item + "ocdbt_meta/"))]
    assert nodes and set(nodes) <= set(wave)
    manifests = [rel for rel in files if rel.endswith("manifest.ocdbt")]
    assert len(manifests) >= 2 and set(manifests) <= set(wave)
