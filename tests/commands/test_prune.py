"""``ckpt prune`` through the real entry point: plan, refusal, deletion, crashes, concurrency."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ckpt_cli.commands import command as find_command
from ckpt_cli.core.prune.execute import prune_lock
from ckpt_cli.core.prune.plan import LOCK_NAME, SYMLINK_KEPT, TRASH_PREFIX
from ckpt_cli.core.storage import LocalLocation
from ckpt_cli.errors import StorageError
from tests.support.interrupts import tree_state
from tests.support.paths import FIXTURES, REPO
from tests.support.prune_roots import (
    KILLER,
    SMALL_STEP,
    age_tree,
    copy_steps,
    entries,
    run_script,
    step_dirs,
    tree_digest,
)
from tests.support.startup_probe import PROBE
from tests.support.terminal import Terminal
from tests.support.world import World, one_json_document

TMP_SRC = FIXTURES / "with_tmp" / "3.orbax-checkpoint-tmp"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Steps 100..500, each a copy of a real Orbax step."""
    return copy_steps(tmp_path / "run", range(100, 600, 100))


def test_dry_run_changes_nothing(cli, root: Path) -> None:  # type: ignore[no-untyped-def]
    shutil.copytree(TMP_SRC, root / "600.orbax-checkpoint-tmp")
    age_tree(root / "600.orbax-checkpoint-tmp", 7200)
    before = tree_digest(root), entries(root)
    r = cli("prune", root, "--keep-last", "2", "--clean-tmp", "--dry-run")
    assert r.code == 0, r.stderr
    assert (tree_digest(root), entries(root)) == before
    assert "(dry run)" in r.stdout and "would free" in r.stdout
    assert "dry run: nothing was changed" in r.stderr


