"""Every command reads a step's state the same way (``core/format/evidence.py``), on real Orbax
0.12.8 roots whose saves and deletions were killed inside Orbax's own code
(``fixtures/orbax012/states/``): ``ls`` says why a step is not committed, ``prune`` counts and
deletes only restorable steps and says what it skips, ``verify`` never calls an unfinished
step ok nor a deletion record unknown, ``--mark-committed`` stamps only whole steps, ``cp``
copies committed steps, ``inspect`` refuses an item being deleted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.paths import REPO

STATES = REPO / "fixtures" / "orbax012" / "states"


def _copy(tmp_path: Path, root: str) -> Path:
    out = tmp_path / root
    shutil.copytree(STATES / root, out)
    return out


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_ls_json_says_each_state_and_why(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("ls", STATES / "commit_file", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    got = {s["name"]: (s["status"], s["reason"]) for s in doc["steps"]}
    assert got["1"] == ("committed", None) and got["2"] == ("committed", None)
    assert got["3"][0] == got["4"][0] == "uncommitted"
    assert "commit_timestamp_nsecs is null" in (got["3"][1] or "")
    assert doc["latest_step"] == 2
    assert "step 3 is uncommitted: its save never finished" in r.stderr


def test_ls_shows_an_item_being_deleted_and_a_stopped_deletion(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("ls", STATES / "deletion", "--json")
    assert r.code == 0, r.stderr
    steps = {s["name"]: s for s in r.json()["steps"]}
    assert steps["2"]["items"] == ["model"] and steps["2"]["deleting"] == ["optimizer"]
    assert steps["4"]["status"] == "incomplete" and steps["4"]["items"] == []
    assert r.json()["latest_step"] == 3
    text = cli("ls", STATES / "deletion")
    assert "optimizer (deleting)" in text.stdout
    assert "item optimizer is being deleted" in text.stderr
    assert "does not exist" not in text.stderr  # no false damage for the emptied step


@pytest.mark.parametrize(
    ("root", "kept", "deleted"),
    [
        ("commit_file", ["2"], ["1"]),
        ("commit_file_late", ["2"], ["1"]),
        ("commit_file_switched", ["3"], []),
        ("deletion", ["3"], ["1", "2"]),
        ("partial", ["2"], ["1"]),
    ],
)
def test_prune_keeps_only_restorable_steps_and_says_what_it_skips(  # type: ignore[no-untyped-def]
    cli, root: str, kept: list[str], deleted: list[str]
) -> None:
    r = cli("prune", STATES / root, "--keep-last", "1", "--dry-run", "--json")
    assert r.code == 0, r.stderr
    plan = r.json()
    assert [k["name"] for k in plan["keep"]] == kept
    assert [d["name"] for d in plan["delete"]] == deleted
    untouched = {u["name"]: u["why"] for u in plan["untouched"]}
    assert untouched, "every root here has a step no reader restores"
    for why in untouched.values():
        assert "skipped" in why or "--clean-tmp" in why


def test_prune_yes_leaves_unfinished_steps_and_the_last_restorable_one(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path
) -> None:
    root = _copy(tmp_path, "commit_file")
    r = cli("prune", root, "--keep-last", "1", "--yes")
    assert r.code == 0, r.stderr
    assert sorted(p.name for p in root.iterdir()) == ["2", "3", "4"]


def test_prune_clean_tmp_removes_a_stopped_deletion(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = _copy(tmp_path, "deletion")
    r = cli("prune", root, "--keep-last", "3", "--clean-tmp", "--tmp-min-age", "0s", "--yes")
    assert r.code == 0, r.stderr
    assert sorted(p.name for p in root.iterdir()) == ["1", "2", "3"]


def test_verify_of_a_deletion_in_progress_is_clean(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", STATES / "deletion", "--deep", "--json")
    assert r.code == 0, r.stdout
    doc = r.json()
    assert doc["problems"] == []
    assert doc["checked"]["unfinished_saves"] == ["4"]
    assert "stopped deletion" in doc["checked"]["unfinished_why"]["4"]


def test_verify_never_says_ok_on_an_unfinished_step(cli) -> None:  # type: ignore[no-untyped-def]
    for step in ("commit_file/3", "commit_file/4", "commit_file_late/3", "deletion/4"):
        r = cli("verify", STATES / step, "--deep", "--json")
        assert r.code == 1, step
        codes = [p["code"] for p in r.json()["problems"]]
        assert codes[0] == "uncommitted", (step, codes)
        assert "item-missing" not in codes, step
    r = cli("verify", STATES / "commit_file", "--step", "3")
    assert r.code == 3 and "uncommitted" in r.stderr and "never finished" in r.stderr


def test_verify_of_a_partial_save_says_what_it_is(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", STATES / "partial" / "3.partial_save")
    assert r.code == 3
    assert "partial save not finalized" in r.stderr and "Traceback" not in r.stderr


def test_mark_committed_stamps_every_whole_step_of_a_switched_root(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path
) -> None:
    root = _copy(tmp_path, "commit_file_switched")
    r = cli("verify", root, "--deep", "--mark-committed", "--json")
    assert r.code == 0, r.stdout
    marked = sorted(Path(p).name for p in r.json()["marked_committed"])
    assert marked == ["1", "2"]
    assert not (root / "4" / "commit_success.txt").exists()
    states = {s["name"]: s["status"] for s in cli("ls", root, "--json").json()["steps"]}
    assert states == {
        "1": "committed",
        "2": "committed",
        "3": "committed",
        "4": "uncommitted",
    }


def test_mark_committed_refuses_a_save_that_never_finished(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = _copy(tmp_path, "commit_file")
    before = _files(root)
    for args in (["--step", "3"], []):
        target = [root, *args] if args else [root / "3"]
        r = cli("verify", *target, "--mark-committed")
        assert r.code == 3, r.stderr
        assert "never finished" in r.stderr
    assert _files(root) == before


def test_mark_committed_leaves_a_damaged_step_unstamped(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = _copy(tmp_path, "commit_file_switched")
    data = next(p for p in (root / "1").rglob("d/*") if p.is_file())
    data.write_bytes(data.read_bytes()[:-3])
    r = cli("verify", root, "--deep", "--mark-committed", "--json")
    assert r.code == 1
    assert sorted(Path(p).name for p in r.json()["marked_committed"]) == ["2"]
    assert not (root / "1" / "commit_success.txt").exists()


def test_inspect_refuses_an_item_being_deleted(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", STATES / "deletion", "--step", "2", "--item", "optimizer")
    assert r.code == 3
    assert "being deleted" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    ok = cli("inspect", STATES / "deletion", "--step", "2", "--json")
    assert ok.code == 0, ok.stderr


def test_cp_copies_committed_steps_and_says_why_it_skips_the_rest(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path
) -> None:
    r = cli("cp", STATES / "commit_file", tmp_path / "copy", "--json")
    assert r.code == 0, r.stderr
    skipped = {s["name"]: s["reason"] for s in r.json()["skipped"]}
    assert sorted(skipped) == ["3", "4"]
    assert all("never finished" in why for why in skipped.values())
    assert sorted(p.name for p in (tmp_path / "copy").iterdir() if p.is_dir()) == ["1", "2"]
    for step in ("1", "2"):
        assert (tmp_path / "copy" / step / "commit_success.txt").is_file()


def test_an_invalid_deletion_record_is_one_line_and_nothing_is_deleted(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path
) -> None:
    root = _copy(tmp_path, "deletion")
    (root / "2" / "_CHECKPOINT_DELETION").write_text('{"checkpointable_name": ""}')
    listing = cli("ls", root, "--json")
    assert listing.code == 0
    step = next(s for s in listing.json()["steps"] if s["name"] == "2")
    assert step["status"] == "uncommitted" and "names no item" in step["reason"]
    before = _files(root / "2")
    r = cli("prune", root, "--keep-last", "1", "--yes")
    assert r.code == 0
    assert _files(root / "2") == before  # skipped: never counted, never deleted
    assert "names no item" in r.stdout
    v = cli("verify", root / "2")
    assert v.code == 1 and "names no item" in v.stdout and "Traceback" not in v.stderr


def test_a_damaged_step_metadata_in_a_commit_file_root_is_no_latest_step(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path
) -> None:
    root = _copy(tmp_path, "commit_file_late")
    (root / "3" / "_CHECKPOINT_METADATA").write_text("{not json")
    r = cli("ls", root, "--json")
    assert r.code == 0
    steps = {s["name"]: s for s in r.json()["steps"]}
    assert steps["3"]["status"] == "uncommitted" and r.json()["latest_step"] == 2
    plan = cli("prune", root, "--keep-last", "1", "--dry-run", "--json").json()
    assert [k["name"] for k in plan["keep"]] == ["2"]


def test_cp_unfinished_copies_unfinished_steps_as_they_are(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for root, names in (
        ("commit_file", ["3", "4"]),
        ("partial", ["3.partial_save", "4.partial_save"]),
    ):
        out = tmp_path / root
        r = cli("cp", STATES / root, out, "--unfinished", "--json")
        assert r.code == 0, r.stderr
        for name in names:
            assert (out / name).is_dir()
            assert not (out / name / "commit_success.txt").exists()
        assert "copied as it is, without a commit marker" in r.stderr
        assert not list(out.glob("*.orbax-checkpoint-tmp*")), "tmp dirs are never copied"
        before = {
            s["name"]: s["status"] for s in cli("ls", STATES / root, "--json").json()["steps"]
        }
        after = {s["name"]: s["status"] for s in cli("ls", out, "--json").json()["steps"]}
        assert after == {n: s for n, s in before.items() if "orbax-checkpoint-tmp" not in n}
