"""After ``ckpt prune``, real Orbax sees exactly the kept steps and restores the latest one."""

from __future__ import annotations

import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.core.prune.plan import TRASH_PREFIX
from tests.support.prune_roots import KILLER, copy_steps, entries, run_script

pytestmark = pytest.mark.slow

LOSS = {10 * i: float(i % 4) for i in range(1, 11)}  # 40 and 80 are best (0.0), 30 and 70 worst


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten steps saved by a real CheckpointManager, with metrics (best_fn makes Orbax write them)."""
    import numpy as np
    import orbax.checkpoint as ocp

    path = tmp_path_factory.mktemp("orbax") / "run"
    options = ocp.CheckpointManagerOptions(
        best_fn=lambda m: m["loss"], best_mode="min", enable_async_checkpointing=False
    )
    with ocp.CheckpointManager(path, options=options) as mgr:
        for step, loss in LOSS.items():
            state = {"w": np.full((4, 3), step, np.float32), "step": np.int32(step)}
            mgr.save(step, args=ocp.args.StandardSave(state), metrics={"loss": loss})
    return path


@pytest.fixture
def root(template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(template, tmp_path / "run"))


def orbax_steps(root: Path) -> list[int]:
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(root) as mgr:
        return list(mgr.all_steps())


def restore_latest(root: Path) -> dict[str, Any]:
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(root) as mgr:
        restored: dict[str, Any] = mgr.restore(mgr.latest_step())
        return restored


@pytest.mark.parametrize(
    ("args", "kept"),
    [
        (["--keep-last", "3"], [80, 90, 100]),
        (["--keep-every", "30"], [30, 60, 90, 100]),
        (["--keep-step", "20", "--keep-step", "50"], [20, 50, 100]),
        (["--keep-best", "2", "--metric", "loss", "--mode", "min"], [40, 80, 100]),
        (["--keep-best", "3", "--metric", "loss", "--mode", "max"], [30, 70, 100]),
        (["--keep-within", "1h"], sorted(LOSS)),
        (
            [
                "--keep-last",
                "2",
                "--keep-every",
                "30",
                "--keep-best",
                "2",
                "--metric",
                "loss",
                "--mode",
                "min",
            ],
            [30, 40, 60, 80, 90, 100],
        ),
    ],
)
def test_orbax_sees_exactly_the_kept_steps(
    cli, root: Path, args: list[str], kept: list[int]
) -> None:  # type: ignore[no-untyped-def]
    r = cli("prune", root, *args, "--yes", "--json")
    assert r.code == 0, r.stderr
    assert [k["step"] for k in r.json()["keep"]] == kept
    assert orbax_steps(root) == kept
    restored = restore_latest(root)
    assert int(restored["step"]) == 100 and float(restored["w"][0, 0]) == 100.0


def test_time_buckets_on_real_steps(cli, template: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Real Orbax steps with their commit times set over three months."""
    days = {1: (1, 5), 2: (1, 20), 3: (2, 3), 4: (2, 3), 5: (2, 27), 6: (3, 1), 7: (3, 1)}

    def when(step: int) -> datetime:
        month, day = days[step]
        return datetime(2024, month, day, step, tzinfo=timezone.utc)

    root = copy_steps(tmp_path / "months", days, src=template / "100", committed_at=when)
    r = cli("prune", root, "--keep-daily", "2", "--keep-monthly", "3", "--yes", "--json")
    assert r.code == 0, r.stderr
    reasons = {k["step"]: k["reasons"] for k in r.json()["keep"]}
    assert reasons == {
        2: ["monthly 2024-01"],
        5: ["daily 2024-02-27", "monthly 2024-02"],
        7: ["latest", "daily 2024-03-01", "monthly 2024-03"],
    }
    assert orbax_steps(root) == [2, 5, 7]


def test_killed_prune_leaves_orbax_a_consistent_root(cli, root: Path) -> None:  # type: ignore[no-untyped-def]
    proc = run_script(
        KILLER, "rename", str(root), "20", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -9, err
    # Hidden steps vanished from Orbax's view at once; nothing else changed.
    assert orbax_steps(root) == [30, 40, 50, 60, 70, 80, 90, 100]
    assert int(restore_latest(root)["step"]) == 100
    r = cli("prune", root, "--keep-last", "2", "--clean-tmp", "--yes")
    assert r.code == 0, r.stderr
    assert orbax_steps(root) == [90, 100]
    assert not [n for n in entries(root) if n.startswith(TRASH_PREFIX)]
