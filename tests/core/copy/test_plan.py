"""What ``ckpt cp`` plans to copy (``core/copy/plan.py``) on real Orbax outputs, reading listings
only: every file of each chosen step, the commit markers ranked last (a step that is only half
there is never committed), ckpt's bookkeeping and half-written files never copied, what the
destination already holds, and the refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ckpt_cli.core.copy.destination import marker_rank
from ckpt_cli.core.copy.plan import copied, plan_copy
from ckpt_cli.errors import UsageError
from tests.support.paths import FIXTURES

SEED = FIXTURES / "seed_mlp"  # steps 300 400 500


def files(step: Path) -> list[str]:
    out = sorted(str(p.relative_to(step)) for p in step.rglob("*") if p.is_file())
    assert out, f"{step} holds no file"
    return out


def test_markers_rank_last_in_their_order() -> None:
    assert marker_rank("default/ocdbt.process_0/d/abc") is None  # data: first
    assert marker_rank("_CHECKPOINT_METADATA") == 0
    assert marker_rank("default/commit_success.txt") == 1
    assert marker_rank("commit_success.txt") == 2


def test_bookkeeping_and_partial_files_are_not_copied() -> None:
    assert copied("default/_METADATA") and copied("_CHECKPOINT_METADATA")
    assert not copied("default/._METADATA.tmp-1234")
    assert not copied("_CKPT_VERIFY_STATE.json")


def test_plan_names_every_file_of_each_step_and_writes_nothing(tmp_path: Path) -> None:
    dst = tmp_path / "copy"
    plan = plan_copy(str(SEED), str(dst))
    assert [s.step for s in plan.steps] == [300, 400, 500]
    for s in plan.steps:
        assert s.state == "new"
        assert sorted(o.rel for o in s.objects) == files(SEED / s.name)
        assert s.bytes == sum((SEED / s.name / o.rel).stat().st_size for o in s.objects)
    assert plan.total_objects == sum(len(s.objects) for s in plan.steps) + len(plan.root_files)
    doc = plan.to_json()
    assert doc["selection"] == "all" and [s["state"] for s in doc["steps"]] == ["new"] * 3
    assert all(s["to_copy_objects"] == s["objects"] for s in doc["steps"])
    assert not dst.exists()


def test_a_committed_copy_at_the_destination_is_to_check_not_to_copy(tmp_path: Path) -> None:
    dst = tmp_path / "copy"
    dst.mkdir()
    shutil.copytree(SEED / "500", dst / "500")
    plan = plan_copy(f"{SEED}@500", str(dst))
    [step] = plan.steps
    assert (step.step, step.state, step.pending()) == (500, "present", (0, 0))
    assert plan.to_json()["steps"][0]["to_check_objects"] == len(step.objects)


def test_steps_not_chosen_are_named_with_the_reason(tmp_path: Path) -> None:
    plan = plan_copy(str(FIXTURES / "with_tmp"), str(tmp_path / "c"))
    assert [s.step for s in plan.steps] == [1, 2]
    assert plan.skipped and all(reason for _, reason in plan.skipped)


@pytest.mark.parametrize(
    ("dst", "kw", "phrase"),
    [
        (str(SEED / "inside"), {}, "overlap"),
        ("elsewhere", {"concurrency": 0}, "at least 1 file at a time"),
        ("elsewhere", {"steps": [1], "latest": True}, "both choose steps"),
    ],
)
def test_requests_that_make_no_sense_are_usage_errors(
    tmp_path: Path, dst: str, kw: dict[str, object], phrase: str
) -> None:
    target = dst if dst.startswith("/") else str(tmp_path / dst)
    with pytest.raises(UsageError, match=phrase):
        plan_copy(str(SEED), target, **kw)  # type: ignore[arg-type]
    assert not Path(target).exists()
