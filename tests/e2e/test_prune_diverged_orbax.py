"""After ``ckpt prune --keep-last-finite`` on a diverged run (``fixtures/diverged/``), real Orbax
sees exactly the kept steps, restores the last healthy one with finite values, and ranks the kept
steps by their loss without a NaN among the finite ones."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.slow

DIVERGED = REPO / "fixtures" / "diverged"
TRUTH = json.loads((DIVERGED / "truth.json").read_text())


@pytest.mark.parametrize("run", ["linen", "nnx"])
def test_orbax_restores_the_steps_keep_last_finite_kept(cli, tmp_path: Path, run: str) -> None:  # type: ignore[no-untyped-def]
    root = Path(shutil.copytree(DIVERGED / run, tmp_path / run))
    r = cli("prune", root, "--keep-last-finite", "2", "--yes")
    assert r.code == 0, r.stderr
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import jax
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(best_fn=lambda m: m["loss"], best_mode="min")
    with ocp.CheckpointManager(root.absolute(), options=options) as mngr:
        assert list(mngr.all_steps()) == [4, 5, 8]
        assert math.isfinite(mngr.metrics(4)["loss"]) and math.isnan(mngr.metrics(8)["loss"])
        items = TRUTH[run]["items"]
        args = ocp.args.Composite(**{i: ocp.args.StandardRestore() for i in items})
        restored = mngr.restore(4, args=args)
    leaves = jax.tree_util.tree_leaves([restored[i] for i in items])
    assert leaves and all(np.isfinite(np.asarray(x, np.float64)).all() for x in leaves)
