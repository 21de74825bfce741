"""Helpers for the prune tests: roots of real Orbax steps, grown by copying a real step dir."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path

from tests.support.paths import FIXTURES, REPO

# A real step written by Orbax 0.12.8 (29 KB): the unit for roots of many steps.
SMALL_STEP = FIXTURES / "with_tmp" / "2"


def copy_steps(
    root: Path,
    steps: Iterable[int],
    *,
    src: Path = SMALL_STEP,
    committed_at: Callable[[int], datetime] | None = None,
) -> Path:
    """Copy a real step dir under ``root`` as each of ``steps``; optionally set commit times."""
    root.mkdir(parents=True, exist_ok=True)
    for step in steps:
        dst = root / str(step)
        shutil.copytree(src, dst)
        if committed_at is not None:
            meta_file = dst / "_CHECKPOINT_METADATA"
            meta = json.loads(meta_file.read_text())
            meta["commit_timestamp_nsecs"] = int(committed_at(step).timestamp() * 1e9)
            meta_file.write_text(json.dumps(meta))
    return root


def tree_digest(path: Path) -> dict[str, str]:
    """Every file below ``path`` (not following symlinks) -> sha256 of its bytes."""
    out = {}
    for dirpath, _, files in os.walk(path):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(path))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def age_tree(path: Path, seconds: float) -> None:
    """Set the mtime of ``path`` and everything below it to ``seconds`` ago."""
    then = time.time() - seconds
    for dirpath, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.utime(Path(dirpath) / name, (then, then), follow_symlinks=False)
    os.utime(path, (then, then), follow_symlinks=False)


def entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def step_dirs(root: Path) -> set[int]:
    return {int(p.name) for p in root.iterdir() if p.name.isdigit()}


def run_script(script: str, *args: str, **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env=env,
        text=True,
        **kw,  # type: ignore[call-overload]
    )


KILLER = """
import os, signal, sys
from ckpt_cli.core import storage
point, root, victim = sys.argv[1:4]
def die():
    os.kill(os.getpid(), signal.SIGKILL)
if point == "rename":
    original = storage.LocalLocation.rename
    def rename(self, new_name):
        moved = original(self, new_name)
        if new_name.startswith(f".ckpt-trash-{victim}-"):
            die()
        return moved
    storage.LocalLocation.rename = rename
else:
    original_unlink, count = os.unlink, [0]
    def unlink(*args, **kwargs):
        count[0] += 1
        if count[0] == 4:
            die()
        return original_unlink(*args, **kwargs)
    os.unlink = unlink
sys.argv = ["ckpt", "prune", root, "--keep-last", "2", "--clean-tmp", "--yes"]
from ckpt_cli.app import main
main()
"""
