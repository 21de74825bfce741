"""Prune plans (pure, synthetic steps) and their execution on copies of real Orbax roots."""

from __future__ import annotations

import dataclasses
import os
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from ckpt_cli.core.listing import StepInfo
from ckpt_cli.core.progress import Progress as PruneProgress
from ckpt_cli.core.prune.execute import execute_plan, prune_lock
from ckpt_cli.core.prune.plan import (
    LOCK_NAME,
    NO_STEP_RULE,
    SYMLINK_KEPT,
    TRASH_PREFIX,
    Leftover,
    PrunePlan,
    Removal,
    RootScan,
    plan_prune,
    scan_root,
)
from ckpt_cli.core.prune.policy import Policy
from ckpt_cli.core.storage import LocalLocation
from ckpt_cli.errors import LockedError, NotACheckpointError, StorageError, UsageError
from tests.support.prune_roots import (
    SMALL_STEP,
    age_tree,
    copy_steps,
    entries,
    step_dirs,
    tree_digest,
)

NOW = datetime(2024, 3, 15, 12, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)


def info(step: int, hours_ago: float = 0, status: str = "committed", size: int = 100) -> StepInfo:
    return StepInfo(
        step=step,
        name=str(step),
        path=f"/r/{step}",
        status=status,
        committed_at=NOW - hours_ago * HOUR,
        time_source="commit_metadata",
        size_bytes=size,
        items=("default",),
        metrics=None,
        formats={},
    )


def leftover(name: str, age: timedelta, *, symlink: bool = False) -> Leftover:
    return Leftover(name, f"/r/{name}", None, 10, NOW - age, symlink)


SCAN = RootScan("/r", tuple(info(s, hours_ago=6 - s, size=s) for s in range(1, 6)))


def test_plan_keep_delete_and_freed_bytes() -> None:
    plan = plan_prune(SCAN, Policy(keep_last=2), NOW)
    assert [(k.step, k.reasons) for k in plan.keep] == [(4, ("last 2",)), (5, ("latest", "last 2"))]
    assert [r.step for r in plan.delete] == [1, 2, 3]
    assert plan.freed_bytes == 1 + 2 + 3
    doc = plan.to_json()
    assert doc["keep"][1] == {
        "step": 5,
        "name": "5",
        "path": "/r/5",
        "committed_at": "2024-03-15T11:00:00+00:00",
        "reasons": ["latest", "last 2"],
        "metric": None,  # the --keep-best value: no such rule here
        "metrics_nonfinite": None,  # it records no metrics
    }
    assert doc["delete"][0] == {
        "step": 1,
        "name": "1",
        "path": "/r/1",
        "committed_at": "2024-03-15T07:00:00+00:00",
        "metric": None,
        "metrics_nonfinite": None,
        "size_bytes": 1,
    }
    assert doc["freed_bytes"] == 6 and doc["policy"]["keep_last"] == 2
    assert doc["schema_version"] == 2 and doc["warnings"] == []


def test_plan_refuses_an_empty_policy() -> None:
    with pytest.raises(UsageError, match="no retention rule given"):
        plan_prune(SCAN, Policy(), NOW)


def test_plan_clean_tmp_alone_keeps_every_step() -> None:
    plan = plan_prune(SCAN, Policy(), NOW, clean_tmp=True)
    assert {k.step: k.reasons for k in plan.keep} == {s: (NO_STEP_RULE,) for s in range(1, 6)}
    assert plan.delete == ()


def test_plan_symlinked_step_is_kept_and_says_why() -> None:
    scan = dataclasses.replace(SCAN, symlinks=frozenset({"2", "5"}))
    plan = plan_prune(scan, Policy(keep_last=1), NOW)
    assert {k.step: k.reasons for k in plan.keep} == {
        2: (SYMLINK_KEPT,),
        5: ("latest", "last 1"),
    }
    assert [r.step for r in plan.delete] == [1, 3, 4]


