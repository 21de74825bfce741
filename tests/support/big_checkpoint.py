"""The large checkpoint of the signal tests, built once and shared read-only.

``big_root``: a CheckpointManager root saved by the installed Orbax (``make_big.py``: steps 1
and 2, a ``CKPT_TEST_BIG_MIB`` MiB leaf, 256 by default), large enough that verify, diff,
stats, reshard and migrate take seconds on this machine. It is built once into a cache directory
(``$CKPT_TEST_CACHE``, else the system temp dir) keyed by the builder script, the Orbax version
and the size, under a file lock (pytest-xdist workers share it), and checked against the
manifest written at build time at each session start, so a run that changed it is caught and
the cache rebuilt. Tests that write into a checkpoint take ``big_copy`` (hard links: free, and
ckpt replaces files by rename, never in place; the manifest check proves it).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.support.interrupts import tree_state

BUILDER = Path(__file__).with_name("make_big.py")


def _cache_dir() -> Path:
    base = os.environ.get("CKPT_TEST_CACHE") or os.path.join(
        tempfile.gettempdir(), f"ckpt-tests-{os.getuid()}"
    )
    return Path(base)


def _build(target: Path, mib: int) -> None:
    work = target.with_name(target.name + ".building")
    shutil.rmtree(work, ignore_errors=True)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # one device: the big leaf is one chunk, as a 1-device job saves
    subprocess.run(
        [sys.executable, str(BUILDER), str(work / "root"), str(mib)],
        check=True,
        env=env,
        capture_output=True,
    )
    (work / "manifest.json").write_text(json.dumps(tree_state(work / "root")))
    work.rename(target)


@pytest.fixture(scope="session")
def big_root() -> Path:
    mib = int(os.environ.get("CKPT_TEST_BIG_MIB", "256"))
    key = hashlib.sha256(
        BUILDER.read_bytes() + version("orbax-checkpoint").encode() + str(mib).encode()
    ).hexdigest()[:12]
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"big-{mib}mib-{key}"
    with (cache / f"big-{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            manifest = json.loads((target / "manifest.json").read_text())
            if tree_state(target / "root") != manifest:
                shutil.rmtree(target)
        if not target.exists():
            _build(target, mib)
    return target / "root"


@pytest.fixture
def big_copy(big_root: Path, tmp_path: Path) -> Callable[[], Path]:
    """A writable copy of the big root, hard-linked (ckpt writes by rename, never in place)."""

    def _copy() -> Path:
        dst = tmp_path / "big"
        shutil.copytree(big_root, dst, copy_function=os.link)
        return dst

    return _copy
