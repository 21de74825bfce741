"""Every read command on every fixture of the matrix, against what its own Orbax release restored.

One test per fixture and command: ``ls`` (committed steps = ``all_steps()``, unfinished saves
listed as such, OCDBT told from disk), ``inspect`` (every item of every committed step: the
restored keypaths, dtypes and shapes, and every value read equal to the restore, byte for
byte), ``verify --deep`` (not one problem: these are clean saves), ``diff`` (a step with itself
is equal; the first and the last step differ exactly where the restored values do), and a CLI
smoke per fixture through ``main()`` (exit codes, JSON, nothing on stderr).
The library is called in-process; the CLI test covers the layer above it.
"""

from __future__ import annotations

import functools
import gc
import json
from collections.abc import Iterator
from typing import Any

import pytest

import ckpt_cli
from ckpt_cli.core.diff.items import diff_paths
from tests.support.cli import run_cli
from tests.support.matrix import (
    Fixture,
    all_fixtures,
    array_leaves,
    restored_dtype_shape,
    value_sha256s,
)

FIXTURES = all_fixtures()
ROOTS = [f for f in FIXTURES if f.kind == "root"]
MULTI_STEP = [f for f in ROOTS if len(f.steps()) >= 2]
ids = [f.id for f in FIXTURES]


def test_the_matrix_is_there() -> None:
    releases = {f.release for f in FIXTURES}
    assert {"0.4.3", "0.5.20", "0.6.4", "0.9.1", "0.10.3", "0.11.19", "0.12.8"} <= releases
    assert "v1-0.12.8" in releases
    assert len(FIXTURES) >= 150 and len(MULTI_STEP) >= 40


def _items(f: Fixture) -> list[tuple[int | None, str, dict[str, Any]]]:
    out = []
    for step, sd in f.steps().items():
        for name, item in sd["items"].items():
            out.append((None if step == -1 else step, name, item))
    assert out, f"{f.id}: truth holds no item"
    return out


@pytest.mark.parametrize("f", ROOTS, ids=[f.id for f in ROOTS])
def test_ls(f: Fixture) -> None:
    from ckpt_cli.core.listing import list_root
    from ckpt_cli.core.storage import open_location

    listing = list_root(open_location(str(f.path)))
    committed = [s.step for s in listing.steps if s.status == "committed"]
    assert committed == f.truth["all_steps"]
    incomplete = sorted(s.name for s in listing.steps if s.status == "incomplete")
    assert incomplete == f.truth["tmp_dirs"]
    assert listing.ignored == ()
    for s in listing.steps:
        assert s.problem is None, s.problem
        if s.status != "committed":
            continue
        want = sorted(n for n in f.steps()[s.step]["items"] if n != "metrics")
        assert sorted(s.items) == want
        for item, fmt in s.formats.items():
            on_disk = (f.path / s.name / item / "manifest.ocdbt").exists()
            assert fmt.startswith("ocdbt") == on_disk, (s.name, item, fmt)


@pytest.mark.parametrize("f", FIXTURES, ids=ids)
def test_inspect(f: Fixture) -> None:
    ck = ckpt_cli.open(f.path)
    for step, name, truth in _items(f):
        item = ck.item(step=step, item=name)
        doc = item.report.to_json()
        if truth["kind"] == "json":
            assert doc["storage"] == "json"
            assert item.read_tree() == truth["value"], (step, name)
            continue
        want = array_leaves(truth)
        assert want, f"{f.id} {name}: no array leaf in the truth"
        got = {tuple(leaf["keypath"]): leaf for leaf in doc["leaves"] if leaf["dtype"] is not None}
        assert sorted(got) == sorted(want), (step, name)
        for kp, leaf in want.items():
            shown = got[kp]
            assert shown["problem"] is None, (kp, shown["problem"])
            assert (shown["dtype"], shown["shape"]) == restored_dtype_shape(leaf), kp
        assert all(leaf["problem"] is None for leaf in doc["leaves"])
        # Every value, read through TensorStore in one batch of scans: SHA-256 of the C-order
        # bytes, as the truth records it (key data for typed keys).
        digests = value_sha256s(item)
        by_keypath = {leaf.keypath: leaf.name for leaf in item.leaves}
        assert {kp: digests[by_keypath[kp]] for kp in want} == {
            kp: leaf["sha256"] for kp, leaf in want.items()
        }, (step, name)


