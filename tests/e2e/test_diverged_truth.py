"""The diverged training runs (``fixtures/diverged/``, written by its own ``make.py`` with
orbax-checkpoint 0.12.8): a Flax linen and a Flax NNX MLP trained with Adam, every step kept by
a ``CheckpointManager`` with loss metrics, NaN from step 5 on. Restored now by the installed
Orbax, a few steps still hold what ``truth.json`` says: the kept steps, the metrics (NaN as the
bare ``NaN`` token on disk), the NaN and Inf counts and the norms of the finite leaves."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.slow

DIVERGED = REPO / "fixtures" / "diverged"
TRUTH: dict[str, Any] = json.loads((DIVERGED / "truth.json").read_text())
RUNS = ["linen", "nnx"]
CHECKED_STEPS = [4, 5, 8]  # the last finite step, the first NaN one, the last


def _manager(root: Path) -> Any:
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(
        best_fn=lambda m: m["loss"], best_mode="min", read_only=True
    )
    return ocp.CheckpointManager(root.absolute(), options=options)


def _leaves(tree: Any) -> dict[str, dict[str, Any]]:
    """As the truth records a restored leaf: dtype, shape, NaN and Inf counts, L2 or None."""
    import jax

    out: dict[str, dict[str, Any]] = {}
    for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        wide = np.asarray(value).astype(np.float64)
        out[name] = {
            "dtype": str(np.asarray(value).dtype),
            "shape": list(np.shape(value)),
            "nan": int(np.isnan(wide).sum()),
            "posinf": int(np.isposinf(wide).sum()),
            "neginf": int(np.isneginf(wide).sum()),
            "l2": float(np.linalg.norm(wide.ravel())) if np.isfinite(wide).all() else None,
        }
    return out


def _same(got: dict[str, dict[str, Any]], want: dict[str, dict[str, Any]]) -> None:
    assert sorted(got) == sorted(want)
    for name, leaf in want.items():
        norm = got[name].pop("l2")
        assert got[name] == {k: v for k, v in leaf.items() if k != "l2"}, name
        if leaf["l2"] is None:
            assert norm is None, name
        else:
            assert norm == pytest.approx(leaf["l2"], rel=1e-12), name


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shutil.copytree(DIVERGED, tmp_path_factory.mktemp("diverged") / "diverged")


@pytest.mark.parametrize("run", RUNS)
def test_orbax_restores_what_the_truth_records(runs: Path, run: str) -> None:
    import orbax.checkpoint as ocp

    truth = TRUTH[run]
    restore = ocp.args.Composite(**{item: ocp.args.StandardRestore() for item in truth["items"]})
    with _manager(runs / run) as mngr:
        assert list(mngr.all_steps()) == truth["all_steps"] == list(range(1, 9))
        assert mngr.best_step() == truth["orbax_best_step"] == 8  # min over NaN losses: a NaN step
        for step in CHECKED_STEPS:
            want = truth["steps"][str(step)]
            restored = mngr.restore(step, args=restore)
            for item in truth["items"]:
                _same(_leaves(restored[item]), want["items"][item])
            loss = mngr.metrics(step)["loss"]
            assert (math.isnan(loss) and want["metrics"]["loss"] == "nan") or (
                loss == want["metrics"]["loss"]
            )


@pytest.mark.parametrize("run", RUNS)
def test_the_run_is_finite_to_step_4_and_nan_from_step_5(run: str) -> None:
    truth = TRUTH[run]
    assert truth["last_finite_step"] == 4 and truth["first_nonfinite_step"] == 5
    losses = [truth["steps"][str(s)]["metrics"]["loss"] for s in truth["all_steps"]]
    assert all(isinstance(v, float) for v in losses[:5]) and losses[5:] == ["nan"] * 3
    for step in (6, 7, 8):  # what Orbax wrote: Python's json, bare NaN
        assert truth["steps"][str(step)]["metrics_file"] == '{"loss": NaN}'
    first = truth["steps"]["5"]["items"]
    for entry in truth["nonfinite_at_first"]:
        item, name = entry.split("/", 1)
        leaf = first[item][name]
        assert leaf["nan"] == math.prod(leaf["shape"]) and leaf["posinf"] == leaf["neginf"] == 0
    assert len(truth["nonfinite_at_first"]) == 12  # 4 parameters, their mu and nu
