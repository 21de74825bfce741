"""What ckpt does on Orbax 0.12.8's newest step states, proven by Orbax's own readers
configured like the writer (``fixtures/orbax012/states/``): after ``prune`` the writer still
restores its latest step; ``verify --mark-committed`` makes the older steps of a root that
switched to commit-file mode restorable by it, and nothing else; the steps ``cp``, ``import``
and ``average`` write are ones a commit-file reader accepts; the items of a step with a deletion
in progress are what the v1 Checkpointer loads."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.slow

STATES = REPO / "fixtures" / "orbax012" / "states"


def _ocp() -> Any:
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import orbax.checkpoint as ocp

    return ocp


def _commit_file_manager(root: Path) -> Any:
    ocp = _ocp()
    mode = ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE)
    options = ocp.CheckpointManagerOptions(atomicity_options=mode, create=False)
    return ocp.CheckpointManager(root.absolute(), options=options)


def _flat(tree: Any) -> dict[str, np.ndarray]:
    import jax

    return {
        jax.tree_util.keystr(k): np.asarray(v)
        for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def _copy(tmp_path: Path, root: str) -> Path:
    return shutil.copytree(STATES / root, tmp_path / root)


def test_after_prune_the_writer_restores_its_latest_step(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = _copy(tmp_path, "commit_file")
    with _commit_file_manager(root) as mngr:
        before = _flat(mngr.restore(2))
    assert cli("prune", root, "--keep-last", "1", "--yes").code == 0
    with _commit_file_manager(root) as mngr:
        assert list(mngr.all_steps()) == [2]
        after = _flat(mngr.restore(2))
    assert before and before.keys() == after.keys()
    for k, v in before.items():
        np.testing.assert_array_equal(v, after[k])


def test_mark_committed_makes_a_switched_roots_old_steps_restorable(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path
) -> None:
    root = _copy(tmp_path, "commit_file_switched")
    with _commit_file_manager(root) as mngr:
        assert list(mngr.all_steps()) == [3]
    assert cli("verify", root, "--deep", "--mark-committed").code == 0
    with _commit_file_manager(root) as mngr:
        assert list(mngr.all_steps()) == [1, 2, 3]  # step 4 never finished: not stamped
        assert _flat(mngr.restore(1))


def test_what_ckpt_writes_into_a_root_a_commit_file_reader_accepts(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path
) -> None:
    src = STATES / "commit_file"
    copy = tmp_path / "copy"
    assert cli("cp", src, copy).code == 0
    avg = tmp_path / "avg"
    assert cli("average", src, avg, "--steps", "1,2").code == 0
    hf = tmp_path / "hf"
    assert cli("export", src, hf, "--step", "2").code == 0
    back = tmp_path / "back"
    assert cli("import", hf, back, "--step", "2").code == 0
    with _commit_file_manager(copy) as mngr:
        assert list(mngr.all_steps()) == [1, 2]
        copied = _flat(mngr.restore(2))
    with _commit_file_manager(src) as mngr:
        original = _flat(mngr.restore(2))
    for k, v in original.items():
        np.testing.assert_array_equal(v, copied[k])
    for out in (avg, back):
        with _commit_file_manager(out) as mngr:
            assert list(mngr.all_steps()) == [2], out
            assert _flat(mngr.restore(2)), out


def test_a_step_with_a_deletion_in_progress_exports_what_the_v1_checkpointer_loads(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path
) -> None:
    import safetensors.numpy

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import orbax.checkpoint.experimental.v1 as v1

    root = _copy(tmp_path, "deletion")
    out = tmp_path / "hf"
    assert cli("export", root, out, "--step", "2").code == 0
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(out.glob("*.safetensors")):
        tensors.update(safetensors.numpy.load_file(f))
    with v1.training.Checkpointer(root.absolute()) as ckptr:
        loaded = ckptr.load_checkpointables(2)
    assert sorted(loaded) == ["model"]
    model = {k.strip("[]'").replace("']['", "."): v for k, v in _flat(loaded["model"]).items()}
    assert model and sorted(tensors) == sorted(model)  # one item exported: its own names
    for k, v in model.items():
        np.testing.assert_array_equal(tensors[k], v)
