"""Commands that change a bucket: prune, reshard (to, from and between buckets), verify --record;
and what a server that dies in the middle leaves behind.

Orbax 0.12.8 cannot reach a bucket behind a custom S3 endpoint (its TensorStore specs carry no
endpoint, and ``etils.epath`` needs s3fs): outputs are proven by ckpt's own reads (``diff`` and
``verify --deep`` against the bucket) and by downloading the objects and restoring them with
real Orbax. Writers are listed in ``WRITERS``: a migrate case is one more entry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.buckets import WRITERS, committed_steps, make_root, normalized, step_dirs
from tests.support.paths import FIXTURES
from tests.support.remote_servers import BUCKET, download, keys
from tests.support.storage_fixtures import S3


def test_prune_leaves_exactly_the_kept_steps(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path
) -> None:
    root = make_root(tmp_path, range(1, 9))
    url = s3.put_dir(root, s3_prefix)
    rules = ("--keep-last", "2", "--keep-every", "3")
    local = cli("prune", root, *rules, "--yes", "--json")
    remote = cli("prune", url, *rules, "--yes", "--json")
    assert local.code == remote.code == 0, remote.stderr
    assert normalized(remote.json(), "", "") == normalized(local.json(), str(root), url)
    assert committed_steps(s3, s3_prefix) == {3, 6, 7, 8}
    assert set(step_dirs(s3, s3_prefix)) == {"3", "6", "7", "8"}  # no trash, no lock object
    listed = cli("ls", url, "--json").json()
    assert [s["step"] for s in listed["steps"]] == [3, 6, 7, 8]


def test_pruned_bucket_restores_with_orbax(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path
) -> None:
    import orbax.checkpoint as ocp

    url = s3.put_dir(FIXTURES / "seed_mlp", s3_prefix)
    assert cli("prune", url, "--keep-last", "1", "--yes").code == 0
    local = download(s3.client, s3_prefix, tmp_path / "copy")
    with ocp.CheckpointManager(local) as mgr:
        assert list(mgr.all_steps()) == [500]
        restored = mgr.restore(500)
    assert int(restored["step"]) == 500


def test_lock_object_refuses_a_second_prune(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path
) -> None:
    url = s3.put_dir(make_root(tmp_path, range(1, 4)), s3_prefix)
    lock = f"{s3_prefix}/.ckpt-prune.lock"
    s3.client.put_object(
        Bucket=BUCKET, Key=lock, Body=b'{"pid": 1, "host": "elsewhere", "since": "2026-01-01"}'
    )
    refused = cli("prune", url, "--keep-last", "1", "--yes")
    assert refused.code == 3
    assert "another prune" in refused.stderr and "pid 1 on elsewhere" in refused.stderr
    assert f"delete s3://{BUCKET}/{lock}" in refused.stderr
    assert committed_steps(s3, s3_prefix) == {1, 2, 3}
    s3.client.delete_object(Bucket=BUCKET, Key=lock)
    assert cli("prune", url, "--keep-last", "1", "--yes").code == 0
    assert committed_steps(s3, s3_prefix) == {3}


@pytest.mark.moto_only
def test_server_dies_mid_prune(cli: Any, s3: S3, s3_prefix: str, tmp_path: Path) -> None:
    """Markers go first: after the crash no step without all its objects looks committed; the
    next prune (once the stale lock is removed, as the message says) finishes the job."""
    root = make_root(tmp_path, range(1, 6))
    url = s3.put_dir(root, s3_prefix)
    complete = {d: files for d, files in step_dirs(s3, s3_prefix).items()}

    posts = []

    def die_on_data_delete(method: str, path: str) -> None:
        # Deletes are DeleteObjects batches (POST ?delete): the commit markers of every step
        # to delete, then their other objects (the data files among them), then tombstones.
        if method == "POST":
            posts.append(path)
            if len(posts) == 2:
                s3.server.stop()
                raise ConnectionError("server stopped by the test")

    s3.server.before_request = die_on_data_delete
    result = cli("prune", url, "--keep-last", "2", "--yes")
    s3.server.before_request = None
    assert result.code == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckpt: error: cannot delete s3://"), lines
    assert f"connection refused at {s3.server.endpoint}" in lines[0]

    s3.server.start()
    after = step_dirs(s3, s3_prefix)
    for d, files in after.items():
        if "commit_success.txt" in files:  # whatever still looks valid is whole
            assert files == complete[d], d
    assert committed_steps(s3, s3_prefix) >= {4, 5}
    assert [s["step"] for s in cli("ls", url, "--json").json()["steps"]] == [4, 5]
    again = cli("prune", url, "--keep-last", "2", "--yes")
    assert again.code == 3 and ".ckpt-prune.lock" in again.stderr
    s3.client.delete_object(Bucket=BUCKET, Key=f"{s3_prefix}/.ckpt-prune.lock")
    assert cli("prune", url, "--keep-last", "2", "--yes").code == 0
    assert set(step_dirs(s3, s3_prefix)) == {"4", "5"}
    assert step_dirs(s3, s3_prefix) == {d: complete[d] for d in ("4", "5")}


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.moto_only
def test_server_dies_mid_write(cli: Any, s3: S3, s3_prefix: str, writer: str) -> None:
    """No valid-looking partial step; the rerun replaces ckpt's own leftover and commits."""
    dst = f"s3://{BUCKET}/{s3_prefix}"
    src = FIXTURES / "seed_mlp"

    def die_on_data_put(method: str, path: str) -> None:
        if method == "PUT" and "/d/" in path:
            s3.server.stop()
            raise ConnectionError("server stopped by the test")

    s3.server.before_request = die_on_data_put
    result = cli(writer, src, dst, *WRITERS[writer])
    s3.server.before_request = None
    assert result.code == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"connection refused at {s3.server.endpoint}" in lines[0] and dst in lines[0]

    s3.server.start()
    assert committed_steps(s3, s3_prefix) == set()
    listed = cli("ls", dst, "--json")
    assert [s["status"] for s in listed.json()["steps"]] == ["uncommitted"]
    assert "--mark-committed" in listed.stderr
    assert cli("inspect", dst).code == 3  # nothing committed to read
    rerun = cli(writer, src, dst, *WRITERS[writer])
    assert rerun.code == 0, rerun.stderr
    assert committed_steps(s3, s3_prefix) == {500}
    assert ".ckpt-writing" not in step_dirs(s3, s3_prefix)["500"]
    assert cli("diff", src, dst).code == 0


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_write_local_to_bucket_and_back_restores_with_orbax(
    cli: Any, s3: S3, s3_prefix: str, writer: str, tmp_path: Path
) -> None:
    import orbax.checkpoint as ocp

    from tests.support.sharded import assert_same_values, read_values

    src = FIXTURES / "seed_mlp"
    up = f"s3://{BUCKET}/{s3_prefix}/up"
    assert cli(writer, src, up, *WRITERS[writer]).code == 0
    marker = step_dirs(s3, f"{s3_prefix}/up")["500"]
    assert "commit_success.txt" in marker and ".ckpt-writing" not in marker
    verified = cli("verify", up, "--deep", "--json")
    assert verified.code == 0 and verified.json()["summary"] == {"errors": 0, "warnings": 0}
    assert cli("diff", src, up).code == 0
    # Bucket -> bucket, then bucket -> local.
    across = f"s3://{BUCKET}/{s3_prefix}/across"
    assert cli(writer, up, across, *WRITERS[writer]).code == 0
    back = tmp_path / "back"
    assert cli(writer, across, back, *WRITERS[writer]).code == 0
    expected = read_values(src)
    for restored_from in (download(s3.client, f"{s3_prefix}/up", tmp_path / "dl"), back):
        with ocp.CheckpointManager(restored_from) as mgr:
            restored = mgr.restore(500)
        flat = {
            ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): np.asarray(v)
            for path, v in __import__("jax").tree_util.tree_flatten_with_path(restored)[0]
        }
        assert_same_values({k: v for k, v in expected.items() if k in flat}, flat)
        assert len(flat) == sum(isinstance(v, np.ndarray) for v in expected.values())


