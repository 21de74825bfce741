"""Carried digests checked by the scaled-out writers and for version-1 (SHA-256) records.

A TrainState saved by the installed Orbax is recorded once; ``reshard``/``migrate`` on 2 local
worker processes and on a 2-worker Dask LocalCluster take the ``ld1`` partials of the regions
each unit writes, the driver merges them per leaf and compares them with the record: a clean
run records the same digests as the source (and restores; the next training step equals the
uninterrupted run's), a source value changed after recording is refused (exit 3,
``source-digest-mismatch``, no output step). A version-1 record is checked where a leaf is
written in C order by one process and carried unchecked where it is not (docs/reference/digest.md),
and the run says which (``unchecked_digests``, a text line): on local workers and on Dask.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.cluster import local_cluster

pytestmark = pytest.mark.slow
distributed = pytest.importorskip("distributed")

KERNEL = "params.Dense_0.kernel"
#: Output chunks of 16 bytes and units of 64: the kernel (5x8 float32) spans several units.
SMALL = ["--max-chunk-bytes", "16", "--unit-bytes", "64"]


def _save(root: Path) -> Any:

    from tests.support import linen_train_state as lts

    state = lts.save_trained(root)
    return state


def _record(root: Path) -> dict[str, Any]:
    doc = json.loads((root / "1" / "default" / "_CKPT_DIGESTS.json").read_text())
    leaves = doc["leaves"]
    assert isinstance(leaves, dict) and leaves
    return {"version": doc["version"], "leaves": leaves}


def _damage(item: Path, name: str) -> None:
    """Change one value of a plain zarr2 leaf: every chunk still decodes, only a digest tells."""
    import tensorstore as ts

    assert (item / name).is_dir(), sorted(p.name for p in item.iterdir())
    arr = ts.open({"driver": "zarr", "kvstore": f"file://{item}/{name}/"}).result()
    values = arr.read().result()
    values[(0,) * values.ndim] += 1.0
    arr.write(values).result()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("ldscale") / "src"
    return root, _save(root)


def _plain(cli: Any, src: Path, dst: Path, *record: str) -> Path:
    """A plain-zarr2 copy of ``src`` (leaves one directory each), recorded (``record``: the
    ``verify`` flags, ld1 by default)."""
    assert cli("reshard", src, dst, "--mesh", "data=1", "--no-ocdbt").code == 0
    assert cli("verify", dst, "--record", *record).code == 0
    return dst


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster() as c:
        yield c


def _executors(cluster: Any) -> dict[str, list[str]]:
    return {
        "local": ["--workers", "2", "--force-split"],
        "dask": ["--executor", "dask", "--scheduler", cluster.scheduler_address, "--force-split"],
    }


def test_scaled_reshard_checks_carried_ld1_and_training_resumes(
    cli: Any, saved: tuple[Path, Any], cluster: Any, tmp_path: Path
) -> None:

    from tests.support import linen_train_state as lts

    src, state = saved
    plain = _plain(cli, src, tmp_path / "plain")
    recorded = _record(plain)
    assert recorded["version"] == 2
    for name, args in _executors(cluster).items():
        dst = tmp_path / name
        r = cli("reshard", plain, dst, "--mesh", "data=1", *SMALL, *args, "--json")
        assert r.code == 0, r.stderr
        scale = r.json()["scale"]
        assert scale["workers"] == 2 and scale["units"] >= 3, scale
        assert _record(dst) == recorded, name
        assert cli("verify", dst, "--deep").code == 0
    lts.assert_resumes(tmp_path / "dask", state)


def test_scaled_writers_refuse_a_source_changed_after_recording(
    cli: Any, saved: tuple[Path, Any], cluster: Any, tmp_path: Path
) -> None:
    plain = _plain(cli, saved[0], tmp_path / "plain")
    _damage(plain / "1" / "default", KERNEL)
    spec = tmp_path / "spec.yaml"
    spec.write_text("rules:\n  - {op: cast, match: 'params\\.Dense_1\\.bias', dtype: bfloat16}\n")
    writers = {"reshard": ["--mesh", "data=1"], "migrate": ["--spec", str(spec)]}
    runs = [(w, e, a) for w in writers for e, a in _executors(cluster).items()]
    assert len(runs) == 4
    for writer, executor, args in runs:
        dst = tmp_path / f"{writer}-{executor}"
        r = cli(writer, plain, dst, *writers[writer], *SMALL, *args, "--json")
        assert r.code == 3, (writer, executor, r.stdout + r.stderr)
        error = r.json()["error"]
        assert error["code"] == "source-digest-mismatch" and KERNEL in error["message"]
        assert not [p for p in dst.rglob("*") if p.name.startswith("1")], (writer, executor)


def _v1_record(item: Path, names: tuple[str, ...]) -> None:
    """A version-1 record, as ckpt wrote before ld1: SHA-256 of the C-order values."""
    import hashlib

    import tensorstore as ts

    from ckpt_cli.core.digest.records import (
        DigestRecord,
        LeafDigest,
        file_checksum,
        recorded_file,
        write_digests,
    )
    from ckpt_cli.core.storage import LocalLocation

    leaves = {}
    for name in names:
        arr = ts.open({"driver": "zarr", "kvstore": f"file://{item}/{name}/"}).result()
        x = np.ascontiguousarray(arr.read().result())
        leaves[name] = LeafDigest(str(x.dtype), x.shape, hashlib.sha256(x.tobytes()).hexdigest())
    files = {
        str(p.relative_to(item)): file_checksum(LocalLocation(str(p)))
        for p in sorted(item.rglob("*"))
        if p.is_file() and recorded_file(str(p.relative_to(item)))
    }
    assert files
    write_digests(LocalLocation(str(item)), DigestRecord(leaves, files, version=1))


V1_LEAVES = (KERNEL, "params.Dense_0.bias")


def _damage_keeping_v1(item: Path, recorded: dict[str, Any]) -> None:
    """The kernel changed after its version-1 record; the files re-summed, so only the leaf
    digest can tell."""
    _damage(item, KERNEL)
    _v1_record(item, ("params.Dense_0.bias",))
    doc = json.loads((item / "_CKPT_DIGESTS.json").read_text())
    doc["leaves"][KERNEL] = recorded["leaves"][KERNEL]
    (item / "_CKPT_DIGESTS.json").write_text(json.dumps(doc))


def test_v1_record_checked_where_a_leaf_is_written_in_c_order(
    cli: Any, saved: tuple[Path, Any], cluster: Any, tmp_path: Path
) -> None:
    plain = _plain(cli, saved[0], tmp_path / "plain")
    item = plain / "1" / "default"
    _v1_record(item, V1_LEAVES)
    recorded = _record(plain)
    assert recorded["version"] == 1 and set(recorded["leaves"]) == set(V1_LEAVES)
    runs = {
        "one process": [],
        "2 workers, whole leaf in one unit": _executors(cluster)["local"],
        "2 dask workers, whole leaf in one unit": _executors(cluster)["dask"],
    }
    for label, args in runs.items():
        clean = tmp_path / ("clean " + label).replace(" ", "-").replace(",", "")
        r = cli("reshard", plain, clean, "--mesh", "data=1", *args, "--json")
        assert r.code == 0, (label, r.stderr)
        assert r.json()["unchecked_digests"] == [], label
        assert _record(clean) == recorded, label
    _damage_keeping_v1(item, recorded)
    for label, args in runs.items():
        dst = tmp_path / label.replace(" ", "-").replace(",", "")
        r = cli("reshard", plain, dst, "--mesh", "data=1", *args, "--json")
        assert r.code == 3, (label, r.stdout + r.stderr)
        error = r.json()["error"]
        assert error["code"] == "source-digest-mismatch", label
        assert KERNEL in error["message"] and "SHA-256" in error["message"], label
        assert not [p for p in dst.rglob("*") if p.name.startswith("1")], label


@pytest.mark.parametrize("executor", ["local", "dask"])
def test_v1_record_of_a_leaf_spread_over_units_is_carried_unchecked_and_reported(
    cli: Any, saved: tuple[Path, Any], cluster: Any, tmp_path: Path, executor: str
) -> None:
    """Row order: SHA-256 needs the C-order stream from one process; a leaf cut into units is
    written by several. Such a leaf is carried unchecked, the run names it (JSON and text),
    ``verify --deep`` of the output catches the damage."""
    plain = _plain(cli, saved[0], tmp_path / "plain")
    item = plain / "1" / "default"
    _v1_record(item, V1_LEAVES)
    recorded = _record(plain)
    _damage_keeping_v1(item, recorded)
    args = ["--mesh", "data=1", *SMALL, *_executors(cluster)[executor]]
    dst = tmp_path / "dst"
    r = cli("reshard", plain, dst, *args, "--json")
    assert r.code == 0, r.stderr
    out = r.json()
    assert out["schema_version"] == 5 and out["scale"]["units"] >= 3, out["scale"]
    assert out["unchecked_digests"] == [{"item": "default", "leaf": KERNEL}]
    assert _record(dst) == recorded
    deep = cli("verify", dst, "--deep", "--json")
    assert deep.code == 1, deep.stdout
    assert KERNEL in deep.stdout
    text = cli("reshard", plain, tmp_path / "text", *args)
    assert text.code == 0, text.stderr
    line = "1 version-1 (SHA-256) digests carried unchecked (not written as one C-order stream)"
    assert f"{line}: {KERNEL};" in text.stdout and "ckpt verify --deep" in text.stdout
