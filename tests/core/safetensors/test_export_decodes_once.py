"""Export reads each stored source chunk once when its blocks are smaller than a chunk: the
writer gets a band of whole source chunks as one block (counted with TensorStore's own
``bytes_read`` metric, not by timing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ckpt_cli.core.safetensors.export import ExportTensor
from ckpt_cli.core.safetensors.export_run import _budget, _limit, block_bytes
from tests.support.cli import run_cli
from tests.support.read_count import counting_reads, save_one_chunk_leaves, stored_data_bytes


def test_export_reads_each_source_chunk_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import safetensors.numpy

    # Chunks larger than a slab stream from their data files (``FileValue``), the rest
    # through TensorStore: both counted.
    state = save_one_chunk_leaves(tmp_path / "src")
    stored = stored_data_bytes(tmp_path / "src" / "0" / "default")
    # 32 MiB: blocks of 1 MiB, so the 8 MiB chunk of params.w spans 8 of them.
    assert _budget(32 << 20) < (8 << 20)
    with counting_reads() as read:
        result = run_cli(
            [
                "export",
                str(tmp_path / "src" / "0"),
                str(tmp_path / "out"),
                "--memory-limit",
                "32MiB",
            ],
            capsys,
        )
    assert result.code == 0, result.stderr
    # Each data file once (plus manifests and b-tree nodes); twice would be about 1.8x.
    total, direct = read
    assert direct > 0 and stored * 0.95 <= total < stored * 1.1, (total, direct, stored)
    out = safetensors.numpy.load_file(str(tmp_path / "out" / "model.safetensors"))
    params = state["params"]
    assert isinstance(params, dict) and params
    for name, value in params.items():
        assert np.array_equal(out[f"params.{name}"], value), name


def test_a_band_of_chunks_is_one_block_only_under_the_limit() -> None:
    from ckpt_cli.core.format.arrays import ArrayInfo
    from ckpt_cli.core.spec import ops

    shape = (1024, 2048)
    info = ArrayInfo("float32", shape, shape, zarr_format=2, compression="zstd")
    source = ops.Source(shape, "float32", "w", info, "")
    t = ExportTensor("w", "float32", shape, source, ("w",), (), "model.safetensors")
    budget = _budget(32 << 20)
    assert block_bytes(t, budget, _limit(32 << 20)) == 8 << 20  # the chunk, read once
    assert block_bytes(t, budget, 4 << 20) == budget  # over the limit: blocks of the budget
