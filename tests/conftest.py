"""Shared test helpers: the committed fixtures, a CLI runner through ``main()``, fresh copies.

``XLA_FLAGS`` forces 8 CPU devices before anything imports jax, so sharded saves work in-process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest

# The helpers in tests/support/ assert too: their failures show values as a test's do.
pytest.register_assert_rewrite("tests.support")

#: Fixtures every directory uses, defined beside the servers and harnesses they start.
pytest_plugins = [
    "tests.support.storage_fixtures",  # s3 (moto and SeaweedFS), moto_s3, seaweed_s3, gcs
    "tests.support.big_checkpoint",  # big_root, big_copy: the checkpoint the signal tests stop
    "tests.support.world",  # world: good and damaged roots to provoke commands in
    "tests.support.orbax_restorer",  # orbax: one Orbax 0.12.8 restore process per worker
]

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures" / "ckpts"


#: The S3 servers a test that takes the ``s3`` fixture runs on (tests/support/storage_fixtures.py).
S3_SERVERS = ("moto", "seaweedfs")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "moto_only: a bucket test that needs moto's hooks (request counts, fault injection, "
        "restarts) and so runs on moto alone, not on SeaweedFS too",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that takes ``s3`` runs once per S3 server, unless marked ``moto_only``."""
    if "s3_kind" in metafunc.fixturenames:
        only = metafunc.definition.get_closest_marker("moto_only") is not None
        metafunc.parametrize("s3_kind", ["moto"] if only else list(S3_SERVERS))


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> CliResult:
    """Run ``ckpt ARGS`` through the real entry point (the one error boundary) in-process."""
    from ckpt_cli.app import main

    capsys.readouterr()
    old = sys.argv
    sys.argv = ["ckpt", *args]
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old
    out = capsys.readouterr()
    return CliResult(code, out.out, out.err)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    def _run(*args: str) -> CliResult:
        return run_cli([str(a) for a in args], capsys)

    return _run


@pytest.fixture
def fixture_copy(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A writable copy of a committed fixture (tests that damage or change files use this)."""

    def _copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(FIXTURES / name, dst, symlinks=True)
        return dst

    return _copy


@contextlib.contextmanager
def local_cluster() -> Iterator[Any]:
    """A 2-worker Dask cluster on 127.0.0.1 (processes, one thread each, HTTP on a free port, never
    the default 8787 another test's cluster may hold under `-n 2`). Start it
    after the environment the workers need is set: they inherit it."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",  # the scheduler serves HTTP anyway: on a free port
        worker_dashboard_address=None,
    ) as cluster:
        yield cluster
