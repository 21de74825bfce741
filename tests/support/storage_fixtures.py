"""Storage servers for the remote tests, started once per test session (per xdist worker) on
127.0.0.1.

``s3``: every test that takes it runs twice, on moto's S3 server (in this process: request
counts, fault injection, a hard stop) and on SeaweedFS (a real S3 server in its own process,
which reads some requests as production servers do and moto does not). A test that needs moto's
hooks says so with ``@pytest.mark.moto_only`` and runs on moto alone. The committed fixtures are
uploaded under ``fx/<name>`` once per server. ``moto_s3`` / ``seaweed_s3`` are the session-wide
servers themselves (for module-scoped fixtures). ``gcs``: gcp-storage-emulator. The environment
points ckpt (and TensorStore) at the server of the test: ``CKPT_S3_ENDPOINT`` + AWS keys,
``STORAGE_EMULATOR_HOST``. Each test writes under its own prefix.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import FIXTURES
from tests.support.remote_servers import (
    BUCKET,
    GcsServer,
    S3Server,
    SeaweedServer,
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
    """The running server, a client and the fixtures uploaded so far. ``kind``: "moto" or
    "seaweedfs"; only moto's ``server`` has request counts, ``before_request`` and restarts."""

    def __init__(self, server: S3Server | SeaweedServer, kind: str) -> None:
        self.server: Any = server
        self.kind = kind
        self.client: Any = server.client()
        if isinstance(server, S3Server):
            self.client.create_bucket(Bucket=BUCKET)  # SeaweedServer.start() made it
        self._uploaded: set[str] = set()

    @property
    def endpoint(self) -> str:
        return str(self.server.endpoint)

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
def moto_s3() -> Iterator[S3]:
    """moto's S3 for the whole session; the environment points at it unless a test's ``s3``
    says otherwise."""
    server = S3Server().start()
    old = _set_env(s3_environment(server.endpoint))
    try:
        yield S3(server, "moto")
    finally:
        server.before_request = None
        server.stop()
        _restore_env(old)


@pytest.fixture(scope="session")
def seaweed_s3() -> Iterator[S3]:
    server = SeaweedServer().start()
    try:
        yield S3(server, "seaweedfs")
    finally:
        server.stop()


@pytest.fixture
def s3(request: pytest.FixtureRequest, s3_kind: str, monkeypatch: pytest.MonkeyPatch) -> S3:
    """The S3 server of this test's parameter (``s3_kind``: see ``pytest_generate_tests`` in
    tests/conftest.py), with the environment pointing ckpt at it for the test."""
    server: S3 = request.getfixturevalue("moto_s3" if s3_kind == "moto" else "seaweed_s3")
    for k, v in s3_environment(server.endpoint).items():
        monkeypatch.setenv(k, v)
    return server


@pytest.fixture
def s3_prefix(s3: S3) -> Iterator[str]:
    """A fresh key prefix (no leading slash) for one test; the server is up again afterwards."""
    yield f"t/{uuid.uuid4().hex[:12]}"
    if isinstance(s3.server, S3Server):
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
