"""The small things issue 12 saw on the way, each as a person or a script meets it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.interrupts import CKPT, tree_state
from tests.support.paths import FIXTURES, REPO
from tests.support.remote_servers import (
    BUCKET,
    GcsServer,
    S3Server,
    gcs_environment,
    s3_environment,
)
from tests.support.remote_servers import upload as upload_s3
from tests.support.terminal import Terminal

SEED = FIXTURES / "seed_mlp"


def ckpt(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CKPT, *[str(a) for a in args]],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.fixture
def one_step_root(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    root.mkdir()
    shutil.copytree(SEED / "500", root / "500")
    return root


def test_counts_of_one_are_singular(one_step_root: Path) -> None:
    ls = ckpt("ls", one_step_root)
    assert ls.returncode == 0 and "1 step," in ls.stdout, ls.stdout
    diff = ckpt("diff", f"{SEED}@300", f"{SEED}@500", "--filter", "^step$")
    assert diff.returncode == 1
    assert ": 1 leaf: " in diff.stdout, diff.stdout
    verify = ckpt("verify", one_step_root)
    assert verify.returncode == 0
    assert "1 step, 1 item," in verify.stdout and "(s)" not in verify.stdout, verify.stdout


def test_verify_refuses_latest_with_step() -> None:
    r = ckpt("verify", SEED, "--latest", "--step", "500")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--latest" in r.stderr and "--step" in r.stderr
    assert r.stdout == ""


def test_truncated_file_names_its_leaves_in_json() -> None:
    doc = json.loads(ckpt("verify", REPO / "fixtures/damaged/truncated-data-file", "--json").stdout)
    problems = [p for p in doc["problems"] if p["code"] == "data-file-truncated"]
    assert problems
    for p in problems:
        named = re.findall(r"(?:params|opt_state)\.[\w.]+\w", p["message"])
        assert named
        assert p["leaf"] in named
        assert sorted(p["leaves"]) == sorted(named)


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


def test_single_item_checkpoint_has_no_made_up_step() -> None:
    r = ckpt("ls", FIXTURES / "single_checkpointer")
    assert r.returncode == 0, r.stderr
    assert not re.search(r"^\s*0 \*", r.stdout, re.MULTILINE), r.stdout
    doc = json.loads(ckpt("ls", FIXTURES / "single_checkpointer", "--json").stdout)
    assert [s["step"] for s in doc["steps"]] == [None]


def test_filter_dot_star_keeps_every_leaf() -> None:
    every = json.loads(ckpt("inspect", SEED, "--json").stdout)["leaves"]
    matched = json.loads(ckpt("inspect", SEED, "--filter", ".*", "--json").stdout)["leaves"]
    assert {leaf["name"] for leaf in every} >= {"step", "rng"}
    assert [leaf["name"] for leaf in matched] == [leaf["name"] for leaf in every]


def test_deep_ok_without_digests_says_what_it_cannot_see(one_step_root: Path) -> None:
    r = ckpt("verify", one_step_root, "--deep")
    assert r.returncode == 0
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("OK")
    assert "no digests recorded: value changes are not detectable; run --record" in last, last
    ckpt("verify", one_step_root, "--record")
    recorded = ckpt("verify", one_step_root, "--deep").stdout.strip().splitlines()[-1]
    assert recorded.startswith("OK") and "no digests" not in recorded


@pytest.fixture
def s3_root() -> Iterator[tuple[S3Server, str]]:
    server = S3Server().start()
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    upload_s3(client, SEED, "seed")
    try:
        yield server, f"s3://{BUCKET}/seed"
    finally:
        server.stop()


def _table_times(text: str) -> dict[str, str]:
    return {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\s*(\d+)(?: \*)?\s+\w+\s+(\d{4}-\d\d-\d\d \d\d:\d\d)", text, re.M)
    }


def test_commit_times_in_a_bucket_agree_between_ls_and_prune(
    s3_root: tuple[S3Server, str],
) -> None:
    server, url = s3_root
    env = s3_environment(server.endpoint)
    ls: Any = json.loads(ckpt("ls", url, "--json", env=env).stdout)
    plan: Any = json.loads(
        ckpt("prune", url, "--keep-last", "1", "--dry-run", "--json", env=env).stdout
    )
    listed = {s["step"]: s["committed_at"] for s in ls["steps"]}
    planned = {s["step"]: s["committed_at"] for s in plan["keep"] + plan["delete"]}
    assert listed and listed == planned
    # And as a person reads them, in both tables.
    ls_text = _table_times(ckpt("ls", url, env=env).stdout)
    prune_text = _table_times(ckpt("prune", url, "--keep-last", "1", "--dry-run", env=env).stdout)
    assert ls_text and ls_text == prune_text


def test_gs_errors_do_not_point_at_s3_options() -> None:
    server = GcsServer().start()
    try:
        r = ckpt("ls", "gs://no-such-bucket/run", env=gcs_environment(server.endpoint))
    finally:
        server.stop()
    assert r.returncode == 3, r.stderr
    assert r.stderr.startswith("ckpt: error:")
    assert "s3" not in r.stderr.lower(), r.stderr
