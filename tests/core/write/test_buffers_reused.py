"""A reshard decodes its blocks into buffers TensorStore has let go of (``format/buffers.py``),
and Orbax restores the output to the source's values either way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ckpt_cli.core.format import buffers
from tests.support.cli import run_cli
from tests.support.read_count import orbax_restore_params, save_one_chunk_leaves


@pytest.mark.parametrize("reuse", ["1", "0"])
def test_reshard_reuses_block_buffers_and_restores_the_same(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    reuse: str,
) -> None:
    monkeypatch.setenv("CKPT_REUSE_BUFFERS", reuse)
    state = save_one_chunk_leaves(tmp_path / "src")
    before = buffers.reused
    args = ["reshard", str(tmp_path / "src"), str(tmp_path / "out"), "--mesh", "data=8"]
    args += ["--rule", "params.*=[data, null]", "--max-chunk-bytes", "1MiB"]
    result = run_cli([*args, "--memory-limit", "32MiB"], capsys)
    assert result.code == 0, result.stderr
    # The 8 MiB leaf's eight 1 MiB blocks: each one after the first few on a reused buffer.
    if reuse == "1":
        assert buffers.reused - before >= 4, buffers.reused - before
    else:
        assert buffers.reused == before
    assert buffers._free == []  # dropped when the run ended
    params = state["params"]
    assert isinstance(params, dict) and params
    restored = orbax_restore_params(tmp_path / "out")
    for name, value in params.items():
        assert np.array_equal(restored[name], value), name