def test_plan_uncommitted_steps_are_untouched_and_never_latest() -> None:
    scan = RootScan("/r", (info(1), info(2), info(3, status="uncommitted")))
    plan = plan_prune(scan, Policy(keep_last=1), NOW)
    assert [(k.step, k.reasons) for k in plan.keep] == [(2, ("latest", "last 1"))]
    assert [r.step for r in plan.delete] == [1]
    assert [(u.name, u.why) for u in plan.untouched] == [
        ("3", "uncommitted, skipped: a save may still be in progress")
    ]


def test_plan_tmp_dirs_young_old_symlinked() -> None:
    scan = dataclasses.replace(
        SCAN,
        tmp=(
            leftover("6.orbax-checkpoint-tmp", 3 * HOUR),
            leftover("7.orbax-checkpoint-tmp-0", timedelta(minutes=20)),
            leftover("8.orbax-checkpoint-tmp", 5 * HOUR, symlink=True),
        ),
    )
    without = plan_prune(scan, Policy(keep_last=5), NOW)
    assert without.clean == ()
    assert {u.why for u in without.untouched} == {"unfinished save (--clean-tmp removes it)"}

    plan = plan_prune(scan, Policy(keep_last=5), NOW, clean_tmp=True)
    assert [(r.kind, r.name) for r in plan.clean] == [("tmp", "6.orbax-checkpoint-tmp")]
    assert {u.name: u.why for u in plan.untouched} == {
        "7.orbax-checkpoint-tmp-0": "unfinished save modified 20m ago, "
        "younger than --tmp-min-age 1h",
        "8.orbax-checkpoint-tmp": SYMLINK_KEPT,
    }
    assert plan.freed_bytes == 10 and plan.to_json()["policy"]["tmp_min_age"] == "1h"

    lax = plan_prune(
        scan, Policy(keep_last=5), NOW, clean_tmp=True, tmp_min_age=timedelta(minutes=10)
    )
    assert {r.name for r in lax.clean} == {"6.orbax-checkpoint-tmp", "7.orbax-checkpoint-tmp-0"}


def test_plan_trash_is_always_removed_unknown_dirs_left() -> None:
    scan = dataclasses.replace(
        SCAN,
        trash=(
            leftover(".ckpt-trash-3-ab12cd34", HOUR),
            leftover(".ckpt-trash-x", HOUR, symlink=True),
        ),
        unknown=("junk",),
    )
    plan = plan_prune(scan, Policy(keep_last=5), NOW)
    assert [(r.kind, r.name) for r in plan.clean] == [("trash", ".ckpt-trash-3-ab12cd34")]
    assert {u.name: u.why for u in plan.untouched} == {
        ".ckpt-trash-x": SYMLINK_KEPT,
        "junk": "not a step directory",
    }
    assert not plan.is_noop


# -- on real roots ---------------------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Steps 100..600 (copies of a real Orbax step), an old and a young tmp dir, trash, junk."""
    r = copy_steps(tmp_path / "run", range(100, 700, 100))
    shutil.copytree(FIXTURE_TMP, r / "700.orbax-checkpoint-tmp")
    age_tree(r / "700.orbax-checkpoint-tmp", 3 * 3600)
    shutil.copytree(FIXTURE_TMP, r / "800.orbax-checkpoint-tmp-1703334121930256")
    # copytree keeps the fixture's mtimes (as old as its checkout): make this one a save in progress.
    age_tree(r / "800.orbax-checkpoint-tmp-1703334121930256", 0)
    shutil.copytree(SMALL_STEP, r / f"{TRASH_PREFIX}50-0badc0de")
    (r / "junk").mkdir()
    (r / "notes.txt").write_text("keep me")
    return r


FIXTURE_TMP = SMALL_STEP.parent / "3.orbax-checkpoint-tmp"


def test_scan_root_sees_steps_tmp_trash_and_unknown(root: Path) -> None:
    (root / f"{TRASH_PREFIX}a-file").write_text("not made by prune")
    scan = scan_root(LocalLocation(str(root)))
    assert [s.step for s in scan.steps] == [100, 200, 300, 400, 500, 600]
    assert [t.name for t in scan.tmp] == [
        "700.orbax-checkpoint-tmp",
        "800.orbax-checkpoint-tmp-1703334121930256",
    ]
    assert [t.name for t in scan.trash] == [f"{TRASH_PREFIX}50-0badc0de"]
    assert scan.trash[0].size_bytes == sum(
        p.stat().st_size for p in SMALL_STEP.rglob("*") if p.is_file()
    )
    assert scan.unknown == ("junk",)
    old, young = scan.tmp
    assert datetime.now(timezone.utc) - old.modified_at > 2 * HOUR
    assert datetime.now(timezone.utc) - young.modified_at < HOUR


