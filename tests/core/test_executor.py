"""The local executor: a worker process that dies is replaced and its units run again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckpt_cli.core.executor import LocalExecutor
from ckpt_cli.errors import StorageError


def die_once(args: tuple[str, int]) -> int:
    """Unit 1 kills its worker process the first time it runs (as an OOM kill would)."""
    marker, i = args
    if i == 1 and not os.path.exists(marker):
        Path(marker).touch()
        os._exit(1)
    return i * i


def die_always(i: int) -> int:
    os._exit(1)


def test_dead_worker_is_replaced_and_its_units_rerun(tmp_path: Path) -> None:
    ex = LocalExecutor(2)
    seen: list[int] = []
    try:
        out = ex.map(die_once, [(str(tmp_path / "died"), i) for i in range(6)], seen.append)
    finally:
        ex.close()
    assert (tmp_path / "died").exists()  # a worker really died
    assert out == [i * i for i in range(6)]
    assert sorted(seen) == sorted(out)  # progress saw every unit once


def test_workers_that_keep_dying_fail_the_run() -> None:
    ex = LocalExecutor(2)
    try:
        with pytest.raises(StorageError, match="died 4 times"):
            ex.map(die_always, [1, 2])
    finally:
        ex.close()
