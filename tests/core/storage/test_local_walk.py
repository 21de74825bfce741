"""``LocalLocation.walk``: every file below a directory with its size, symlinks reported as
themselves and never followed, directories (told by the listing's own type) descended."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckpt_cli.core.storage import open_location
from ckpt_cli.errors import NotFoundError


def _reference(root: Path) -> dict[str, tuple[int, bool]]:
    """What a walk should give, from ``os.walk`` (symlinks not followed) and ``lstat``."""
    out = {}
    for top, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, root)
            out[rel] = (os.lstat(path).st_size, os.path.islink(path))
    return out


def test_walk_lists_files_and_symlinks_with_their_sizes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "1" / "default" / "d").mkdir(parents=True)
    (root / "empty" / "deeper").mkdir(parents=True)
    (root / "1" / "_CHECKPOINT_METADATA").write_text("{}")
    (root / "1" / "default" / "manifest.ocdbt").write_bytes(b"m" * 100)
    (root / "1" / "default" / "d" / "abc").write_bytes(b"x" * 4096)
    (root / "top.txt").write_bytes(b"")
    (root / "to_dir").symlink_to(root / "1")  # reported, not followed
    (root / "to_file").symlink_to(root / "top.txt")
    (root / "dangling").symlink_to(root / "nowhere")

    got = {rel: (e.size, e.is_symlink) for rel, e in open_location(str(root)).walk()}
    want = _reference(root)
    assert want and got == want
    assert got["1/default/d/abc"] == (4096, False)
    assert {rel for rel in got if rel.startswith("to_dir/")} == set()  # never followed
    assert {"to_dir", "to_file", "dangling"} <= set(got)
    assert not any(rel.startswith("empty") for rel in got)  # directories are not files


def test_walk_of_a_removed_directory_says_it_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="does not exist"):
        list(open_location(str(tmp_path / "gone")).walk())
