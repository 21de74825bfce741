"""A migration's and an import's output leaves tell the writer their blocks are their own
(``fresh_blocks``), so TensorStore encodes the cast, renamed, copied or imported values without
copying each block first."""

from __future__ import annotations

from pathlib import Path

import ckpt_cli
from ckpt_cli.core.migrate.execute import migrate_leaves
from ckpt_cli.core.spec import ops
from ckpt_cli.core.spec.language import parse_spec
from ckpt_cli.core.write.types import Compression
from tests.support.matrix import fixture


def test_cast_and_unchanged_leaves_are_fresh(tmp_path: Path) -> None:
    f = fixture("0.12.8", "nnx_model_optimizer")
    spec = parse_spec(b"rules: [{op: cast, match: 'model\\..*', dtype: bfloat16}]\n", "s.yaml")
    plan = ckpt_cli.plan_migration(f.path, tmp_path / "out", spec, allow_unused=True)
    assert plan.items, "the plan writes an item"
    item = plan.items[0]
    outs = migrate_leaves(item.report, item.leaves, False, Compression("zstd"), 1 << 30)
    arrays = [(out, leaf) for out, leaf in zip(outs, item.leaves, strict=True) if out.array]
    kinds = {type(leaf.expr).__name__ for _, leaf in arrays}
    assert {"Cast", "Source"} <= kinds, kinds
    for out, leaf in arrays:
        assert out.fresh_blocks is ops.fresh_blocks(leaf.expr) is True, out.name


def test_imported_leaves_are_fresh(tmp_path: Path) -> None:
    """``import`` reads each block of a tensor into a new array: handed over as they are."""
    import numpy as np
    from safetensors.numpy import save_file

    from ckpt_cli.core.safetensors.import_run import ImportContext, _leaf_outs

    save_file(
        {"w": np.ones((8, 4), np.float32), "b": np.zeros(4, np.int32)}, tmp_path / "m.safetensors"
    )
    plan = ckpt_cli.plan_import(tmp_path / "m.safetensors", tmp_path / "out")
    ctx = ImportContext()
    try:
        outs = [out for out in _leaf_outs(plan, ctx) if out.array is not None]
        assert len(outs) == 2 and all(out.fresh_blocks for out in outs)
        block = (slice(0, 4), slice(0, 4))
        w = next(out for out in outs if out.name.endswith("w"))
        assert w.source is not None
        first, second = (np.asarray(ops.resolve(w.source(block))) for _ in range(2))
        assert np.array_equal(first, np.ones((4, 4), np.float32))
        assert not np.shares_memory(first, second)
    finally:
        ctx.close()
