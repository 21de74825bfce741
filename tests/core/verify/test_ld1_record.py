"""``ld1`` digests in the record: ``verify --record`` writes them, ``verify --deep`` checks them
(one process and split over worker processes), old SHA-256 records are still checked and
``--record --upgrade`` converts them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import tensorstore as ts

from ckpt_cli.core.digest.records import (
    DigestRecord,
    FileSum,
    LeafDigest,
    file_checksum,
    read_digests,
    recorded_file,
    write_digests,
)
from ckpt_cli.core.executor import ExecutorSpec
from ckpt_cli.core.storage import LocalLocation
from ckpt_cli.core.verify.run import verify_path
from ckpt_cli.core.verify.types import VerifyOptions, VerifyReport
from tests.support.ldigest_reference import reference_digest

LEAF = "params.Dense_0.kernel"


def _item(root: Path) -> Path:
    return root / "0" / "default"


def _leaf(item: Path, name: str = LEAF) -> ts.TensorStore:
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": f"{item}/{name}/"}}
    return ts.open(spec).result()


def _verify(root: Path, **options: object) -> VerifyReport:
    return verify_path(LocalLocation(str(root)), VerifyOptions(**options))  # type: ignore[arg-type]


def _codes(report: VerifyReport) -> set[str]:
    return {p.code for p in report.problems}


def _change_values(item: Path) -> None:
    """Values changed behind ckpt's back: every chunk still decodes."""
    arr = _leaf(item)
    values = arr.read().result()
    values[0, 0] += 1.0
    arr.write(values).result()


def _v1_record(item: Path) -> None:
    """A version-1 record, as ckpt wrote before ld1: SHA-256 of the C-order values."""
    leaves = {}
    for name in (LEAF, "params.Dense_0.bias"):
        x = np.ascontiguousarray(_leaf(item, name).read().result())
        leaves[name] = LeafDigest(str(x.dtype), x.shape, hashlib.sha256(x.tobytes()).hexdigest())
    files: dict[str, FileSum] = {}
    for path in sorted(p for p in item.rglob("*") if p.is_file()):
        rel = str(path.relative_to(item))
        if recorded_file(rel):
            files[rel] = file_checksum(LocalLocation(str(path)))
    write_digests(LocalLocation(str(item)), DigestRecord(leaves, files, version=1))


def _record_json(item: Path) -> dict[str, object]:
    doc = json.loads((item / "_CKPT_DIGESTS.json").read_text())
    assert isinstance(doc, dict)
    return doc


def test_record_writes_reference_ld1_and_deep_catches_changed_values(fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("no_ocdbt")
    assert _verify(root, record=True).recorded
    doc = _record_json(_item(root))
    assert doc["version"] == 2 and str(doc["leaf_algorithm"]).startswith("ld1")
    leaves = doc["leaves"]
    assert isinstance(leaves, dict) and leaves
    for name, d in leaves.items():
        assert set(d) == {"dtype", "shape", "ld1", "nonfinite"}
        values = _leaf(_item(root), name).read().result()
        assert d["ld1"] == reference_digest(values)
        want = int((~np.isfinite(values)).sum()) if values.dtype.kind == "f" else 0
        assert d["nonfinite"] == want
    assert _verify(root, deep=True).ok
    _change_values(_item(root))
    assert "digest-mismatch" in _codes(_verify(root, deep=True))


def test_ld1_checked_by_worker_processes_over_split_leaves(fixture_copy) -> None:  # type: ignore[no-untyped-def]
    # Units of 64 bytes split every leaf over several units: their ld1 partials merge.
    root = fixture_copy("no_ocdbt")
    assert _verify(root, record=True).recorded
    pool = ExecutorSpec("local", 2)
    clean = verify_path(LocalLocation(str(root)), VerifyOptions(deep=True), None, pool, 64)
    assert clean.ok and clean.items[0].digests == "checked"
    _change_values(_item(root))
    bad = verify_path(LocalLocation(str(root)), VerifyOptions(deep=True), None, pool, 64)
    assert "digest-mismatch" in _codes(bad)


def test_old_sha256_record_is_checked_and_kept_by_a_plain_record(fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("no_ocdbt")
    _v1_record(_item(root))
    assert _verify(root, deep=True).ok
    assert _verify(root, record=True).recorded
    assert _record_json(_item(root))["version"] == 1
    _change_values(_item(root))
    assert "digest-mismatch" in _codes(_verify(root, deep=True))


def test_upgrade_converts_a_sha256_record_to_ld1(fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("no_ocdbt")
    _v1_record(_item(root))
    report = _verify(root, record=True, upgrade=True)
    assert report.ok and report.recorded
    record = read_digests(LocalLocation(str(_item(root))))
    assert record is not None and record.version == 2
    assert record.leaves[LEAF].ld1 == reference_digest(_leaf(_item(root)).read().result())
    assert _verify(root, deep=True).ok


def test_upgrade_refuses_an_item_whose_sha256_fails(fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("no_ocdbt")
    _v1_record(_item(root))
    _change_values(_item(root))
    report = _verify(root, record=True, upgrade=True)
    assert not report.ok and report.recorded == ()
    assert "digest-mismatch" in _codes(report)
    assert _record_json(_item(root))["version"] == 1  # the old record stays, not re-certified


def test_cp_keeps_a_valid_ld1_record(cli, fixture_copy, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("no_ocdbt")
    assert _verify(root, record=True).recorded
    dst = tmp_path / "copy"
    r = cli("cp", root, dst, "--verify")
    assert r.code == 0, r.stderr
    assert _record_json(_item(dst)) == _record_json(_item(root))
    deep = _verify(dst, deep=True)
    assert deep.ok and deep.items[0].digests == "checked"
    _change_values(_item(dst))
    assert "digest-mismatch" in _codes(_verify(dst, deep=True))
