"""The public API reads every leaf of every committed fixture equal to a real Orbax restore.

Orbax restores each PyTree item with ``RestoreArgs(restore_type=np.ndarray)`` (no mesh needed)
and each JSON item with ``JsonCheckpointHandler``; ``ckpt_cli`` reads the same item leaf by leaf
through TensorStore. ``unmerged_ocdbt`` (the pre-0.4.4 layout Orbax 0.12 no longer reads) is
derived from ``multiprocess`` and compared with Orbax's restore of that; the Flax msgpack file
is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckpt_cli
from ckpt_cli.errors import UnsupportedError
from tests.support.paths import FIXTURES

pytestmark = pytest.mark.slow

ALL = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
#: Fixtures whose ground truth is another fixture's restore (see fixtures/README.md).
DERIVED = {"unmerged_ocdbt": "multiprocess"}


def test_there_are_fixtures() -> None:
    assert len(ALL) >= 10 and "seed_mlp" in ALL


def _flat(tree: Any) -> dict[str, Any]:
    import jax

    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)
    out = {}
    for path, value in flat:
        keys = (getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))) for k in path)
        out[".".join(str(k) for k in keys)] = value
    return out


def _orbax(item_dir: Path, json_file: str | None) -> dict[str, Any]:
    import jax
    import orbax.checkpoint as ocp

    if json_file is not None:
        handler = ocp.JsonCheckpointHandler(filename=json_file)
        return _flat(ocp.Checkpointer(handler).restore(item_dir))
    checkpointer = ocp.PyTreeCheckpointer()
    meta = checkpointer.metadata(item_dir)
    tree = getattr(meta, "item_metadata", None) or getattr(meta, "tree", meta)
    tree = getattr(tree, "tree", tree)

    def restore_args(leaf: Any) -> Any:
        kind = type(leaf).__name__
        if "String" in kind:
            return ocp.RestoreArgs(restore_type=str)
        if "Scalar" in kind:
            return ocp.RestoreArgs()
        return ocp.RestoreArgs(restore_type=np.ndarray)

    args = ocp.args.PyTreeRestore(restore_args=jax.tree_util.tree_map(restore_args, tree))
    return _flat(checkpointer.restore(item_dir, args=args))


def _items(name: str) -> list[tuple[int | None, str]]:
    ck = ckpt_cli.open(FIXTURES / name)
    steps = [s for s in ck.steps() if s.status == "committed"] if ck.kind == "root" else []
    if not steps:
        return [(None, ck.item().name)]
    out = []
    for s in steps:
        out += [(s.step, item) for item in (*s.items, *(["metrics"] if s.metrics else []))]
    return out


def _same(ours: Any, theirs: Any, where: str) -> None:
    if isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray), where
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), where
        assert np.array_equal(ours, theirs, equal_nan=theirs.dtype.kind == "f"), where
    elif isinstance(theirs, (bool, int, float)) and not isinstance(ours, (str, type(None))):
        assert np.asarray(ours).shape == () and np.asarray(ours).item() == theirs, where
    else:
        assert ours == theirs, where


@pytest.mark.parametrize("name", ALL)
def test_every_leaf_equals_an_orbax_restore(name: str) -> None:
    if name == "msgpack_legacy":
        with pytest.raises(UnsupportedError):
            ckpt_cli.open(FIXTURES / name).item()
        return
    items = _items(name)
    assert items
    compared = 0
    for step, item_name in items:
        item = ckpt_cli.open(FIXTURES / name).item(step=step, item=item_name)
        truth_item = item
        if name in DERIVED:
            truth_item = ckpt_cli.open(FIXTURES / DERIVED[name]).item(step=step, item=item_name)
        leaves = item.leaves
        json_file = None
        if leaves and leaves[0].value_type == "json":
            json_file = "metrics" if (Path(item.path) / "metrics").is_file() else "metadata"
        theirs = _orbax(Path(truth_item.path), json_file)
        assert theirs, (name, step, item_name)
        ours = {leaf.name: leaf for leaf in leaves}
        # Orbax flattens empty containers away; every other leaf is on both sides.
        assert {n for n, lf in ours.items() if lf.value_type not in ("Dict", "List")} == set(theirs)
        for leaf_name, value in theirs.items():
            _same(item.read(leaf_name), value, f"{name}@{step}/{item_name}:{leaf_name}")
            compared += 1
    assert compared > 0
