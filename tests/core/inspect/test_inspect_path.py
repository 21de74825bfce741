"""``inspect_path`` on a step Orbax saved here: every leaf named as Orbax keys it, with the dtype,
shape and bytes of what was saved, the name filter, the stats read from the values, the training
state of a params-only save, and refusals of steps and items that are not there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt_cli.core.inspect import InspectResult
from ckpt_cli.core.inspect.step import inspect_path
from ckpt_cli.core.storage import open_location
from ckpt_cli.errors import NotFoundError

pytestmark = pytest.mark.slow

TREE = {
    "params": {
        "dense": {
            "kernel": np.arange(12, dtype=np.float32).reshape(3, 4),
            "bias": np.zeros(4, np.float32),
        },
        "embed": np.ones((5, 2), np.int32),
    }
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import orbax.checkpoint as ocp

    path = tmp_path_factory.mktemp("inspect") / "run"
    with ocp.CheckpointManager(path) as mgr:
        mgr.save(7, args=ocp.args.StandardSave(TREE))
        mgr.wait_until_finished()
    return path


def _result(root: Path, **kw: Any) -> InspectResult:
    got = inspect_path(open_location(str(root)), step=7, **kw)
    assert isinstance(got, InspectResult)
    return got


def test_every_saved_array_is_a_leaf_with_its_dtype_shape_and_bytes(root: Path) -> None:
    leaves = {leaf.name: leaf for leaf in _result(root).report.leaves if leaf.is_array}
    want = {
        "params.dense.kernel": ((3, 4), "float32", 48),
        "params.dense.bias": ((4,), "float32", 16),
        "params.embed": ((5, 2), "int32", 40),
    }
    assert set(leaves) == set(want)
    for name, (shape, dtype, nbytes) in want.items():
        assert (leaves[name].shape, leaves[name].dtype, leaves[name].size_bytes) == (
            shape,
            dtype,
            nbytes,
        )


def test_the_name_filter_keeps_only_matching_leaves(root: Path) -> None:
    names = [leaf.name for leaf in _result(root, name_filter="dense").report.leaves]
    assert names and all("dense" in n for n in names)


def test_stats_are_read_from_the_values(root: Path) -> None:
    stats = _result(root, stats=True).stats
    assert stats is not None
    kernel = stats["params.dense.kernel"]
    assert (kernel.min, kernel.max) == (0.0, 11.0)
    assert kernel.mean == pytest.approx(5.5)


def test_a_params_only_save_is_not_a_complete_training_state(root: Path) -> None:
    state = _result(root).report.training_state
    assert not state.complete
    assert "opt_state" in [str(part) for part in state.missing]


def test_a_step_or_item_that_is_not_there_is_refused(root: Path) -> None:
    with pytest.raises(NotFoundError):
        inspect_path(open_location(str(root)), step=8)
    with pytest.raises(NotFoundError):
        inspect_path(open_location(str(root)), step=7, item="nope")
