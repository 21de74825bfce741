"""Fixtures and hooks every test directory shares: the ``cli`` runner through ``main()``, fresh
fixture copies, the ``s3`` parametrization, and the fixture plugins of tests/support/.

``XLA_FLAGS`` forces 8 CPU devices before anything imports jax, so sharded saves work in-process.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest

# The helpers in tests/support/ assert too: their failures show values as a test's do. Before
# anything imports them.
pytest.register_assert_rewrite("tests.support")

from tests.support.cli import CliResult, run_cli  # noqa: E402
from tests.support.paths import FIXTURES  # noqa: E402

#: Fixtures every directory uses, defined beside the servers and harnesses they start.
pytest_plugins = [
    "tests.support.storage_fixtures",  # s3 (moto and SeaweedFS), moto_s3, seaweed_s3, gcs
    "tests.support.big_checkpoint",  # big_root, big_copy: the checkpoint the signal tests stop
    "tests.support.world",  # world: good and damaged roots to provoke commands in
    "tests.support.orbax_restorer",  # orbax: one Orbax 0.12.8 restore process per worker
    "tests.support.tutorial_run",  # tutorial_run: the tutorial's run, saved once per worker
    "tests.support.wheel",  # dists, wheel_venv, extras_venv: the built sdist and wheel, venvs of the wheel
    "tests.support.keras_loader",  # keras_loader: one Keras 3 loader process per worker
    "tests.support.trend_runs",  # trend_runs: training runs saved at every step (ckpt trend)
]


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
