"""Entries that vanish or appear while prune lists the root are expected, not
errors, and nothing is wrongly deleted.

The race is forced by the shim: the first time prune lists ``ENTRY`` (after it saw it in the
root's listing) the entry is renamed away, as a trainer's save being committed
(``4.orbax-checkpoint-tmp`` -> ``4``) or a step removed by the trainer's own retention.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.ckpt_process import INTERNAL_ERROR, ckpt, committed_steps, orbax_steps
from tests.support.prune_roots import SMALL_STEP, copy_steps


def _root(tmp_path: Path) -> Path:
    root = copy_steps(tmp_path / "R", [1, 2, 3])
    tmp = root / "4.orbax-checkpoint-tmp"
    shutil.copytree(SMALL_STEP, tmp)
    (tmp / "commit_success.txt").unlink()
    return root


@pytest.mark.parametrize("extra", [[], ["--clean-tmp", "--tmp-min-age", "1h"]])
def test_save_committed_while_prune_lists(tmp_path: Path, extra: list[str]) -> None:
    root = _root(tmp_path)
    spec = {"vanish": {"path": str(root / "4.orbax-checkpoint-tmp"), "to": str(root / "4")}}
    run = ckpt("prune", root, "--keep-last", "2", *extra, "--yes", spec=spec, mem_limit=None)
    assert INTERNAL_ERROR not in run.stderr
    assert run.code == 0, run.stderr
    # Step 1 deleted as planned; the step committed meanwhile is untouched.
    assert committed_steps(root) == [2, 3, 4]
    assert orbax_steps(root) == [2, 3, 4]


def test_step_removed_by_the_trainer_while_prune_lists(tmp_path: Path) -> None:
    root = copy_steps(tmp_path / "R", [1, 2, 3, 4])
    spec = {"vanish": {"path": str(root / "1"), "to": str(tmp_path / "elsewhere")}}
    run = ckpt("prune", root, "--keep-last", "2", "--yes", spec=spec, mem_limit=None)
    assert run.code == 0, run.stderr
    assert committed_steps(root) == [3, 4]


def test_step_appearing_mid_listing_is_never_deleted(tmp_path: Path) -> None:
    """The other direction already holds: step 4, committed by a rename while prune lists step
    3, either counts in the plan or not; it is never deleted, nor is anything the policy
    keeps once it exists."""
    root = copy_steps(tmp_path / "R", [1, 2, 3])
    shutil.copytree(SMALL_STEP, tmp_path / "pending")
    spec = {
        "vanish": {
            "path": str(tmp_path / "pending"),
            "to": str(root / "4"),
            "when": str(root / "3"),
        }
    }
    run = ckpt("prune", root, "--keep-last", "2", "--json", "--yes", spec=spec, mem_limit=None)
    assert run.code == 0, run.stderr
    deleted = {d["step"] for d in run.json()["delete"]}
    assert 1 in deleted and deleted <= {1, 2}
    assert committed_steps(root) == sorted({1, 2, 3, 4} - deleted)