def test_a_save_writing_deep_inside_an_old_tmp_dir_is_young(root: Path) -> None:
    tmp = root / "700.orbax-checkpoint-tmp"
    deep = next(p for p in tmp.rglob("*") if p.is_file() and p.parent.name == "d")
    deep.write_bytes(deep.read_bytes())  # a chunk being written now; its parent dirs stay old
    assert datetime.now().timestamp() - tmp.stat().st_mtime > 2 * 3600
    loc = LocalLocation(str(root))
    plan = plan_prune(
        scan_root(loc), Policy(keep_last=9), datetime.now(timezone.utc), clean_tmp=True
    )
    assert "700.orbax-checkpoint-tmp" not in {r.name for r in plan.clean}
    assert any(u.name == "700.orbax-checkpoint-tmp" for u in plan.untouched)


def test_scan_refuses_a_step_directory(root: Path) -> None:
    with pytest.raises(NotACheckpointError, match="not a root of steps"):
        scan_root(LocalLocation(str(root / "600")))


def test_execute_deletes_planned_and_keeps_the_rest_byte_for_byte(root: Path) -> None:
    loc = LocalLocation(str(root))
    plan = plan_prune(
        scan_root(loc), Policy(keep_last=2), datetime.now(timezone.utc), clean_tmp=True
    )
    kept_before = {
        n: tree_digest(root / n)
        for n in ("500", "600", "800.orbax-checkpoint-tmp-1703334121930256")
    }
    events: list[PruneProgress] = []
    outcome = execute_plan(plan, loc, on_progress=events.append)

    assert {r.name for r in outcome.deleted} == {
        "100", "200", "300", "400", "700.orbax-checkpoint-tmp", f"{TRASH_PREFIX}50-0badc0de",
    }  # fmt: skip
    assert outcome.skipped == () and outcome.failed == ()
    assert outcome.freed_bytes == plan.freed_bytes > 0
    assert entries(root) == [
        "500", "600", "800.orbax-checkpoint-tmp-1703334121930256", "junk", "notes.txt",
    ]  # fmt: skip
    assert {n: tree_digest(root / n) for n in kept_before} == kept_before
    # Every entry is hidden (renamed) before any is deleted.
    assert [e.action for e in events] == ["hide"] * 6 + ["delete"] * 6
    assert events[-1] == PruneProgress("delete", "400", 6, 6)


def test_trainer_saving_meanwhile_is_untouched(root: Path) -> None:
    loc = LocalLocation(str(root))
    plan = plan_prune(
        scan_root(loc), Policy(keep_last=1), datetime.now(timezone.utc), clean_tmp=True
    )
    # After the plan, the trainer commits step 900 and starts saving 1000.
    copy_steps(root, [900])
    shutil.copytree(FIXTURE_TMP, root / "1000.orbax-checkpoint-tmp")
    new = {n: tree_digest(root / n) for n in ("900", "1000.orbax-checkpoint-tmp")}
    execute_plan(plan, loc)
    assert step_dirs(root) == {600, 900}
    assert {n: tree_digest(root / n) for n in new} == new


def test_execute_rechecks_every_entry(root: Path, tmp_path: Path) -> None:
    loc = LocalLocation(str(root))
    plan = plan_prune(
        scan_root(loc), Policy(keep_last=1), datetime.now(timezone.utc), clean_tmp=True
    )
    outside = copy_steps(tmp_path / "elsewhere", [200]) / "200"
    outside_digest = tree_digest(outside)
    # Between plan and deletion: 100 vanishes, 200 becomes a symlink out of the root,
    # and the old tmp dir gets written to again.
    shutil.rmtree(root / "100")
    shutil.rmtree(root / "200")
    (root / "200").symlink_to(outside, target_is_directory=True)
    (root / "700.orbax-checkpoint-tmp" / "commit_success.txt").write_text("x")

    outcome = execute_plan(plan, loc)
    assert {s.name: s.why for s in outcome.skipped} == {
        "100": "gone before deletion",
        "200": SYMLINK_KEPT,
        "700.orbax-checkpoint-tmp": "modified since the plan: a save may be in progress",
    }
    assert {r.name for r in outcome.deleted} == {"300", "400", "500", f"{TRASH_PREFIX}50-0badc0de"}
    assert (root / "200").is_symlink() and tree_digest(outside) == outside_digest
    assert (root / "700.orbax-checkpoint-tmp").is_dir()