@pytest.mark.parametrize("f", FIXTURES, ids=ids)
def test_verify_deep(f: Fixture) -> None:
    report = ckpt_cli.verify(f.path, deep=True)
    assert [p.to_json() for p in report.problems] == []
    assert report.ok


@pytest.mark.parametrize("f", FIXTURES, ids=ids)
def test_diff_with_itself(f: Fixture) -> None:
    step, sd = f.latest()
    compared = 0
    for name, item in sd["items"].items():
        if item["kind"] == "json":
            continue
        report = diff_paths(str(f.path), str(f.path), step=step, item=name)
        assert report.leaves, name
        assert [d.to_json() for d in report.leaves if not d.equal] == []
        compared += 1
    assert compared


@pytest.mark.parametrize("f", MULTI_STEP, ids=[f.id for f in MULTI_STEP])
def test_diff_first_and_last_step(f: Fixture) -> None:
    steps = f.steps()
    a, b = min(steps), max(steps)
    compared = 0
    for name, item in steps[b]["items"].items():
        if item["kind"] == "json" or name not in steps[a]["items"]:
            continue
        want_a, want_b = array_leaves(steps[a]["items"][name]), array_leaves(item)
        report = diff_paths(str(f.path), str(f.path), step_a=a, step_b=b, item=name)
        by_keypath = {d.name: d for d in report.leaves}
        names = {leaf.keypath: leaf.name for leaf in ckpt_cli.open(f.path).item(b, name).leaves}
        for kp in want_a.keys() & want_b.keys():
            same = (want_a[kp]["sha256"], want_a[kp]["dtype"]) == (
                want_b[kp]["sha256"],
                want_b[kp]["dtype"],
            )
            d = by_keypath[names[kp]]
            assert d.status == ("equal" if same else "different"), (name, kp, d.to_json())
            compared += 1
    assert compared


@pytest.fixture(scope="module", autouse=True)
def _heap_frozen() -> Iterator[None]:
    """What the worker holds is collected, then frozen (``gc.freeze``) here and at each
    ``test_cli``: the collection it runs before each capture scans only what was made since the
    last, not the worker's whole heap (37 of this file's 102 s alone, most of its time in a full
    run); all is unfrozen when the module ends."""
    _collect()
    yield
    gc.unfreeze()


def _collect() -> None:
    gc.collect()
    gc.freeze()


@pytest.mark.parametrize("f", FIXTURES, ids=ids)
def test_cli(f: Fixture, capsys: pytest.CaptureFixture[str]) -> None:
    """The commands a person types, through main(): exit 0, one JSON document, a quiet stderr."""
    # An earlier test of this worker process may leave an Orbax coroutine for the garbage
    # collector, which reports it on stderr whenever it runs: collect it before capturing.
    _collect()
    capsys.readouterr()
    path = str(f.path)
    if f.kind == "root":
        r = run_cli(["ls", path, "--json"], capsys)
        assert (r.code, r.stderr) == (0, "")
        assert [s["step"] for s in r.json()["steps"] if s["status"] == "committed"] == f.truth[
            "all_steps"
        ]
        _schema("ls").validate(r.json())
    r = run_cli(["inspect", path, "--json"], capsys)
    assert (r.code, r.stderr) == (0, ""), r.stderr
    assert json.loads(r.stdout)["leaves"]
    _schema("inspect").validate(r.json())  # the published contract holds on every release's output
    r = run_cli(["verify", path, "--deep", "--json"], capsys)
    assert (r.code, r.stderr) == (0, ""), r.stdout[-2000:]
    assert r.json()["problems"] == []
    _schema("verify").validate(r.json())
    r = run_cli(["diff", path, path], capsys)
    assert r.code == 0, r.stdout + r.stderr


@functools.cache
def _schema(command: str) -> Any:
    from tests.support.schemas import validator

    return validator(command)
