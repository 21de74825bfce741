"""Fixtures and hooks every test directory shares: the ``cli`` runner through ``main()``, fresh
fixture copies, the ``s3`` parametrization, and the fixture plugins of tests/support/.

``XLA_FLAGS`` forces 8 CPU devices before anything imports jax, so sharded saves work in-process.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# pytest-xdist's workers (`make test` runs -n 2) start with COLUMNS=80 and LINES=24 set; a pipe
# honours COLUMNS (``text_width``), so ckpt in a test would wrap where a script's pipe does not.
# The tests that want a width set it themselves (tests/support/terminal.py).
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

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
    "tests.support.trend_runs",  # trend_runs, wide_run: runs saved at every step (ckpt trend)
]


#: The S3 servers a test that takes the ``s3`` fixture runs on (tests/support/storage_fixtures.py).
S3_SERVERS = ("moto", "seaweedfs")

#: Session fixtures each xdist worker would build for itself (a training run saved, a Keras
#: process, the wheel and its venvs behind a lock the other worker waits on): the tests that
#: take one run on one worker (``xdist_groups``), so it is built once per run.
ONE_WORKER = (
    "tutorial_run",
    "trend_runs",
    "wide_run",
    "keras_loader",
    "dists",
    "wheel_venv",
    "extras_venv",
)


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


def xdist_groups(items: list[pytest.Item]) -> dict[str, list[pytest.Item]]:
    """The tests that share a costly fixture, by group: those of one module with a module-scoped
    fixture, and those taking a fixture of ``ONE_WORKER`` (joined where a test has both)."""
    parent: dict[str, str] = {}

    def find(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    keys: list[tuple[pytest.Item, list[str]]] = []
    for item in items:
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        mine = [f"fixture:{name}" for name in ONE_WORKER if name in defs]
        if any(d.scope == "module" for ds in defs.values() for d in ds):
            mine.append(f"module:{item.nodeid.split('::', 1)[0]}")
        keys.append((item, mine))
        for other in mine[1:]:
            parent[find(other)] = find(mine[0])
    groups: dict[str, list[pytest.Item]] = {}
    for item, mine in keys:
        if mine:
            groups.setdefault(find(mine[0]), []).append(item)
    return groups


@pytest.hookimpl(tryfirst=True)  # the groups in place before any other plugin reads node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` (``make pytest``) each group of ``xdist_groups`` runs on one
    worker, and the groups are scheduled first, largest first: a module fixture (Orbax saves,
    models trained) is built once, not once per worker, and what is left at the end of a run is
    single tests, so neither worker waits long on the other."""
    if not config.getoption("loadgroup", default=False):  # set on the workers of loadgroup
        return
    for name, members in xdist_groups(items).items():
        label = name.split(":", 1)[1].replace("/", ".").replace("@", "_")
        for item in members:
            _suffix_nodeid(item, f"@{label}")


def _suffix_nodeid(item: pytest.Item, suffix: str) -> None:
    """What xdist does for an ``xdist_group`` mark (the group is the nodeid after its last
    ``@``), on the node id of pytest >= 9.1 (``_id``) as on the older one (``_nodeid``), which
    xdist 3.8 alone writes, so that its own marks group nothing under pytest 9."""
    new = item.nodeid + suffix
    if hasattr(item, "_id"):
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(new)
    else:
        item._nodeid = new
    assert item.nodeid == new, (item.nodeid, new)


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
