"""Carried digests checked by the scaled-out writers and for version-1 (SHA-256) records.

A TrainState saved by the installed Orbax is recorded once; ``reshard``/``migrate`` on 2 local
worker processes and on a 2-worker Dask LocalCluster take the ``ld1`` partials of the regions
each unit writes, the driver merges them per leaf and compares them with the record: a clean
run records the same digests as the source (and restores; the next training step equals the
uninterrupted run's), a source value changed after recording is refused (exit 3,
``source-digest-mismatch``, no output step). A version-1 record is checked where a leaf is
written in C order by one process and carried unchecked where it is not (docs/reference/digest.md).
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
    import orbax.checkpoint as ocp

    from tests.support import linen_train_state as lts

    state, _ = lts.train_step(lts.make_state(), seed=1)
    with ocp.CheckpointManager(str(root)) as mgr:
        mgr.save(1, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
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
        "local": ["--workers", "2"],
        "dask": ["--executor", "dask", "--scheduler", cluster.scheduler_address],
    }


def test_scaled_reshard_checks_carried_ld1_and_training_resumes(
    cli: Any, saved: tuple[Path, Any], cluster: Any, tmp_path: Path
) -> None:
    import orbax.checkpoint as ocp

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
    with ocp.CheckpointManager(str(tmp_path / "dask")) as mgr:
        restored = mgr.restore(1, args=ocp.args.StandardRestore(lts.abstract_state()))
    resumed, loss = lts.train_step(restored, seed=2)
    expected, expected_loss = lts.train_step(state, seed=2)
    assert int(resumed.step) == 2 and np.isfinite(float(loss))
    assert float(loss) == float(expected_loss)


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
