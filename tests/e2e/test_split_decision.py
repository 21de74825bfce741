"""``--workers N`` splits only when it pays: a tiny TrainState saved by the installed Orbax,
resharded and migrated with 2 local workers, stays in one process (JSON ``scale.split`` false
with the reason, the text says it, no worker database is written), restores into its abstract
state and trains on; ``--force-split`` splits it as before (units, worker databases)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

WORKER_DB = "ocdbt.process_w"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:

    from tests.support import linen_train_state as lts

    root = tmp_path_factory.mktemp("split") / "src"
    state = lts.save_trained(root)
    return root, state


def _worker_databases(root: Path) -> list[Path]:
    return [p for p in root.rglob(f"{WORKER_DB}*") if p.is_dir()]


def test_a_tiny_checkpoint_stays_in_one_process_and_says_why(
    cli: Any, saved: tuple[Path, Any], tmp_path: Path
) -> None:
    src, _ = saved
    spec = tmp_path / "spec.yaml"
    spec.write_text("rules:\n  - {op: cast, match: 'params\\.Dense_1\\.bias', dtype: bfloat16}\n")
    writers = {"reshard": ["--mesh", "data=1"], "migrate": ["--spec", str(spec)]}
    for writer, args in writers.items():
        dst = tmp_path / writer
        r = cli(writer, src, dst, *args, "--workers", "2", "--unit-bytes", "64", "--json")
        assert r.code == 0, r.stderr
        scale = r.json()["scale"]
        assert scale["split"] is False and scale["workers"] == 2, scale
        assert scale["units"] == 0 and scale["databases"] == 0, scale
        assert "in one process" in scale["reason"] and "--force-split" in scale["reason"]
        assert (dst / "1").is_dir() and not _worker_databases(dst), writer
    text = cli("reshard", src, tmp_path / "text", "--mesh", "data=1", "--workers", "2")
    assert text.code == 0, text.stderr
    assert "not split:" in text.stdout and "--force-split" in text.stdout


def test_force_split_splits_a_tiny_checkpoint(
    cli: Any, saved: tuple[Path, Any], tmp_path: Path
) -> None:
    src, _ = saved
    dst = tmp_path / "forced"
    small = ["--max-chunk-bytes", "16", "--unit-bytes", "64"]
    r = cli("reshard", src, dst, "--mesh", "data=1", *small, "--workers", "2", "--force-split",
            "--json")  # fmt: skip
    assert r.code == 0, r.stderr
    scale = r.json()["scale"]
    assert scale["split"] is True and scale["reason"] is None, scale
    assert scale["units"] >= 3 and scale["databases"] >= 1, scale
    assert len(_worker_databases(dst)) == scale["databases"]


def test_the_single_process_output_restores_and_trains_on(
    cli: Any, saved: tuple[Path, Any], tmp_path: Path
) -> None:

    from tests.support import linen_train_state as lts

    src, state = saved
    dst = tmp_path / "out"
    r = cli("reshard", src, dst, "--mesh", "data=1", "--workers", "2", "--json")
    assert r.code == 0 and r.json()["scale"]["split"] is False, r.stdout + r.stderr
    lts.assert_resumes(dst, state)