def test_record_then_deep_verify_in_the_bucket(cli: Any, s3: S3, s3_prefix: str) -> None:
    url = s3.put_dir(FIXTURES / "seed_mlp", s3_prefix)
    recorded = cli("verify", url, "--step", "500", "--record", "--json")
    assert recorded.code == 0 and recorded.json()["recorded"] == ["500/default"]
    checked = cli("verify", url, "--step", "500", "--deep", "--json")
    assert checked.json()["checked"]["digests"] == {"500/default": "checked"}
    # A changed data object is caught by the recorded checksums.
    data = sorted(k for k in keys(s3.client, f"{s3_prefix}/500/default/ocdbt.process_0/d/"))
    body = bytearray(s3.client.get_object(Bucket=BUCKET, Key=data[0])["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.client.put_object(Bucket=BUCKET, Key=data[0], Body=bytes(body))
    damaged = cli("verify", url, "--step", "500", "--deep", "--json")
    assert damaged.code == 1
    assert {p["code"] for p in damaged.json()["problems"]} & {
        "datafile-checksum-mismatch",
        "digest-mismatch",
        "decode-error",
    }


def test_reshard_refuses_to_overwrite_a_bucket_step(cli: Any, s3: S3, s3_prefix: str) -> None:
    url = s3.put_dir(FIXTURES / "seed_mlp", s3_prefix)
    result = cli("reshard", FIXTURES / "seed_mlp", url, *WRITERS["reshard"])
    assert result.code == 3 and "already exists" in result.stderr


def test_reshard_of_a_flax_step_to_a_bucket_keeps_its_name_and_restores(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path
) -> None:
    from flax.training import checkpoints

    src = tmp_path / "src"
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    checkpoints.save_checkpoint(str(src), {"w": w}, step=6)
    assert cli("verify", src, "--record").code == 0
    url = f"s3://{BUCKET}/{s3_prefix}/out"
    r = cli("reshard", src, url, "--mesh", "data=1")
    assert r.code == 0, r.stderr
    step = step_dirs(s3, f"{s3_prefix}/out")
    assert list(step) == ["checkpoint_6"]
    # The step is its own item, its digest record written before the marker, no writer object.
    assert "commit_success.txt" in step["checkpoint_6"]
    assert ".ckpt-writing" not in step["checkpoint_6"]
    assert "_CKPT_DIGESTS.json" in step["checkpoint_6"]
    verified = cli("verify", url, "--deep", "--json")
    assert verified.code == 0 and verified.json()["summary"] == {"errors": 0, "warnings": 0}
    local = download(s3.client, f"{s3_prefix}/out", tmp_path / "dl")
    restored = checkpoints.restore_checkpoint(str(local), target=None)
    assert restored is not None
    np.testing.assert_array_equal(restored["w"], w)
