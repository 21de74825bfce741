"""On S3, a SIGKILLed writer's uncommitted partial step (it carries
``.ckpt-writing`` and no ``commit_success.txt``) is removed by ``prune --clean-tmp`` with the
same age rule as local tmp directories (``--tmp-min-age``). A step without markers that ckpt
did not write (a copy made without them, Orbax #394) is never deleted that way.

The writer is SIGKILLed while the test server holds its ``_METADATA`` PUT: its arrays are in the
bucket, its metadata and marker never will be.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.support.ckpt_process import ckpt, finish, kill, start
from tests.support.paths import FIXTURES
from tests.support.remote_servers import BUCKET, keys


def _killed_partial_step(s3: Any, prefix: str) -> str:
    dst = f"s3://{BUCKET}/{prefix}/dst"
    gate = threading.Event()
    reached = threading.Event()

    def hold(method: str, path: str) -> None:
        if method == "PUT" and path.endswith("/default/_METADATA"):
            reached.set()
            gate.wait(60)

    s3.server.before_request = hold
    try:
        w = start("reshard", FIXTURES / "seed_mlp", dst, "--mesh", "data=8", mem_limit=None)
        deadline = time.monotonic() + 120
        while not reached.is_set() and w.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert reached.is_set(), finish(w).stderr
        kill(w)
    finally:
        s3.server.before_request = None
        gate.set()
    left = keys(s3.client, f"{prefix}/dst/500/")
    assert any(k.endswith("/.ckpt-writing") for k in left), left
    assert not any(k.endswith("/500/commit_success.txt") for k in left), left
    return dst


@pytest.mark.moto_only  # moto's before_request holds the writer's _METADATA PUT
def test_clean_tmp_removes_a_killed_writers_partial_step(s3: Any, s3_prefix: str) -> None:
    dst = _killed_partial_step(s3, s3_prefix)
    # A committed step next to it, so the root is a root either way.
    ok = ckpt(
        "reshard", FIXTURES / "seed_mlp", dst, "--mesh", "data=8", "--step", "400", mem_limit=None
    )
    assert ok.code == 0, ok.stderr
    time.sleep(2.1)
    run = ckpt(
        "prune", dst, "--clean-tmp", "--tmp-min-age", "2s", "--yes", "--json", mem_limit=None
    )
    assert run.code == 0, run.stderr
    assert keys(s3.client, f"{s3_prefix}/dst/500/") == []
    assert [c["name"] for c in run.json()["clean"]] == ["500"]
    assert keys(s3.client, f"{s3_prefix}/dst/400/")


@pytest.mark.moto_only  # moto's before_request holds the writer's _METADATA PUT
def test_a_young_partial_step_is_left_alone(s3: Any, s3_prefix: str) -> None:
    dst = _killed_partial_step(s3, s3_prefix)
    ok = ckpt(
        "reshard", FIXTURES / "seed_mlp", dst, "--mesh", "data=8", "--step", "400", mem_limit=None
    )
    assert ok.code == 0, ok.stderr
    run = ckpt("prune", dst, "--clean-tmp", "--yes", mem_limit=None)  # default age: 1h
    assert run.code == 0, run.stderr
    assert any(k.endswith("/.ckpt-writing") for k in keys(s3.client, f"{s3_prefix}/dst/500/"))


def test_a_copy_without_markers_is_never_cleaned(s3: Any, s3_prefix: str) -> None:
    """Orbax #394: a root copied into the bucket without commit_success.txt is uncommitted, not a
    dead writer's partial step: --clean-tmp keeps it however old it is."""
    src = FIXTURES / "seed_mlp"
    url = s3.put_dir(src, f"{s3_prefix}/copy", skip=lambda rel: rel.endswith("commit_success.txt"))
    time.sleep(2.1)
    run = ckpt("prune", url, "--clean-tmp", "--tmp-min-age", "2s", "--yes", mem_limit=None)
    assert run.code == 0, run.stderr
    assert len(keys(s3.client, f"{s3_prefix}/copy/")) == sum(
        1 for p in src.rglob("*") if p.is_file() and p.name != "commit_success.txt"
    )
