"""The ``world`` fixture tests provoke commands in: good and damaged roots, junk, a dead endpoint.

Everything is built fresh in ``tmp_path`` from the committed fixtures (real Orbax outputs), so a
test may damage, pin or prune what it was given.
"""

from __future__ import annotations

import json
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import FIXTURES, REPO


@dataclass(frozen=True)
class World:
    tmp: Path
    good: Path  # seed_mlp: steps 300 400 500, single item `default`
    composite: Path  # composite_best: steps 2 4, items state/extra/metrics, loss metrics
    with_tmp: Path  # committed steps 1 2 and four unfinished saves
    bad_item: Path  # seed_mlp with step 500's _METADATA cut in the middle
    bad_root: Path  # seed_mlp with a damaged metadata/_ROOT_METADATA
    junk: Path  # a directory that is no checkpoint
    missing: Path  # does not exist
    spec: Path  # a valid migrate spec for seed_mlp
    taken: Path  # a root whose step 500 already exists (writers refuse)
    dead_endpoint: str  # an S3 endpoint on 127.0.0.1 where nothing listens

    @property
    def dead_url(self) -> str:
        return "s3://ckpt-contract/run"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    def copy(name: str, as_: str) -> Path:
        dst = tmp_path / as_
        shutil.copytree(FIXTURES / name, dst, symlinks=True)
        return dst

    good = copy("seed_mlp", "good")
    bad_item = copy("seed_mlp", "bad_item")
    meta = bad_item / "500" / "default" / "_METADATA"
    meta.write_bytes(meta.read_bytes()[:60])
    bad_root = copy("seed_mlp", "bad_root")
    (bad_root / "metadata").mkdir()
    (bad_root / "metadata" / "_ROOT_METADATA").write_text('{"custom_metadata": {')
    junk = tmp_path / "junk"
    (junk / "data").mkdir(parents=True)
    (junk / "notes.txt").write_text("not a checkpoint\n")
    spec = tmp_path / "widen.yaml"
    shutil.copy(REPO / "examples" / "widen_64_to_128.yaml", spec)
    # Credentials for the dead endpoint: the failure must be the connection, not the keys.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "contract")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "contract")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    return World(
        tmp=tmp_path,
        good=good,
        composite=copy("composite_best", "composite"),
        with_tmp=copy("with_tmp", "with_tmp"),
        bad_item=bad_item,
        bad_root=bad_root,
        junk=junk,
        missing=tmp_path / "missing",
        spec=spec,
        taken=copy("seed_mlp", "taken"),
        dead_endpoint=f"http://127.0.0.1:{_closed_port()}",
    )


def one_json_document(stdout: str) -> Any:
    """The single JSON document on stdout; anything else beside it fails the test."""
    text = stdout.strip()
    assert text, "nothing on stdout"
    doc, end = json.JSONDecoder().raw_decode(text)
    assert text[end:].strip() == "", f"more than one document on stdout: {text[end:][:200]!r}"
    return doc