def test_json_plan_shape(cli, root: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli(
        "prune", root, "--keep-last", "2", "--keep-step", "100", "--keep-step", "12345",
        "--dry-run", "--json",
    )  # fmt: skip
    assert r.code == 0, r.stderr
    assert "--keep-step 12345: no committed step 12345" in r.stderr
    doc = r.json()
    assert doc["schema_version"] == 2 and doc["dry_run"] is True and doc["outcome"] is None
    assert [(k["step"], k["reasons"]) for k in doc["keep"]] == [
        (100, ["step 100"]),
        (400, ["last 2"]),
        (500, ["latest", "last 2"]),
    ]
    assert [d["step"] for d in doc["delete"]] == [200, 300]
    for d in doc["delete"]:
        assert d["path"] == str(root / str(d["step"]))
        assert d["size_bytes"] == sum(
            p.stat().st_size for p in Path(d["path"]).rglob("*") if p.is_file()
        )
    assert doc["freed_bytes"] == sum(d["size_bytes"] for d in doc["delete"]) > 0
    assert doc["policy"]["keep_steps"] == [100, 12345]


def test_refuses_without_terminal_and_without_yes(cli, root: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("prune", root, "--keep-last", "1")
    assert r.code == 3
    assert "refusing to delete without confirmation" in r.stderr and "--yes" in r.stderr
    assert "delete" in r.stdout and "frees" in r.stdout  # the plan was printed
    assert step_dirs(root) == {100, 200, 300, 400, 500}
    assert not (root / LOCK_NAME).exists()


def test_json_refusal_prints_the_plan(cli, root: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("prune", root, "--keep-last", "1", "--json")
    assert r.code == 3 and "--json never asks" in r.stderr and "--yes" in r.stderr
    doc = r.json()
    assert doc["outcome"] is None and len(doc["delete"]) == 4
    assert step_dirs(root) == {100, 200, 300, 400, 500}


def test_yes_deletes(cli, root: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("prune", root, "--keep-last", "2", "--yes")
    assert r.code == 0, r.stderr
    assert "deleted 3 steps" in r.stdout
    assert entries(root) == ["400", "500"]  # no trash, no lock file left


def test_yes_json_reports_the_outcome(cli, root: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("prune", root, "--keep-every", "200", "--yes", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["dry_run"] is False
    assert doc["outcome"]["deleted"] == ["100", "300"]
    assert doc["outcome"]["freed_bytes"] == doc["freed_bytes"]
    assert doc["outcome"]["failed"] == [] and doc["outcome"]["skipped"] == []
    assert step_dirs(root) == {200, 400, 500}


@pytest.mark.parametrize(
    ("answer", "code", "left"),
    [
        ("y\n", 0, {400, 500}),
        # A declined (or unanswered) question is not an error: nothing deleted, exit 0.
        ("n\n", 0, {100, 200, 300, 400, 500}),
        ("", 0, {100, 200, 300, 400, 500}),
    ],
)
def test_asks_on_a_terminal(
    cli, root: Path, monkeypatch: pytest.MonkeyPatch, answer: str, code: int, left: set[int]
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("ckpt_cli.commands.prune._interactive", lambda: True)
    monkeypatch.setattr(sys, "stdin", io.StringIO(answer))
    r = cli("prune", root, "--keep-last", "2")
    assert r.code == code
    assert "Delete 3 steps?" in r.stderr
    if left == {100, 200, 300, 400, 500}:
        assert "nothing deleted" in r.stdout and "error" not in r.stderr
    assert step_dirs(root) == left


def test_nothing_to_delete(cli, root: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("prune", root, "--keep-last", "10")
    assert r.code == 0 and "nothing to delete" in r.stdout
    assert step_dirs(root) == {100, 200, 300, 400, 500}


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        ([], "no retention rule given"),
        (["--keep-within", "7"], "--keep-within: cannot read '7' as a duration"),
        (
            ["--keep-last", "1", "--clean-tmp", "--tmp-min-age", "soon"],
            "--tmp-min-age: cannot read",
        ),
        (["--keep-best", "2"], "--keep-best needs the metric"),
        (["--keep-last", "1", "--metric", "loss"], "--metric only applies to --keep-best"),
        (["--keep-last", "0"], "--keep-last"),
        (["--keep-best", "1", "--metric", "loss", "--mode", "median"], "--mode"),
    ],
)
def test_usage_errors_exit_2(cli, root: Path, args: list[str], phrase: str) -> None:  # type: ignore[no-untyped-def]
    r = cli("prune", root, *args, "--yes")
    assert r.code == 2, r.stderr
    assert phrase in r.stderr
    assert step_dirs(root) == {100, 200, 300, 400, 500}


def test_not_a_root(cli, root: Path) -> None:  # type: ignore[no-untyped-def]
    before = tree_digest(root / "500"), os.stat(root / "500").st_mtime_ns
    r = cli("prune", root / "500", "--keep-last", "1", "--yes")
    assert r.code == 3 and "not a root of steps" in r.stderr
    # Not even a lock file was created (and removed) in the step.
    assert (tree_digest(root / "500"), os.stat(root / "500").st_mtime_ns) == before
    r = cli("prune", root / "missing", "--keep-last", "1", "--yes")
    assert r.code == 3 and "does not exist" in r.stderr
    assert step_dirs(root) == {100, 200, 300, 400, 500}


def test_symlinked_step_pointing_outside_survives(cli, root: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    outside = copy_steps(tmp_path / "other_disk", [50]) / "50"
    (root / "50").symlink_to(outside, target_is_directory=True)
    (root / f"{TRASH_PREFIX}60-deadbeef").symlink_to(outside, target_is_directory=True)
    digest = tree_digest(outside)
    r = cli("prune", root, "--keep-last", "1", "--yes", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert {k["step"]: k["reasons"] for k in doc["keep"]} == {
        50: [SYMLINK_KEPT],
        500: ["latest", "last 1"],
    }
    assert f"{TRASH_PREFIX}60-deadbeef" in {u["name"] for u in doc["untouched"]}
    assert "step 50 is a symlink" in r.stderr
    assert (root / "50").is_symlink() and tree_digest(outside) == digest
    assert entries(root) == [f"{TRASH_PREFIX}60-deadbeef", "50", "500"]


def test_tmp_dirs_young_and_old(cli, root: Path) -> None:  # type: ignore[no-untyped-def]
    for name, age in (
        ("600.orbax-checkpoint-tmp", 3 * 3600),
        ("700.orbax-checkpoint-tmp-0", 20 * 60),
    ):
        shutil.copytree(TMP_SRC, root / name)
        age_tree(root / name, age)
    r = cli("prune", root, "--keep-last", "5", "--yes")
    assert r.code == 0 and "nothing to delete" in r.stdout  # without --clean-tmp: untouched
    assert "--clean-tmp removes it" in r.stdout
    r = cli("prune", root, "--keep-last", "5", "--clean-tmp", "--yes")
    assert r.code == 0, r.stderr
    assert "deleted 0 steps and 1 tmp/trash directory" in r.stdout
    assert "younger than --tmp-min-age 1h" in r.stdout
    assert "700.orbax-checkpoint-tmp-0" in entries(root)
    assert "600.orbax-checkpoint-tmp" not in entries(root)
    r = cli("prune", root, "--keep-last", "5", "--clean-tmp", "--tmp-min-age", "10m", "--yes")
    assert r.code == 0 and entries(root) == ["100", "200", "300", "400", "500"]


def test_never_deletes_metadata_unknown_dirs_or_files(cli, fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("composite_best")
    (root / "junk").mkdir()
    (root / "notes.txt").write_text("mine")
    (root / "7").mkdir()  # a step-like name that holds no step
    r = cli("prune", root, "--keep-last", "1", "--clean-tmp", "--tmp-min-age", "0s", "--yes")
    assert r.code == 0, r.stderr
    assert entries(root) == ["4", "7", "junk", "metadata", "notes.txt"]
    assert (root / "notes.txt").read_text() == "mine"


def test_failed_deletion_exits_3_and_the_next_prune_finishes(
    cli, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    original = LocalLocation.delete_tree

    def flaky(self: LocalLocation) -> None:
        if "-100-" in self.name:
            raise StorageError(f"cannot delete {self.path}: Input/output error")
        original(self)

    monkeypatch.setattr(LocalLocation, "delete_tree", flaky)
    r = cli("prune", root, "--keep-last", "2", "--yes")
    assert r.code == 3
    assert "1 deletions failed; every kept step is intact" in r.stderr
    assert "Input/output error" in r.stderr
    trash = [n for n in entries(root) if n.startswith(TRASH_PREFIX)]
    assert len(trash) == 1 and step_dirs(root) == {400, 500}
    monkeypatch.setattr(LocalLocation, "delete_tree", original)
    r = cli("prune", root, "--keep-last", "2", "--yes", "--json")
    assert r.code == 0 and r.json()["outcome"]["deleted"] == trash
    assert entries(root) == ["400", "500"]


@pytest.mark.parametrize("point", ["rename", "unlink"])
def test_killed_mid_prune_then_a_second_prune_completes(cli, root: Path, point: str) -> None:  # type: ignore[no-untyped-def]
    shutil.copytree(TMP_SRC, root / "600.orbax-checkpoint-tmp")
    age_tree(root / "600.orbax-checkpoint-tmp", 7200)
    kept = {n: tree_digest(root / n) for n in ("400", "500")}
    originals = {n: tree_digest(root / n) for n in ("100", "200", "300")}
    proc = run_script(
        KILLER, point, str(root), "200", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -9, err

    trash = [n for n in entries(root) if n.startswith(TRASH_PREFIX)]
    # The hidden tmp dir lost Orbax's marker: Orbax must not take trash for its own tmp dir.
    assert any(n.startswith(f"{TRASH_PREFIX}600.tmp-") for n in trash), trash
    assert not any(".orbax-checkpoint-tmp" in n for n in trash)
    assert {n: tree_digest(root / n) for n in kept} == kept
    # Each doomed step is either untouched or hidden in trash; `ckpt ls` never shows trash.
    for name, digest in originals.items():
        assert ((root / name).is_dir() and tree_digest(root / name) == digest) or not (
            root / name
        ).exists()
    listed = cli("ls", root, "--json")
    assert listed.code == 0
    assert {s["name"] for s in listed.json()["steps"]} <= {
        "100",
        "200",
        "300",
        "400",
        "500",
        "600.orbax-checkpoint-tmp",
    }

    r = cli("prune", root, "--keep-last", "2", "--clean-tmp", "--yes", "--json")
    assert r.code == 0, r.stderr
    assert set(trash) <= set(r.json()["outcome"]["deleted"])
    # The killed prune held the write claim (it was removing an unfinished save): its lock
    # file stays, unlocked (the OS dropped the flock), as a killed writer's does.
    assert [n for n in entries(root) if n != ".ckpt-write.lock"] == ["400", "500"]
    assert {n: tree_digest(root / n) for n in kept} == kept


PAUSER = """
import sys
from ckpt_cli.core import storage
original = storage.LocalLocation.rename
def rename(self, new_name):
    moved = original(self, new_name)
    print("PAUSED", flush=True)
    sys.stdin.readline()
    return moved
storage.LocalLocation.rename = rename
sys.argv = ["ckpt", "prune", sys.argv[1], "--keep-last", "2", "--yes", "--json"]
from ckpt_cli.app import main
main()
"""


def test_concurrent_prune_refuses(cli, root: Path) -> None:  # type: ignore[no-untyped-def]
    first = run_script(
        PAUSER, str(root), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert first.stdout is not None and first.stdin is not None
        assert first.stdout.readline().strip() == "PAUSED"
        second = cli("prune", root, "--keep-last", "2", "--yes")
        assert second.code == 3
        assert "another prune of" in second.stderr and f"pid {first.pid} on" in second.stderr
        out, err = first.communicate("\n" * 10, timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err
    assert json.loads(out[out.index("{") :])["outcome"]["deleted"] == ["100", "200", "300"]
    assert entries(root) == ["400", "500"]
    # The lock went with the first prune: a third one runs.
    assert cli("prune", root, "--keep-last", "1", "--yes").code == 0


def test_lock_held_in_process_refuses(cli, root: Path) -> None:  # type: ignore[no-untyped-def]
    with prune_lock(LocalLocation(str(root))):
        r = cli("prune", root, "--keep-last", "1", "--yes")
        dry = cli("prune", root, "--keep-last", "1", "--dry-run")
    assert r.code == 3 and "another prune of" in r.stderr and "wait for it to finish" in r.stderr
    assert dry.code == 0  # a dry run changes nothing and needs no lock
    assert step_dirs(root) == {100, 200, 300, 400, 500}


@pytest.mark.parametrize("extra", [["--dry-run"], ["--yes", "--json"]])
def test_prune_does_not_import_jax_or_orbax(root: Path, extra: list[str]) -> None:
    args = ["prune", str(root), "--keep-last", "1", *extra]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    line = next(x for x in proc.stderr.splitlines() if x.startswith("HEAVY="))
    assert json.loads(line[len("HEAVY=") :]) == []
    assert proc.stdout


def test_many_steps_from_copies(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = copy_steps(tmp_path / "big", range(10, 2010, 10), src=SMALL_STEP)
    r = cli("prune", root, "--keep-last", "3", "--keep-every", "500", "--yes", "--json")
    assert r.code == 0, r.stderr
    assert step_dirs(root) == {500, 1000, 1500, 1980, 1990, 2000}
    assert len(r.json()["outcome"]["deleted"]) == 194


@pytest.mark.parametrize("example", find_command("prune").examples)
def test_help_examples_run(cli, tmp_path: Path, monkeypatch, example: str) -> None:  # type: ignore[no-untyped-def]
    """Each example of `ckpt prune --help` runs as written on a root with a loss per step."""
    shutil.copytree(FIXTURES / "composite_best", tmp_path / "runs" / "exp7")
    monkeypatch.chdir(tmp_path)
    r = cli("prune", *shlex.split(example))
    assert r.code == 0, r.stderr


def test_no_rule_hint_for_keep_best_runs(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The refusal without a rule hints a --keep-best form that runs once its words are filled."""
    root = shutil.copytree(FIXTURES / "composite_best", tmp_path / "run")
    r = cli("prune", root, "--yes")
    assert r.code == 2 and "no retention rule given" in r.stderr
    found = re.search(r"--keep-best [^,;]*?(?= \.\.\.|;|,|\))", r.stderr)
    assert found, r.stderr
    words = {"N": "1", "NAME": "loss", "min|max": "min"}
    args = [words.get(word, word) for word in found.group(0).split()]
    again = cli("prune", root, *args, "--dry-run")
    assert again.code == 0, (args, again.stderr)


def test_keep_best_without_metric_hints_mode_and_where_metrics_are_read(cli, root: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("prune", root, "--keep-best", "2", "--yes")
    assert r.code == 2
    for phrase in ("--metric NAME --mode min|max", "metrics/metrics", "_CHECKPOINT_METADATA"):
        assert phrase in r.stderr, r.stderr


def test_metric_help_says_what_a_metric_is() -> None:
    from typer.main import get_command

    from ckpt_cli.app import app

    prune = get_command(app).commands["prune"]  # type: ignore[attr-defined]
    (metric,) = [p for p in prune.params if p.name == "metric"]
    for phrase in (
        "key of each step's metrics",
        "metrics/metrics",
        "_CHECKPOINT_METADATA",
        "--mode",
    ):
        assert phrase in (metric.help or ""), metric.help


def test_keep_best_requires_mode(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("prune", world.composite, "--keep-best", "1", "--metric", "loss", "--dry-run")
    assert r.code == 2
    assert "--mode" in r.stderr and "max" in r.stderr and "min" in r.stderr


def test_prune_plan_shows_the_metric_values(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    args = ["prune", world.composite, "--keep-best", "1", "--metric", "loss", "--mode", "min"]
    doc = one_json_document(cli(*args, "--dry-run", "--json").stdout)
    ranked = {e["step"]: e["metric"] for e in [*doc["keep"], *doc["delete"]]}
    assert ranked[4] == {"name": "loss", "value": 0.2, "value_nonfinite": None, "rank": 1}
    assert ranked[2] == {"name": "loss", "value": 0.3, "value_nonfinite": None, "rank": 2}
    text = cli(*args, "--dry-run")
    assert text.code == 0
    rows = {line.split()[0]: line for line in text.stdout.splitlines() if line.strip()}
    assert "0.3" in rows["2"] and "0.2" in rows["4"]


def test_declined_prune_deletes_nothing_and_is_not_an_error(
    fixture_copy: Callable[[str], Path],
) -> None:
    root = fixture_copy("seed_mlp")
    before = tree_state(root)
    term = Terminal(["prune", root, "--keep-last", "1"], 80)
    term.expect("Delete 2 steps")
    term.type("n\r")
    screen = term.finish()
    assert screen.code == 0, screen.text
    assert "nothing deleted" in screen.text
    assert "error" not in screen.text
    assert tree_state(root) == before


def test_confirmed_prune_deletes(fixture_copy: Callable[[str], Path]) -> None:
    """The other answer, so the test above cannot pass by deleting nothing whatever is typed."""
    root = fixture_copy("seed_mlp")
    term = Terminal(["prune", root, "--keep-last", "1"], 80)
    term.expect("Delete 2 steps")
    term.type("y\r")
    screen = term.finish()
    assert screen.code == 0, screen.text
    assert sorted(p.name for p in root.iterdir() if p.name.isdigit()) == ["500"]
