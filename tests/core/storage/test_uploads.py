"""Multipart uploads a killed ``cp`` leaves open in a bucket, on moto and on SeaweedFS.

A file over two parts (``PART_BYTES``) of a fresh Orbax checkpoint is copied into a bucket
through the latency proxy, whose ``before_forward`` hook acts on the upload's second part: it
SIGKILLs the ``cp`` process there (the upload stays open: created, a part stored, never
completed nor aborted), or holds every request of that ``cp`` (a live writer, its upload open).
Then: ``ls -v`` shows the open upload; a rerun of ``cp`` and ``prune --clean-tmp`` abort what
the killed writer left and the copy completes; neither touches a live writer's upload.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.core.storage.objstore import PART_BYTES
from tests.support.buckets import bucket_tree, tree
from tests.support.ckpt_process import save_orbax
from tests.support.latency_proxy import LatencyProxy, Request
from tests.support.paths import FIXTURES, REPO
from tests.support.remote_servers import BUCKET, GcsServer
from tests.support.storage_fixtures import S3


@pytest.fixture(scope="module")
def big_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real Orbax root (one step) holding a file of more than two upload parts."""
    root = save_orbax(tmp_path_factory.mktemp("big") / "run", step=5, mib=40)
    sizes = [p.stat().st_size for p in root.rglob("*") if p.is_file()]
    assert sizes and max(sizes) > 2 * PART_BYTES, max(sizes)
    return root


def open_uploads(s3: S3, prefix: str) -> list[dict[str, Any]]:
    """The open multipart uploads under ``prefix/``, asked of the server directly."""
    page = s3.client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix + "/")
    return list(page.get("Uploads", []))


def is_second_part(req: Request) -> bool:
    return req.method == "PUT" and "uploadId=" in req.query and "partNumber=2" in req.query


class CpThroughProxy:
    """``ckpt cp SRC DST`` in a subprocess talking to the bucket through a proxy (the global
    ``--s3-endpoint`` flag), which stops it at the first second part of a multipart upload:
    ``mode`` "kill" (SIGKILL, then refuse what it still sends) or "hold" (until ``release``)."""

    def __init__(self, s3: S3, mode: str) -> None:
        self.mode = mode
        self.proxy = LatencyProxy(s3.endpoint).start()
        self.stopped = threading.Event()
        self.go_on = threading.Event()
        self.proc: subprocess.Popen[str] | None = None
        self.proxy.before_forward = self._at

    def _at(self, req: Request) -> None:
        if self.stopped.is_set() and self.mode == "kill":
            raise ConnectionError("the writer was killed")
        if self.stopped.is_set() or not is_second_part(req) or self.proc is None:
            return
        self.stopped.set()
        if self.mode == "kill":
            self.proc.send_signal(signal.SIGKILL)
            raise ConnectionError("killed by the test")
        # Hold the proxy's loop: every request of this cp waits (the test's own requests go
        # to the server directly). Bounded, so a failed test cannot hang the session.
        self.go_on.wait(timeout=120)

    def start(self, src: Path, dst: str) -> CpThroughProxy:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ckpt_cli", "--s3-endpoint", self.proxy.endpoint, "cp",
             str(src), dst, "--concurrency", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
            cwd=REPO,
        )  # fmt: skip
        return self

    def wait_stopped(self) -> None:
        assert self.proc is not None
        for _ in range(600):
            if self.stopped.wait(0.2) or self.proc.poll() is not None:
                break
        assert self.stopped.is_set(), self.proc.communicate(timeout=30)

    def finish(self) -> tuple[int, str]:
        assert self.proc is not None
        self.go_on.set()
        _, err = self.proc.communicate(timeout=300)
        self.proxy.wait_idle()
        return self.proc.returncode, err

    def close(self) -> None:
        self.go_on.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proxy.stop()


@pytest.fixture
def cp_through_proxy(s3: S3) -> Iterator[Any]:
    made: list[CpThroughProxy] = []

    def make(mode: str) -> CpThroughProxy:
        made.append(CpThroughProxy(s3, mode))
        return made[-1]

    yield make
    for c in made:
        c.close()


def killed_copy(cp_through_proxy: Any, s3: S3, src: Path, prefix: str) -> str:
    dst = f"s3://{BUCKET}/{prefix}"
    run = cp_through_proxy("kill").start(src, dst)
    run.wait_stopped()
    code, err = run.finish()
    assert code == -signal.SIGKILL, err
    assert open_uploads(s3, prefix), "the killed cp left no open upload"
    return dst


@pytest.mark.slow  # a fresh Orbax checkpoint of 40 MiB
def test_a_rerun_of_cp_aborts_what_the_killed_cp_left(
    cli: Any, s3: S3, s3_prefix: str, big_root: Path, cp_through_proxy: Any, tmp_path: Path
) -> None:
    dst = killed_copy(cp_through_proxy, s3, big_root, s3_prefix)
    left = open_uploads(s3, s3_prefix)

    shown = cli("ls", dst, "-v")
    assert shown.code == 0, shown.stderr
    line = next((x for x in shown.stdout.splitlines() if x.startswith("open uploads:")), "")
    assert line.startswith(f"open uploads: {len(left)} ("), shown.stdout
    assert "MiB" in line and "oldest" in line, line

    again = cli("cp", big_root, dst)
    assert again.code == 0, again.stderr
    assert f"aborted {len(left)} open upload" in again.stderr, again.stderr
    assert open_uploads(s3, s3_prefix) == []
    assert bucket_tree(s3, s3_prefix, tmp_path) == tree(big_root)
    assert cli("ls", dst, "-v").stdout.splitlines()[-1] == "open uploads: none"


