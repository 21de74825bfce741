"""Real Orbax and ckpt's pins: Orbax lists and restores pinned steps, its own retention deletes
a pinned step (pin and all) unless the manager is given ``PinnedSteps``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ckpt_cli.core.format.pins import PIN_FILE, pin_step
from ckpt_cli.core.prune.orbax_policy import PinnedSteps
from ckpt_cli.core.storage import LocalLocation

pytestmark = pytest.mark.slow


def _state(step: int) -> dict[str, object]:
    return {"w": np.full((4, 3), step, np.float32), "step": np.int32(step)}


def _pin(root: Path, step: int) -> None:
    loc = LocalLocation(str(root))
    assert pin_step(loc, step, "keep me", loc.list()).changed


def _run(root: Path, policy: object | None) -> list[int]:
    import orbax.checkpoint as ocp
    from orbax.checkpoint import checkpoint_managers as cm

    kw: dict[str, object] = {"enable_async_checkpointing": False}
    if policy is None:
        kw["max_to_keep"] = 1
    else:
        kw["preservation_policy"] = cm.AnyPreservationPolicy([cm.LatestN(1), policy])
    with ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(**kw)) as mgr:
        for step in range(4):
            mgr.save(step, args=ocp.args.StandardSave(_state(step)))
            if step == 1:
                _pin(root, 1)
        steps = list(mgr.all_steps())
    # A fresh manager sees the same steps, and restores the pinned one: the pin file is ignored.
    with ocp.CheckpointManager(root) as mgr:
        assert list(mgr.all_steps()) == steps
        if 1 in steps:
            restored = mgr.restore(1)
            assert int(restored["step"]) == 1 and float(restored["w"][0, 0]) == 1.0
    return steps


def test_orbax_retention_ignores_pins_without_the_policy(tmp_path: Path) -> None:
    assert _run(tmp_path / "run", None) == [3]
    assert not list((tmp_path / "run").rglob(PIN_FILE))  # gone with its step


def test_pinned_steps_policy_keeps_the_pinned_step(tmp_path: Path) -> None:
    root = tmp_path / "run"
    assert _run(root, PinnedSteps(root)) == [1, 3]
    assert (root / "1" / PIN_FILE).is_file()
