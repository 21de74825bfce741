"""The writers' OCDBT data files close at ``item.DATA_FILE_BYTES``: TensorStore writes a data
file once it holds that many bytes, while the one before is still being written (without a
target it keeps one data file write in flight per database and queues every chunk encoded
meanwhile behind it). Orbax restores the output to the same values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ckpt_cli.core.storage.local import LocalLocation
from ckpt_cli.core.write import item
from ckpt_cli.core.write.item import DATA_FILE_BYTES, ItemWriter
from tests.support.cli import run_cli
from tests.support.read_count import save_one_chunk_leaves

KIB = 1 << 10


def test_every_ocdbt_array_the_writers_open_has_the_target() -> None:
    writer = ItemWriter(
        LocalLocation("/nonexistent/item"), use_ocdbt=True, use_zarr3=True, memory_limit=1 << 30
    )
    spec = writer._kvstore("params.w")
    assert spec["driver"] == "ocdbt"
    assert spec["target_data_file_size"] == DATA_FILE_BYTES == 64 << 20


def test_data_files_close_at_the_target_and_orbax_restores_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import jax
    import orbax.checkpoint as ocp

    target, chunk = 1 << 20, 256 * KIB
    monkeypatch.setattr(item, "DATA_FILE_BYTES", target)
    state = save_one_chunk_leaves(tmp_path / "src")
    args = ["reshard", str(tmp_path / "src"), str(tmp_path / "out"), "--mesh", "data=8"]
    args += ["--rule", "params.*=[data, null]", "--max-chunk-bytes", "256KiB"]
    result = run_cli(args, capsys)
    assert result.code == 0, result.stderr
    files = sorted((tmp_path / "out" / "0" / "default" / "d").iterdir())
    sizes = [f.stat().st_size for f in files]
    # 10 MiB of values (zstd leaves random floats about that size) in files of about 1 MiB.
    assert len(files) >= 8 and sum(sizes) > 9 << 20, sizes
    assert max(sizes) <= target + chunk + 4 * KIB, sizes
    with ocp.CheckpointManager(tmp_path / "out", item_handlers=ocp.PyTreeCheckpointHandler()) as m:
        meta = m.item_metadata(0)
        restore = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
        got = m.restore(0, args=ocp.args.PyTreeRestore(restore_args=restore))
    params = state["params"]
    assert isinstance(params, dict) and params
    for name, value in params.items():
        assert np.array_equal(got["params"][name], value), name
