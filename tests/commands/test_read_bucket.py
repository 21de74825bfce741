"""Read commands against real Orbax checkpoints in a bucket: the same JSON as the local run.

The fixtures are uploaded as plain objects (what ``aws s3 cp --recursive`` makes of them); every
command runs once on the local directory and once on the ``s3://`` URL, and the documents must
be equal once paths are mapped (and times that only exist as file mtimes are dropped).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.support.buckets import listing_view, normalized
from tests.support.paths import FIXTURES
from tests.support.remote_servers import BUCKET, GcsServer, dead_endpoint, keys
from tests.support.storage_fixtures import S3

READ_FIXTURES = [
    "seed_mlp",
    "composite_best",
    "v1_zarr3",
    "no_ocdbt",
    "no_ocdbt_zarr3",
    "unmerged_ocdbt",
    "with_tmp",
    "sharded_4x2",
    "strings",
    "prefixed",
]


def both(cli: Any, s3: S3, name: str, *args: str) -> tuple[Any, Any]:
    local, url = str(FIXTURES / name), s3.fixture(name)
    a = cli(*args[:1], local, *args[1:], "--json")
    b = cli(*args[:1], url, *args[1:], "--json")
    assert a.code == b.code, (a.stderr, b.stderr)
    return normalized(a.json(), local, url), b.json()


@pytest.mark.parametrize("name", READ_FIXTURES)
def test_ls_inspect_verify_equal_local(cli: Any, s3: S3, name: str) -> None:
    item = ("--item", "state") if name == "composite_best" else ()
    for args in (("ls",), ("inspect", *item), ("verify", "--deep")):
        local, remote = both(cli, s3, name, *args)
        if args == ("ls",):
            local, remote = listing_view(local), listing_view(remote)
            assert any(s["status"] == "committed" for s in both(cli, s3, name, "ls")[1]["steps"])
            assert all(
                s["time_source"] == "commit_metadata"
                for s in both(cli, s3, name, "ls")[1]["steps"]
                if s["status"] == "committed"
            )
        assert normalized(remote, "", "") == local, args


def test_inspect_with_stats_and_layout_equal(cli: Any, s3: S3) -> None:
    local, remote = both(cli, s3, "sharded_4x2", "inspect", "--stats", "--layout", "params.w")
    assert normalized(remote, "", "") == local
    assert remote["layout"]["grid"] == [4, 2]


def test_diff_remote_against_local_and_between_steps(cli: Any, s3: S3) -> None:
    url = s3.fixture("seed_mlp")
    same = cli("diff", url, FIXTURES / "seed_mlp", "--json")
    assert same.code == 0 and same.json()["equal"] is True
    local = cli("diff", f"{FIXTURES / 'seed_mlp'}@300", f"{FIXTURES / 'seed_mlp'}@500", "--json")
    remote = cli("diff", f"{url}@300", f"{url}@500", "--json")
    assert remote.code == local.code == 1
    assert normalized(remote.json(), "", "") == normalized(
        local.json(), str(FIXTURES / "seed_mlp"), url
    )


@pytest.mark.moto_only
def test_ls_lists_a_root_with_few_requests(cli: Any, s3: S3, s3_prefix: str) -> None:
    """Prefix listing: a root of 12 steps costs one listing request, not one per step or file."""
    for step in range(12):
        s3.put_dir(FIXTURES / "with_tmp" / "2", f"{s3_prefix}/{step}")
    s3.server.reset_counts()
    result = cli("ls", f"s3://{BUCKET}/{s3_prefix}", "--json")
    assert result.code == 0
    assert [s["step"] for s in result.json()["steps"]] == list(range(12))
    assert s3.server.counts["LIST"] == 1, s3.server.counts


def test_copied_without_markers_is_uncommitted_and_can_be_marked(
    cli: Any, s3: S3, s3_prefix: str
) -> None:
    """Orbax #394: a local root copied to a bucket without commit_success.txt."""
    url = s3.put_dir(
        FIXTURES / "seed_mlp",
        s3_prefix,
        skip=lambda rel: rel.startswith("400/") and rel.endswith("commit_success.txt"),
    )
    ls = cli("ls", url, "--json")
    status = {s["step"]: s["status"] for s in ls.json()["steps"]}
    assert status == {300: "committed", 400: "uncommitted", 500: "committed"}
    assert f"ckpt verify {url} --step 400 --mark-committed" in ls.stderr
    assert "#394" in ls.stderr
    # Without --mark-committed the step is not a checkpoint to read.
    assert cli("inspect", url, "--step", "400").code == 3
    marked = cli("verify", url, "--step", "400", "--mark-committed", "--json")
    assert marked.code == 0, marked.stderr
    assert marked.json()["marked_committed"] == [f"{url}/400"]
    assert f"{s3_prefix}/400/commit_success.txt" in keys(s3.client, f"{s3_prefix}/400/")
    after = cli("ls", url, "--json").json()
    assert after["steps"]
    assert all(s["status"] == "committed" for s in after["steps"])


