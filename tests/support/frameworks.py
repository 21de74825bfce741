"""Checkpoints written by frameworks themselves (``fixtures/frameworks/<name>/``) as test data.

Their ``truth.json`` has the matrix truth's shape (``fixtures/frameworks/README.md``), so a
fixture is a :class:`tests.support.matrix.Fixture`; the helpers here compare what ckpt reads and
what Orbax restores from an output with what the framework's own loader returned.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.matrix import Fixture, Keypath, array_leaves, restored_dtype_shape, sha256
from tests.support.paths import REPO

FRAMEWORKS = REPO / "fixtures" / "frameworks"


def framework(name: str) -> Fixture:
    return Fixture("frameworks", name, FRAMEWORKS / name)


def writable(f: Fixture, tmp_path: Path) -> Path:
    """A copy of the fixture's checkpoint that a test may record digests in or damage."""
    return shutil.copytree(f.path, tmp_path / f.path.name)


def assert_verify_clean_then_a_flip_caught(
    cli: Callable[..., Any], path: Path, copy: Path, data: Path
) -> None:
    """``verify`` (plain and ``--deep``) finds nothing but notes on ``path``; on its writable
    ``copy``, ``verify --record`` then one byte flipped in the largest data file under ``data``
    (inside ``copy``): ``verify --deep`` exits 1 with an error."""
    for flags in ([], ["--deep"]):
        r = cli("verify", path, *flags, "--json")
        assert r.code == 0, r.stdout
        assert [p for p in r.json()["problems"] if p["severity"] != "note"] == []
    assert cli("verify", copy, "--record").code == 0
    assert cli("verify", copy, "--deep").code == 0
    flip_a_byte_of_the_largest_data_file(data)
    bad = cli("verify", copy, "--deep", "--json")
    assert bad.code == 1
    assert any(p["severity"] == "error" for p in bad.json()["problems"])


def doctor_like_a_reshard(cli: Callable[..., Any], path: Path, out: Path) -> dict[str, Any]:
    """``doctor PATH --like`` its own reshard to two devices: it restores (exit 0); the JSON."""
    assert cli("reshard", path, out, "--mesh", "data=2").code == 0
    r = cli("doctor", path, "--like", out, "--json")
    assert r.code == 0, r.stdout
    doc: dict[str, Any] = r.json()
    assert (doc["verdict"], doc["differences"]) == ("restores", [])
    return doc


def flip_a_byte_of_the_largest_data_file(path: Path) -> Path:
    """One byte flipped in the middle of the largest OCDBT data file under ``path``."""
    data = [p for p in path.rglob("*") if p.is_file() and p.parent.name == "d"]
    assert data, f"no data file under {path}"
    target = max(data, key=lambda p: p.stat().st_size)
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    target.write_bytes(bytes(raw))
    return target


def read_digests(item: Any) -> dict[Keypath, tuple[str, list[int], str]]:
    """(dtype, shape, SHA-256) of every array leaf of a ckpt item, read by ckpt (key data for
    typed keys, as the truth records them)."""
    import numpy as np

    out = {}
    for leaf in item.leaves:
        if leaf.is_array:
            value = np.asarray(item.read(leaf.name))
            out[leaf.keypath] = (str(value.dtype), list(value.shape), sha256(value))
    return out


def truth_digests(item: dict[str, Any]) -> dict[Keypath, tuple[str, list[int], str]]:
    return {kp: (lf["dtype"], lf["shape"], lf["sha256"]) for kp, lf in array_leaves(item).items()}


def assert_restored_as_truth(
    restored: dict[str, Any],
    truth: dict[str, Any],
    source: Any = None,
    cast: tuple[str, str] | None = None,
) -> None:
    """Orbax's restore of an output (``leaves`` as ``walk`` describes them) holds the truth's
    leaves, kinds, dtypes, shapes and values; with ``cast`` (a keypath regex over the
    ``.``-joined names and a dtype) those leaves hold ``source``'s values cast by numpy."""
    import numpy as np

    want = array_leaves(truth)
    got = array_leaves(restored)
    assert sorted(got) == sorted(want)
    for kp, leaf in want.items():
        g = got[kp]
        assert g["kind"] == leaf["kind"], kp
        if cast is not None and re.fullmatch(cast[0], ".".join(kp)):
            expected = np.asarray(source.read(".".join(kp))).astype(_np_dtype(cast[1]))
            assert (g["dtype"], g["shape"]) == (cast[1], list(expected.shape)), kp
            assert g["sha256"] == sha256(expected), kp
            continue
        assert restored_dtype_shape(g) == restored_dtype_shape(leaf), kp
        assert g["sha256"] == leaf["sha256"], kp


def _np_dtype(name: str) -> Any:
    import ml_dtypes
    import numpy as np

    return getattr(ml_dtypes, name, None) or np.dtype(name)
