"""A step's state from its writer's own evidence (``core/format/evidence.py``), on the real
Orbax 0.12.8 outputs of ``fixtures/orbax012/states/`` (each interruption a real SIGKILL inside
Orbax's save, finalize or delete code; ``truth.json`` is what Orbax's own readers said).

The committed steps are exactly those the writer's own reader (configured like the writer)
restores; a step a deletion left with nothing in it is no step, whatever the v1 Checkpointer
lists."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.core.format.discovery import list_steps
from ckpt_cli.core.format.evidence import read_deletion_record
from ckpt_cli.core.storage import open_location
from ckpt_cli.errors import InvalidMetadataError
from tests.support.paths import REPO

STATES = REPO / "fixtures" / "orbax012" / "states"
TRUTH: dict[str, Any] = json.loads((STATES / "truth.json").read_text())


def _restorable(root: str) -> list[int]:
    """The steps the writer's own reader lists and restores something from."""
    writer = TRUTH["roots"][root]["readers"]["writer"]
    restored = writer.get("restore", {})
    out = []
    for step in writer["all_steps"]:
        got = restored.get(str(step))
        if got is None or (got.get("ok") and got.get("leaves")):
            out.append(step)
    return out


def _states(root: Path) -> dict[str, tuple[str, str | None, tuple[str, ...]]]:
    steps = list_steps(open_location(str(root)))
    assert steps
    return {s.name: (s.status, s.reason, s.deleting) for s in steps}


@pytest.mark.parametrize("root", ["commit_file", "commit_file_late", "commit_file_switched"])
def test_committed_steps_are_what_the_commit_file_writer_restores(root: str) -> None:
    states = _states(STATES / root)
    committed = sorted(int(n) for n, (status, _, _) in states.items() if status == "committed")
    assert committed == _restorable(root) == TRUTH["roots"][root]["readers"]["writer"]["all_steps"]
    for name, (status, reason, _) in states.items():
        assert (status == "committed") == (reason is None), name


def test_a_null_commit_timestamp_is_a_save_that_never_finished() -> None:
    states = _states(STATES / "commit_file")
    for name in ("3", "4"):
        status, reason, _ = states[name]
        assert status == "uncommitted"
        assert reason is not None and "commit_timestamp_nsecs is null" in reason


def test_a_step_missing_only_its_marker_in_a_commit_file_root_is_uncommitted() -> None:
    status, reason, _ = _states(STATES / "commit_file_late")["3"]
    assert status == "uncommitted"
    assert reason is not None and "written in place" in reason


def test_the_same_step_in_a_renaming_root_is_committed(tmp_path: Path) -> None:
    """A renamed step of a release before 0.12.3 has no marker and is whole: the evidence that
    the writer writes in place is its items' markers, and a renamed root has none such."""
    root = tmp_path / "run"
    shutil.copytree(STATES / "commit_file_switched", root)
    for step in ("3", "4"):
        shutil.rmtree(root / step)
    states = _states(root)
    assert {n: s for n, (s, _, _) in states.items()} == {"1": "committed", "2": "committed"}


def test_deletion_records_name_the_item_being_deleted() -> None:
    states = _states(STATES / "deletion")
    assert states["1"] == ("committed", None, ())
    assert states["2"] == ("committed", None, ("optimizer",))
    assert states["3"] == ("committed", None, ("optimizer",))
    status, reason, _ = states["4"]
    assert status == "incomplete" and reason is not None and "stopped deletion" in reason
    committed = [int(n) for n, (s, _, _) in states.items() if s == "committed"]
    assert committed == _restorable("deletion") == [1, 2, 3]


def test_partial_saves_are_never_steps() -> None:
    states = _states(STATES / "partial")
    assert states["3.partial_save"][0] == "partial"
    assert states["4.partial_save"][0] == "partial"
    assert states["4.partial_save.orbax-checkpoint-tmp"][0] == "incomplete"
    committed = [int(n) for n, (s, _, _) in states.items() if s == "committed"]
    assert committed == TRUTH["roots"]["partial"]["readers"]["writer"]["all_steps"]


def _damaged_record(tmp_path: Path, change: Any) -> Path:
    root = tmp_path / "run"
    shutil.copytree(STATES / "deletion", root)
    record = root / "2" / "_CHECKPOINT_DELETION"
    doc = json.loads(record.read_text())
    change(doc)
    record.write_text(json.dumps(doc))
    return root


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda d: d.update(checkpointable_name="nosuch"), "updated_metadata"),
        (lambda d: d.pop("checkpointable_name"), "names no item"),
        (lambda d: d.update(checkpointable_name="../x"), "names no item"),
        (lambda d: d.update(operation_id="xyz"), "operation_id"),
    ],
)
def test_an_invalid_deletion_record_makes_the_step_unrestorable(
    tmp_path: Path, change: Any, says: str
) -> None:
    root = _damaged_record(tmp_path, change)
    with pytest.raises(InvalidMetadataError, match=says):
        read_deletion_record(open_location(str(root / "2")))
    status, reason, deleting = _states(root)["2"]
    assert status == "uncommitted" and deleting == ()
    assert reason is not None and "_CHECKPOINT_DELETION" in reason and says in reason
