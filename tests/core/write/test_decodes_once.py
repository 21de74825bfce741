"""Reshard reads each stored source chunk once when its output blocks are smaller than a source
chunk (counted with TensorStore's own ``bytes_read`` metric, not by timing), and Orbax restores
the resharded step to the same values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ckpt_cli.core.write.pipeline import block_budget
from tests.support.cli import run_cli
from tests.support.read_count import counting_reads, save_one_chunk_leaves, stored_data_bytes


def _orbax_restore(root: Path) -> dict[str, np.ndarray]:
    import jax
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(root, item_handlers=ocp.PyTreeCheckpointHandler()) as mgr:
        meta = mgr.item_metadata(0)
        args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
        state = mgr.restore(0, args=ocp.args.PyTreeRestore(restore_args=args))
    return dict(state["params"])


def test_reshard_reads_each_source_chunk_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = save_one_chunk_leaves(tmp_path / "src")
    stored = stored_data_bytes(tmp_path / "src" / "0" / "default")
    # Output chunks of 1 MiB and blocks of 1 MiB: the 8 MiB source chunk spans 8 blocks.
    assert block_budget(32 << 20) < (8 << 20)
    args = ["--mesh", "data=8", "--rule", "params.*=[data, null]", "--max-chunk-bytes", "1MiB"]
    args += ["--memory-limit", "32MiB"]
    with counting_reads() as read:
        result = run_cli(["reshard", str(tmp_path / "src"), str(tmp_path / "out"), *args], capsys)
    assert result.code == 0, result.stderr
    # Each data file once (plus manifests and b-tree nodes); twice would be about 1.8x.
    assert stored * 0.95 <= read[0] < stored * 1.1, (read[0], stored)
    restored = _orbax_restore(tmp_path / "out")
    params = state["params"]
    assert isinstance(params, dict) and params
    for name, value in params.items():
        assert np.array_equal(restored[name], value), name
