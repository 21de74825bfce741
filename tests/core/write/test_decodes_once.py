"""Reshard reads each stored source chunk once when its output blocks are smaller than a source
chunk (counted with TensorStore's own ``bytes_read`` metric, not by timing), and Orbax restores
the resharded step to the same values."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ckpt_cli.core.write.pipeline import block_budget
from tests.support.cli import run_cli
from tests.support.read_count import (
    counting_reads,
    orbax_restore_params,
    save_one_chunk_leaves,
    stored_data_bytes,
)


def _reads_once_then_restores(
    tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Save the source, run ``ckpt ARGS SRC OUT ...`` counting TensorStore's bytes read (each
    stored data file once), then the source's params and Orbax's restore of the output."""
    state = save_one_chunk_leaves(tmp_path / "src")
    stored = stored_data_bytes(tmp_path / "src" / "0" / "default")
    command, *rest = args
    with counting_reads() as read:
        result = run_cli([command, str(tmp_path / "src"), str(tmp_path / "out"), *rest], capsys)
    assert result.code == 0, result.stderr
    # Each data file once (plus manifests and b-tree nodes); twice would be about 1.8x. The
    # 8 MiB chunk of params.w, read in parts, streams from its data file (``FileValue``) at the
    # place the source's structure pass found, not through the OCDBT kvstore.
    assert stored * 0.95 <= read[0] < stored * 1.1, (read[0], stored)
    if os.environ.get("CKPT_PART_READS") != "0":
        assert read[1] >= 7 << 20, read
    params = state["params"]
    assert isinstance(params, dict) and params
    return params, orbax_restore_params(tmp_path / "out")


def test_reshard_reads_each_source_chunk_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Output chunks of 1 MiB and blocks of 1 MiB: the 8 MiB source chunk spans 8 blocks.
    assert block_budget(32 << 20) < (8 << 20)
    args = ["reshard", "--mesh", "data=8", "--rule", "params.*=[data, null]"]
    args += ["--max-chunk-bytes", "1MiB", "--memory-limit", "32MiB"]
    params, restored = _reads_once_then_restores(tmp_path, args, capsys)
    for name, value in params.items():
        assert np.array_equal(restored[name], value), name


def test_migrate_reads_each_source_chunk_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import ml_dtypes

    spec = tmp_path / "cast.yaml"
    spec.write_text("rules:\n  - {op: cast, match: 'params\\..*', dtype: bfloat16}\n")
    args = ["migrate", "--spec", str(spec), "--memory-limit", "32MiB", "--max-chunk-bytes", "1MiB"]
    params, restored = _reads_once_then_restores(tmp_path, args, capsys)
    for name, value in params.items():
        want = np.asarray(value).astype(ml_dtypes.bfloat16)
        assert restored[name].dtype == want.dtype, name
        assert np.array_equal(restored[name].view(np.uint16), want.view(np.uint16)), name


@pytest.mark.parametrize("parts", ["1", "0"])
def test_reshard_blocks_are_copied_inside_tensorstore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, parts: str
) -> None:
    # A plain reshard (no digest to take, same dtype): TensorStore copies each block from the
    # source array into the output array itself, no values array in between; same values. But
    # not a part of a source chunk of 4 MiB or more (params.w's 8 MiB chunk here): TensorStore
    # would decode that chunk whole for each part, so ckpt copies it from one pass over the
    # chunk (``ownreads``), unless CKPT_PART_READS=0. Only with --allow-nonfinite: by default a
    # writer sees every float block's values, to refuse NaN/Inf (``write.finite``).
    from ckpt_cli.core.write import pipeline

    monkeypatch.setenv("CKPT_PART_READS", parts)

    seen: list[pipeline.Pipeline] = []
    written: list[int] = []
    run, finish = pipeline.Pipeline.run, pipeline.Pipeline._finish_write

    def spy(self: pipeline.Pipeline) -> None:
        seen.append(self)
        run(self)

    def spy_finish(self: pipeline.Pipeline) -> None:
        written.append(self.writes[0][2])  # the block's bytes
        finish(self)

    monkeypatch.setattr(pipeline.Pipeline, "run", spy)
    monkeypatch.setattr(pipeline.Pipeline, "_finish_write", spy_finish)
    args = ["reshard", "--mesh", "data=8", "--rule", "params.*=[data, null]"]
    args += ["--max-chunk-bytes", "1MiB", "--memory-limit", "32MiB", "--allow-nonfinite"]
    params, restored = _reads_once_then_restores(tmp_path, args, capsys)
    for name, value in params.items():
        assert np.array_equal(restored[name], value), name
    assert sum(written) == sum(np.asarray(v).nbytes for v in params.values())
    # Every block within the block budget; a larger one (an output chunk over it) is still
    # assembled from slabs, which keeps its memory at the slabs in flight.
    within = [n for n in written if n <= block_budget(32 << 20)]
    assert len(within) > len(params)
    assert sum(p.copied for p in seen) == (0 if parts == "1" else len(within))
