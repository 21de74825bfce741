"""The writers keep a block in flight per thread (``--threads``), their bytes still capped by
the memory limit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ckpt_cli.core import threads
from ckpt_cli.core.write.pipeline import Pipeline


@pytest.mark.parametrize(("n", "depth"), [(1, 4), (4, 4), (12, 12)])
def test_blocks_in_flight_follow_the_threads(
    n: int, depth: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(threads, "_chosen", n)
    writer = SimpleNamespace(in_flight=8, memory_limit=1 << 30, slab_reads=True)
    pipe = Pipeline(writer, [], None)  # type: ignore[arg-type]
    assert pipe.depth == depth
    assert pipe.limit == (1 << 30) // 4  # the bytes in flight do not grow with the threads
