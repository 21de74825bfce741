"""A migration's output leaves tell the writer their blocks are their own (``fresh_blocks``), so
TensorStore encodes the cast, renamed or copied values without copying each block first."""

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
