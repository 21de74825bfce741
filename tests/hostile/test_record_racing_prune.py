"""``verify --record`` racing ``prune`` leaves no phantom step.

Recording never creates a directory; it writes atomically into a step that still exists, and
it coordinates with prune through a shared/exclusive lock on the root. The interleaving is
forced: the recorder is stopped (SIGSTOP, by the shim) as it is about to write its first
``_CKPT_DIGESTS.json``, after its deep pass; prune then runs; the recorder is continued.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.ckpt_process import (
    INTERNAL_ERROR,
    ckpt,
    committed_steps,
    finish,
    orbax_steps,
    phantoms,
    start,
    wait_stopped_or_exited,
)
from tests.support.prune_roots import copy_steps

PAUSE_AT_RECORD = {"on_write": "_CKPT_DIGESTS.json", "nth": 1, "signal": "STOP"}
#: Stopped at its N-th write of any kind, after the deep pass. Today each digest file costs three
#: (the item directory made if missing, the temporary file, the rename): 1 stops it before the
#: first item, 4 after the first item and before the second.
BEFORE_FIRST, AFTER_FIRST = 1, 4


@pytest.mark.parametrize(
    "nth",
    [
        pytest.param(BEFORE_FIRST, id="before-first-record"),
        pytest.param(AFTER_FIRST, id="after-first-record"),
    ],
)
def test_recorder_paused_before_writing_then_prune(tmp_path: Path, nth: int) -> None:
    """Prune keeps 1, 7, 8 and deletes 2-6 while the recorder is stopped."""
    root = copy_steps(tmp_path / "R", range(1, 9))
    rec = start("verify", root, "--record", spec={"on_write": "*", "nth": nth, "signal": "STOP"})
    assert wait_stopped_or_exited(rec), finish(rec).stderr
    pruned = ckpt("prune", root, "--keep-last", "2", "--keep-step", "1", "--yes")
    recorded = finish(rec)
    assert INTERNAL_ERROR not in pruned.stderr + recorded.stderr
    # Either prune waited for / was refused by the recorder's lock, or the recorder skipped
    # the steps that are gone: never a directory re-created.
    assert phantoms(root) == []
    listed = committed_steps(root)
    assert listed == orbax_steps(root)
    if pruned.code == 0:
        assert listed == [1, 7, 8]
    else:
        assert pruned.code == 3 and "verify" in pruned.stderr, pruned.stderr
        assert listed == list(range(1, 9))


def test_prune_refused_while_a_recorder_holds_the_root(tmp_path: Path) -> None:
    """The lock both ways: while the recorder works, a prune is refused at once with one line
    naming it (pid), and nothing is deleted."""
    root = copy_steps(tmp_path / "R", range(1, 5))
    rec = start("verify", root, "--record", spec=PAUSE_AT_RECORD)
    assert wait_stopped_or_exited(rec), finish(rec).stderr
    pruned = ckpt("prune", root, "--keep-last", "1", "--yes")
    finish(rec)
    assert pruned.code == 3, pruned.stdout
    assert f"pid {rec.pid}" in pruned.stderr and len(pruned.lines) == 1, pruned.stderr
    assert committed_steps(root) == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "nth",
    [
        pytest.param(BEFORE_FIRST, id="before-first-record"),
        pytest.param(AFTER_FIRST, id="after-first-record"),
    ],
)
def test_record_into_a_step_deleted_meanwhile_creates_nothing(tmp_path: Path, nth: int) -> None:
    """Without prune at all: the step dir vanishes (an operator's ``rm -r``) while the recorder
    is stopped; continued, it must not bring it back."""
    import shutil

    root = copy_steps(tmp_path / "R", range(1, 4))
    rec = start("verify", root, "--record", spec={"on_write": "*", "nth": nth, "signal": "STOP"})
    assert wait_stopped_or_exited(rec), finish(rec).stderr
    shutil.rmtree(root / "2")
    recorded = finish(rec)
    assert not (root / "2").exists()
    assert INTERNAL_ERROR not in recorded.stderr
    assert (root / "3" / "default" / "_CKPT_DIGESTS.json").exists() or recorded.code != 0
