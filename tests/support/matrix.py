"""The fixture matrix as test data: every ``fixtures/matrix/<release>/<case>/`` with its truth.

``truth.json`` is what the release that wrote a fixture restored from it (see
``fixtures/matrix/README.md``); the helpers here turn it into what a test compares with ckpt's
answers: the committed steps, the items of each step, and per item the array leaves by keypath.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.paths import REPO

MATRIX = REPO / "fixtures" / "matrix"
#: What Orbax restores as a value of its own (the others are empty nodes and strings).
ARRAY_KINDS = frozenset(
    {"jax.Array", "ndarray", "typed_key", "python_int", "python_float", "python_bool"}
)
#: jax's names of the key dtypes: key<fry> is what a threefry2x32 key restores as.
KEY_DTYPES = {"threefry2x32": "key<fry>", "rbg": "key<rbg>", "unsafe_rbg": "key<urbg>"}

Keypath = tuple[str, ...]


@dataclass(frozen=True)
class Fixture:
    release: str
    case: str
    dir: Path

    @property
    def id(self) -> str:
        return f"{self.release}/{self.case}"

    @functools.cached_property
    def truth(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.dir / "truth.json").read_text())
        return doc

    @property
    def path(self) -> Path:
        return self.dir / self.truth["path"]

    @property
    def kind(self) -> str:
        kind: str = self.truth["kind"]
        return kind

    def steps(self) -> dict[int, dict[str, Any]]:
        """Committed step -> {"dir", "items"} (roots); ``{None: ...}`` for a step or item."""
        if self.kind == "root":
            return {int(s): v for s, v in self.truth["steps"].items()}
        return {-1: {"dir": None, "items": self.truth["items"]}}

    def latest(self) -> tuple[int | None, dict[str, Any]]:
        steps = self.steps()
        n = max(steps)
        return (None if n == -1 else n), steps[n]


def fixture(release: str, case: str) -> Fixture:
    """The fixture ``case`` the ``release`` wrote (``fixtures/matrix/<release>/<case>/``)."""
    f = Fixture(release, case, MATRIX / release / case)
    assert (f.dir / "truth.json").is_file(), f.id
    return f


def all_fixtures() -> list[Fixture]:
    out = []
    for rdir in sorted(MATRIX.iterdir()):
        if not rdir.is_dir():
            continue
        for fdir in sorted(rdir.iterdir()):
            if (fdir / "truth.json").is_file():
                out.append(Fixture(rdir.name, fdir.name, fdir))
    return out


def array_leaves(item: dict[str, Any]) -> dict[Keypath, dict[str, Any]]:
    """The leaves of a restored item that hold values (arrays, scalars, keys), by keypath."""
    return {
        tuple(k for k, _ in leaf["keypath"]): leaf
        for leaf in item.get("leaves", [])
        if leaf["kind"] in ARRAY_KINDS
    }


def restored_dtype_shape(leaf: dict[str, Any]) -> tuple[str, list[int]]:
    """The dtype and shape Orbax restores: ``key<fry>`` of the key shape for typed keys."""
    if leaf["kind"] == "typed_key":
        return KEY_DTYPES.get(leaf.get("key_impl") or "", "key"), leaf["key_shape"]
    return leaf["dtype"], leaf["shape"]


def sha256(array: Any) -> str:
    import numpy as np

    a = np.array(np.asarray(array), order="C", copy=True)
    return hashlib.sha256(a.tobytes()).hexdigest()


def value_sha256s(item: Any) -> dict[str, str | None]:
    """SHA-256 of every array value of an opened item (``ckpt_cli.open(...).item()``), read by
    ckpt through TensorStore in one batch of scans, by leaf name."""
    from ckpt_cli.core.format.arrays import ItemStore
    from ckpt_cli.core.format.scan import scan_leaves
    from ckpt_cli.core.format.scan_acc import ScanTask

    store = ItemStore(item.ref.location, item.report.zarr_format == 3)
    tasks = [
        ScanTask(leaf.name, leaf.array, leaf.database, digest=True)
        for leaf in item.leaves
        if leaf.array is not None
    ]
    out = {}
    for scan in scan_leaves(store, tasks):
        assert scan.error is None, (scan.name, scan.error)
        out[scan.name] = scan.digest
    return out


def elements(leaf: dict[str, Any]) -> int:
    return math.prod(leaf["shape"])


def item_kind(item: dict[str, Any]) -> str:
    kind: str = item["kind"]
    return kind
