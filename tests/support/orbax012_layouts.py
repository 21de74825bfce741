"""The Orbax 0.12.x save layouts (``fixtures/orbax012/layouts/``, written by
``fixtures/orbax012/make_layouts.py`` with orbax-checkpoint 0.12.8) and their truth: what Orbax
restored, every file with its size, the per-process databases, and the data files no version of
any database references (by TensorStore's ``ocdbt.dump``; the ``garbage_*`` roots' derived
ones among them)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.support.paths import REPO

LAYOUTS = REPO / "fixtures" / "orbax012" / "layouts"
TRUTH: dict[str, Any] = json.loads((LAYOUTS / "truth.json").read_text())
#: Every root, by name.
NAMES = sorted(TRUTH["layouts"])
STEP = TRUTH["step"]
#: Roots with data files no version references (derived garbage, Orbax's own leftover).
WITH_GARBAGE = sorted(n for n in NAMES if TRUTH["layouts"][n]["unreferenced"])
#: Roots of a real save, nothing derived.
CLEAN = sorted(n for n in NAMES if not TRUTH["layouts"][n]["derived"])


def truth(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = TRUTH["layouts"][name]
    return doc


def item_dir(name: str) -> str:
    """The root-relative directory of the root's one item (``1/default``, ``1/state``)."""
    (item,) = {f.rsplit("/", 1)[0] for f in truth(name)["files"] if f.endswith("/_METADATA")}
    return item


def item_files(name: str) -> dict[str, int]:
    """Every file of the root's item, item-relative, with its size."""
    prefix = item_dir(name) + "/"
    return {f[len(prefix) :]: s for f, s in truth(name)["files"].items() if f.startswith(prefix)}


def unreferenced(name: str) -> list[str]:
    """The data files no version of any database of the item references, item-relative."""
    prefix = item_dir(name) + "/"
    return sorted(f[len(prefix) :] for f in truth(name)["unreferenced"])


def copy_layout(name: str, dst: Path) -> Path:
    """A writable copy of a layout's root."""
    return shutil.copytree(LAYOUTS / name, dst / name)