def test_execute_refuses_entries_it_does_not_recognise(root: Path) -> None:
    """Even a plan naming them (a bug, a hand-made plan) cannot delete these."""
    (root / "metadata").mkdir()
    loc = LocalLocation(str(root))
    forged = PrunePlan(
        root=str(root),
        policy=Policy(keep_last=1),
        keep=(),
        delete=tuple(Removal("step", n, str(root / n), 0, 0) for n in ("metadata", "junk", "..")),
        clean=(
            Removal("trash", "junk", str(root / "junk"), 0),
            Removal("tmp", "700.orbax-checkpoint-tmp", str(root), 0),  # tmp without --clean-tmp
        ),
        untouched=(),
        tmp_min_age=None,
    )
    outcome = execute_plan(forged, loc)
    assert outcome.deleted == ()
    assert {s.why for s in outcome.skipped} == {"not a step or tmp directory of this root"}
    assert {"metadata", "junk", "700.orbax-checkpoint-tmp"} <= set(entries(root))


def test_storage_rename_and_delete_tree_refuse_unsafe_targets(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "a")
    with pytest.raises(StorageError, match="exists"):
        LocalLocation(str(tmp_path / "a")).rename("b")
    for name in ("link", "f"):
        with pytest.raises(StorageError, match="refusing to delete"):
            LocalLocation(str(tmp_path / name)).delete_tree()
    assert (tmp_path / "a").is_dir() and (tmp_path / "link").is_symlink()
    moved = LocalLocation(str(tmp_path / "a")).rename("c")
    assert moved.name == "c" and entries(tmp_path) == ["b", "c", "f", "link"]


def test_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    lock_file = LocalLocation(str(tmp_path / LOCK_NAME))
    first = lock_file.try_lock("first")
    assert first is not None
    assert lock_file.try_lock("second") is None
    assert (tmp_path / LOCK_NAME).read_text() == "first"
    first.release()
    assert not (tmp_path / LOCK_NAME).exists()
    again = lock_file.try_lock("again")
    assert again is not None
    again.release()


def test_lock_taken_on_a_file_just_unlinked_is_not_a_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B opens the lock file, A releases it (unlink) and C takes a new one before B's flock:
    B's flock then succeeds on a dead inode, and B must not think it holds the lock."""
    import fcntl

    lock_file = LocalLocation(str(tmp_path / LOCK_NAME))
    a = lock_file.try_lock("A")
    assert a is not None
    holders: list[object] = []
    real_flock = fcntl.flock

    def flock(fd: int, op: int) -> None:
        if not holders:
            holders.append(None)
            a.release()
            holders.append(lock_file.try_lock("C"))
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    assert lock_file.try_lock("B") is None
    assert holders[1] is not None and (tmp_path / LOCK_NAME).read_text() == "C"


def test_lock_refuses_a_symlinked_lock_file(tmp_path: Path) -> None:
    (tmp_path / "target").write_text("")
    (tmp_path / LOCK_NAME).symlink_to(tmp_path / "target")
    with pytest.raises(StorageError, match="cannot open lock file"):
        LocalLocation(str(tmp_path / LOCK_NAME)).try_lock("me")


def test_prune_lock_refuses_a_second_prune(root: Path) -> None:
    loc = LocalLocation(str(root))
    with (
        prune_lock(loc),
        pytest.raises(
            LockedError, match=f"another prune of .* is running \\(prune pid {os.getpid()} on"
        ),
        prune_lock(loc),
    ):
        pass
    with prune_lock(loc):
        assert (root / LOCK_NAME).exists()
    assert not (root / LOCK_NAME).exists()
