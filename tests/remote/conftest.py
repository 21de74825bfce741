"""Storage servers for the remote tests, started once per test session on 127.0.0.1.

``s3``: moto's S3 server with the committed fixtures uploaded under ``fx/<name>`` (once);
``gcs``: gcp-storage-emulator. The environment points ckpt (and TensorStore) at them:
``CKPT_S3_ENDPOINT`` + AWS keys, ``STORAGE_EMULATOR_HOST``. Each test writes under its own prefix.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES
from tests.remote_servers import (
    BUCKET,
    GcsServer,
    S3Server,
    gcs_environment,
    local_files,
    s3_environment,
)


def _set_env(values: dict[str, str]) -> dict[str, str | None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    return old


def _restore_env(old: dict[str, str | None]) -> None:
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


class S3:
    """The running server, a client and the fixtures uploaded so far."""

    def __init__(self, server: S3Server) -> None:
        self.server = server
        self.client: Any = server.client()
        self.client.create_bucket(Bucket=BUCKET)
        self._uploaded: set[str] = set()

    def fixture(self, name: str) -> str:
        """``s3://`` URL of a committed fixture, uploaded on first use (never modified)."""
        if name not in self._uploaded:
            self.put_dir(FIXTURES / name, f"fx/{name}")
            self._uploaded.add(name)
        return f"s3://{BUCKET}/fx/{name}"

    def put_dir(self, src: Path, prefix: str, skip: Callable[[str], bool] | None = None) -> str:
        """A local directory as plain objects under ``prefix`` (stored without HTTP)."""
        self.server.put_objects(
            (f"{prefix.rstrip('/')}/{rel}", p.read_bytes())
            for rel, p in local_files(src)
            if skip is None or not skip(rel)
        )
        return f"s3://{BUCKET}/{prefix}"


@pytest.fixture(scope="session")
def s3() -> Iterator[S3]:
    server = S3Server().start()
    old = _set_env(s3_environment(server.endpoint))
    try:
        yield S3(server)
    finally:
        server.before_request = None
        server.stop()
        _restore_env(old)


@pytest.fixture
def s3_prefix(s3: S3) -> Iterator[str]:
    """A fresh key prefix (no leading slash) for one test; the server is up again afterwards."""
    yield f"t/{uuid.uuid4().hex[:12]}"
    s3.server.before_request = None
    if s3.server._server is None:
        s3.server.start()


@pytest.fixture(scope="session")
def gcs() -> Iterator[GcsServer]:
    server = GcsServer().start()
    old = _set_env(gcs_environment(server.endpoint))
    try:
        yield server
    finally:
        server.stop()
        _restore_env(old)