def test_mark_committed_refuses_a_damaged_step(cli: Any, s3: S3, s3_prefix: str) -> None:
    url = s3.put_dir(
        FIXTURES / "seed_mlp",
        s3_prefix,
        skip=lambda rel: (
            rel.startswith("400/")
            and (rel.endswith("commit_success.txt") or "/ocdbt.process_0/d/" in f"/{rel}")
        ),
    )
    result = cli("verify", url, "--step", "400", "--mark-committed")
    assert result.code == 1
    assert "not marked committed" in result.stderr
    assert not [
        k for k in keys(s3.client, f"{s3_prefix}/400/") if k.endswith("/400/commit_success.txt")
    ]


def test_mark_committed_of_a_root_stamps_each_clean_step(cli: Any, s3: S3, s3_prefix: str) -> None:
    """A root copied without its markers: every step that checks clean gets one; a damaged
    step is left without (and the run exits 1)."""
    url = s3.put_dir(
        FIXTURES / "seed_mlp",
        s3_prefix,
        skip=lambda rel: (
            rel.endswith("commit_success.txt")
            or (rel.startswith("300/") and "/ocdbt.process_0/d/" in f"/{rel}")
        ),
    )
    result = cli("verify", url, "--deep", "--mark-committed", "--json")
    assert result.code == 1
    assert sorted(result.json()["marked_committed"]) == [f"{url}/400", f"{url}/500"]
    status = {s["step"]: s["status"] for s in cli("ls", url, "--json").json()["steps"]}
    assert status == {300: "uncommitted", 400: "committed", 500: "committed"}
    assert cli("verify", url, "--latest", "--mark-committed").code == 2


def test_dead_endpoint_fails_with_one_line(cli: Any, s3: S3) -> None:
    with dead_endpoint() as dead:
        result = cli("--s3-endpoint", dead, "ls", f"s3://{BUCKET}/fx/seed_mlp")
    assert result.code == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"ckpt: error: cannot list s3://{BUCKET}/fx/seed_mlp/")
    assert f"connection refused at {dead}" in lines[0]


def test_missing_path_and_bad_urls(cli: Any, s3: S3) -> None:
    missing = cli("ls", f"s3://{BUCKET}/no/such/root")
    assert missing.code == 3 and "does not exist" in missing.stderr
    assert cli("ls", "s3://").code == 2
    other = cli("ls", "hdfs://x/y")
    assert other.code == 3 and "not supported" in other.stderr


@pytest.mark.parametrize("command", [["ls"], ["inspect", "--json"], ["verify", "--deep"]])
def test_remote_read_paths_do_not_import_jax_or_orbax(s3: S3, command: list[str]) -> None:
    import json
    import os
    import subprocess
    import sys

    from tests.support.startup_probe import PROBE

    args = [command[0], s3.fixture("seed_mlp"), *command[1:]]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ),
    )
    line = next(x for x in proc.stderr.splitlines() if x.startswith("HEAVY="))
    assert json.loads(line[len("HEAVY=") :]) == []
    assert proc.stdout


def _table_times(text: str) -> dict[str, str]:
    return {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\s*(\d+)(?: \*)?\s+\w+\s+(\d{4}-\d\d-\d\d \d\d:\d\d)", text, re.M)
    }


def test_commit_times_in_a_bucket_agree_between_ls_and_prune(
    cli: Any, s3: S3, s3_prefix: str
) -> None:
    url = s3.put_dir(FIXTURES / "seed_mlp", s3_prefix)
    ls = cli("ls", url, "--json")
    plan = cli("prune", url, "--keep-last", "1", "--dry-run", "--json")
    assert ls.code == 0 and plan.code == 0, ls.stderr + plan.stderr
    listed = {s["step"]: s["committed_at"] for s in ls.json()["steps"]}
    planned = {s["step"]: s["committed_at"] for s in plan.json()["keep"] + plan.json()["delete"]}
    assert listed and listed == planned
    # And as a person reads them, in both tables.
    ls_text = _table_times(cli("ls", url).stdout)
    prune_text = _table_times(cli("prune", url, "--keep-last", "1", "--dry-run").stdout)
    assert ls_text and ls_text == prune_text


def test_gs_errors_do_not_point_at_s3_options(cli: Any, gcs: GcsServer) -> None:
    r = cli("ls", "gs://no-such-bucket/run")
    assert r.code == 3, r.stderr
    assert r.stderr.startswith("ckpt: error:")
    assert "s3" not in r.stderr.lower(), r.stderr
