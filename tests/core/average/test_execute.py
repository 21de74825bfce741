"""``execute`` of an average plan: the memory the writer is given for several inputs, the
block sum against numpy, and a scaled-out run (``MeanLeaf`` rebuilt on worker processes) that
writes the same values as one process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ckpt_cli.core.average.execute import execute, step_write_options
from ckpt_cli.core.average.plan import plan_average
from ckpt_cli.core.executor import ExecutorSpec
from ckpt_cli.core.write.types import WriteOptions
from tests.support.average_runs import flat, mixed_steps, restore_raw, weighted


def test_the_writer_gets_its_share_of_the_limit() -> None:
    user = WriteOptions(max_chunk_bytes=64 << 20, memory_limit=1 << 30)
    three = step_write_options(user, 3)
    assert three.memory_limit == (1 << 30) // 2 and three.max_chunk_bytes == 64 << 20
    nine = step_write_options(user, 9)
    assert nine.memory_limit == (1 << 30) // 4 and nine.max_chunk_bytes == 64 << 20
    small = step_write_options(WriteOptions(max_chunk_bytes=16 << 20, memory_limit=64 << 20), 5)
    assert small.memory_limit == 24 << 20 and small.max_chunk_bytes == 6 << 20


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, np.ndarray]]]:
    root = tmp_path_factory.mktemp("mixed") / "run"
    return root, [flat(t) for t in mixed_steps(root)]


def test_written_values_are_numpys_weighted_mean(
    saved: tuple[Path, list[dict[str, np.ndarray]]], tmp_path: Path
) -> None:
    root, trees = saved
    plan = plan_average(root, tmp_path / "out", [10, 20, 30], weights=[3, 1, 1])
    result = execute(plan)
    assert result.output.step == 30 and result.output.bytes_written == plan.total_bytes
    got = flat(restore_raw(tmp_path / "out", 30))
    for name in ("params.dense.kernel", "params.scale"):
        values = [t[name] for t in trees]
        assert values
        np.testing.assert_allclose(got[name], weighted(values, [3, 1, 1]), rtol=1e-6, atol=1e-6)


def test_a_scaled_out_run_writes_the_same_values(
    saved: tuple[Path, list[dict[str, np.ndarray]]], tmp_path: Path
) -> None:
    root, _ = saved
    one = execute(plan_average(root, tmp_path / "one", [10, 20, 30], ema=0.8))
    spec = ExecutorSpec("local", 2, force_split=True)
    write = WriteOptions(executor=spec, unit_bytes=4096)
    many = execute(plan_average(root, tmp_path / "many", [10, 20, 30], ema=0.8, write=write))
    assert one.output.scale is None
    assert many.output.scale is not None and many.output.scale.units > 1
    a, b = flat(restore_raw(tmp_path / "one", 30)), flat(restore_raw(tmp_path / "many", 30))
    assert a.keys() == b.keys()
    for name, value in a.items():
        np.testing.assert_array_equal(b[name], value)
