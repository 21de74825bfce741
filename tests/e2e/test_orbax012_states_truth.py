"""The step states of Orbax 0.12.x (``fixtures/orbax012/states/``, written by
``fixtures/orbax012/make_states.py`` with orbax-checkpoint 0.12.8, each interruption a real
SIGKILL inside Orbax's own save, finalize or delete code): commit-file saves killed before
finalize, after the commit timestamp, in the middle of the data; a root that switched from
rename to commit-file mode; v1 deletions killed at each of their steps; partial saves finalized,
pending and killed. These tests prove the truth still holds against the installed Orbax, and that
the kill points still hit."""

from __future__ import annotations

import importlib.util
import json
import shutil
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.slow

HERE = REPO / "fixtures" / "orbax012"
STATES = HERE / "states"
TRUTH: dict[str, Any] = json.loads((STATES / "truth.json").read_text())
ROOTS = TRUTH["roots"]


def _make_states() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_states", HERE / "make_states.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ocp() -> Any:
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import orbax.checkpoint as ocp

    return ocp


def _v1() -> Any:
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import orbax.checkpoint.experimental.v1 as ocp_v1

    return ocp_v1


def _commit_file_options(**extra: Any) -> Any:
    ocp = _ocp()
    mode = ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE, **extra)
    return ocp.CheckpointManagerOptions(atomicity_options=mode)


def _all_steps(root: Path, options: Any = None) -> list[int]:
    with _ocp().CheckpointManager(root.absolute(), options=options) as mngr:
        return list(mngr.all_steps())


@pytest.fixture
def states(tmp_path: Path) -> Path:
    return shutil.copytree(STATES, tmp_path / "states")


@pytest.mark.parametrize("name", ["commit_file", "commit_file_late", "commit_file_switched"])
def test_the_commit_file_readers_list_what_the_truth_says(states: Path, name: str) -> None:
    readers = ROOTS[name]["readers"]
    root = states / name
    assert _all_steps(root, _commit_file_options()) == readers["writer"]["all_steps"]
    legacy = _commit_file_options(allow_legacy_atomic_rename=True)
    assert (
        _all_steps(root, legacy) == readers["commit_file_allow_legacy_atomic_rename"]["all_steps"]
    )
    assert _all_steps(root) == readers["default"]["all_steps"]
    # The facts the fixture was made for, stated once here so the truth cannot drift silently.
    want = {"commit_file": [1, 2], "commit_file_late": [1, 2], "commit_file_switched": [3]}
    assert readers["writer"]["all_steps"] == want[name]
    assert readers["default"]["all_steps"] == sorted(int(s) for s in ROOTS[name]["story"])


def test_the_writer_refuses_an_unfinished_step_that_the_default_reader_restores(
    states: Path,
) -> None:
    root = (states / "commit_file").absolute()
    with (
        _ocp().CheckpointManager(root, options=_commit_file_options()) as mngr,
        pytest.raises(ValueError, match="Found incomplete checkpoint"),
    ):
        mngr.restore(3)
    with _ocp().CheckpointManager(root) as mngr:
        restored = mngr.restore(3)
        with pytest.raises(FileNotFoundError, match="_METADATA"):
            mngr.restore(4)  # killed before its tree metadata
    leaves = ROOTS["commit_file"]["readers"]["default"]["restore"]["3"]["leaves"]
    assert _make_states().leaves_of(restored) == leaves


def test_a_pending_deletion_hides_its_checkpointable_from_the_v1_checkpointer(
    states: Path,
) -> None:
    v1 = _v1()
    truth = ROOTS["deletion"]["readers"]["writer"]
    with v1.training.Checkpointer((states / "deletion").absolute()) as ckptr:
        assert [c.step for c in ckptr.checkpoints] == truth["all_steps"] == [1, 2, 3, 4]
        for step in (2, 3):  # killed after the record; killed after the item's removal
            assert sorted(ckptr.load_checkpointables(step)) == ["model"]
            with pytest.raises(v1.errors.DeletionInProgressError, match="pending deletion"):
                ckptr.load_checkpointables(step, {"optimizer": None})
            by_name = truth["restore"][str(step)]["by_name"]["optimizer"]
            assert by_name["error"] == "DeletionInProgressError"
        assert ckptr.load_checkpointables(4) == {}  # only _CHECKPOINT_METADATA is left
    assert ROOTS["deletion"]["entries"]["4"]["files"] == ["_CHECKPOINT_METADATA"]


def test_the_v1_checkpointer_lists_the_finalized_partial_save_only(states: Path) -> None:
    truth = ROOTS["partial"]["readers"]["writer"]
    with _v1().training.Checkpointer((states / "partial").absolute()) as ckptr:
        assert [c.step for c in ckptr.checkpoints] == truth["all_steps"] == [1, 2]
        loaded = ckptr.load_checkpointables(2)
    assert _make_states().leaves_of(loaded) == truth["restore"]["2"]["leaves"]
    renamed = [p.name for p in (STATES / "partial" / "2" / "state").glob("ocdbt.process_0*")]
    assert len(renamed) == 2 and all(len(n) == len("ocdbt.process_0") + 32 for n in renamed)


@pytest.mark.parametrize("name", sorted(ROOTS))
def test_every_reader_still_says_what_the_truth_records(tmp_path: Path, name: str) -> None:
    make_states = _make_states()
    got = make_states.read_root(name, STATES / name, tmp_path)
    assert got["entries"] == ROOTS[name]["entries"]  # the committed bytes are the ones read
    assert got["readers"] == ROOTS[name]["readers"]


def test_the_kill_points_leave_the_steps_without_their_commit_file(tmp_path: Path) -> None:
    root = tmp_path / "commit_file"
    _make_states().make_commit_file(root)
    assert (root / "1" / "commit_success.txt").is_file()
    for step in ("3", "4"):
        assert not (root / step / "commit_success.txt").exists(), step
        meta = json.loads((root / step / "_CHECKPOINT_METADATA").read_text())
        assert meta["commit_timestamp_nsecs"] is None, step
    assert (root / "3" / "default" / "commit_success.txt").is_file()  # the item was finalized
    assert not (root / "4" / "default" / "_METADATA").exists()  # killed inside the item's save
    assert _all_steps(root, _commit_file_options()) == [1, 2]