@pytest.mark.slow  # a fresh Orbax checkpoint of 40 MiB
def test_prune_clean_tmp_aborts_what_the_killed_cp_left(
    cli: Any, s3: S3, s3_prefix: str, big_root: Path, cp_through_proxy: Any, tmp_path: Path
) -> None:
    dst = killed_copy(cp_through_proxy, s3, big_root, s3_prefix)
    left = open_uploads(s3, s3_prefix)

    young = cli("prune", dst, "--clean-tmp", "--tmp-min-age", "7d", "--dry-run")
    assert young.code == 0, young.stderr
    if s3.kind == "seaweedfs":  # moto dates every upload 2010-11-10: always old enough
        assert "open upload" not in young.stderr, young.stderr
    dry = cli("prune", dst, "--clean-tmp", "--tmp-min-age", "0s", "--dry-run")
    assert dry.code == 0, dry.stderr
    assert f"would abort {len(left)} open upload" in dry.stderr, dry.stderr
    assert len(open_uploads(s3, s3_prefix)) == len(left)

    pruned = cli("prune", dst, "--clean-tmp", "--tmp-min-age", "0s", "--yes")
    assert pruned.code == 0, pruned.stderr
    assert f"aborted {len(left)} open upload" in pruned.stderr, pruned.stderr
    assert open_uploads(s3, s3_prefix) == []

    again = cli("cp", big_root, dst)
    assert again.code == 0, again.stderr
    assert "aborted" not in again.stderr
    assert bucket_tree(s3, s3_prefix, tmp_path) == tree(big_root)


@pytest.mark.slow  # a fresh Orbax checkpoint of 40 MiB
def test_a_live_writers_upload_is_never_aborted(
    cli: Any, s3: S3, s3_prefix: str, big_root: Path, cp_through_proxy: Any, tmp_path: Path
) -> None:
    dst = f"s3://{BUCKET}/{s3_prefix}"
    live = cp_through_proxy("hold").start(big_root, dst)
    live.wait_stopped()
    held = open_uploads(s3, s3_prefix)
    assert held, "the held cp has no open upload"

    # The default --tmp-min-age spares the live step; the uploads are spared by the lock
    # before any age is looked at (moto dates them 2010).
    pruned = cli("prune", dst, "--clean-tmp", "--yes")
    assert pruned.code == 0, pruned.stderr
    assert f"left {len(held)} open upload" in pruned.stderr, pruned.stderr
    assert "a writer that may still run holds the root (cp pid" in pruned.stderr, pruned.stderr
    second = cli("cp", big_root, dst)
    assert second.code == 3 and "another ckpt writer" in second.stderr, second.stderr
    assert [u["UploadId"] for u in open_uploads(s3, s3_prefix)] == [u["UploadId"] for u in held]

    code, err = live.finish()
    assert code == 0, err
    assert open_uploads(s3, s3_prefix) == []
    assert bucket_tree(s3, s3_prefix, tmp_path) == tree(big_root)


def test_gcs_lists_no_open_upload(cli: Any, gcs: GcsServer, tmp_path: Path) -> None:
    """GCS resumable uploads cannot be listed and expire by themselves: none to show."""
    url = f"gs://{BUCKET}/uploads-{uuid.uuid4().hex[:8]}/run"
    assert cli("cp", FIXTURES / "seed_mlp", url).code == 0
    shown = cli("ls", url, "-v")
    assert shown.code == 0, shown.stderr
    assert shown.stdout.splitlines()[-1] == "open uploads: none"
    pruned = cli("prune", url, "--clean-tmp", "--tmp-min-age", "0s", "--yes")
    assert pruned.code == 0 and "open upload" not in pruned.stderr, pruned.stderr


def test_open_uploads_are_listed_page_after_page(
    s3: S3, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of two on SeaweedFS, which pages by upload id alone (no NextKeyMarker; a
    KeyMarker would end its listing); moto ignores MaxUploads and answers in one page. Uploads
    beside the prefix are neither listed nor aborted."""
    from ckpt_cli.core.storage import open_location
    from ckpt_cli.core.storage.s3 import S3Store
    from ckpt_cli.core.storage.uploads import abort_uploads
    from ckpt_cli.core.storage.uploads import open_uploads as listed

    made = set()
    for key in ("a/x", "a/x", "b/y", "c/z", "d/w"):
        made.add(s3.client.create_multipart_upload(Bucket=BUCKET, Key=f"{s3_prefix}/{key}")["UploadId"])  # fmt: skip
    s3.client.create_multipart_upload(Bucket=BUCKET, Key=f"{s3_prefix}-beside/a")
    monkeypatch.setattr(S3Store, "uploads_page", 2)
    root = open_location(f"s3://{BUCKET}/{s3_prefix}")
    found = listed(root)
    assert len(found) == 5 and {u.upload_id for u in found} == made
    assert abort_uploads(root, found) == []
    assert listed(root) == () and open_uploads(s3, s3_prefix) == []
    assert len(open_uploads(s3, s3_prefix + "-beside")) == 1
