"""``core/budget.py``: the deadline on a driven clock, n/t subsets, the rotation state file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from ckpt_cli.core.storage import LocalLocation
from ckpt_cli.core.verify.budget import (
    STATE_FILE,
    Deadline,
    RotationState,
    chunk_key,
    parse_subset,
    read_state,
    subset_of,
    write_state,
)
from ckpt_cli.errors import UsageError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_deadline_counts_from_the_start_and_drains_in_flight_reads() -> None:
    clock = Clock()
    d = Deadline(10.0, clock)
    d.start_data()
    assert not d.should_stop(0)
    clock.now += 8.0
    d.done(800)  # 100 bytes/s so far
    assert not d.should_stop(100)  # 8 s + 1 s of queue < 10 s
    assert d.should_stop(300)  # 8 s + 3 s of queue > 10 s: stop submitting now
    assert d.should_stop(0)  # and it stays stopped
    assert Deadline(None, clock).should_stop(10**12) is False


def test_subsets_are_disjoint_stable_and_cover_everything() -> None:
    keys = [
        chunk_key("default", f"leaf{i}", (j, k))
        for i in range(5)
        for j in range(8)
        for k in range(8)
    ]
    t = 7
    parts = Counter(subset_of(key, t) for key in keys)
    assert set(parts) == set(range(1, t + 1))  # 320 chunks: every subset gets some
    assert sum(parts.values()) == len(keys)
    assert [subset_of(k, t) for k in keys] == [subset_of(k, t) for k in keys]
    assert max(parts.values()) < 2 * len(keys) / t  # roughly even


@pytest.mark.parametrize(("text", "want"), [("1/4", (1, 4)), (" 4 / 4 ", (4, 4)), ("5%", None)])
def test_parse_subset(text: str, want: tuple[int, int] | None) -> None:
    assert parse_subset(text) == want


@pytest.mark.parametrize("text", ["0/4", "5/4", "1/0", "a/b", "2/", "/3"])
def test_parse_subset_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="N/T"):
        parse_subset(text)


def test_state_round_trip_and_damage(tmp_path: Path) -> None:
    item = LocalLocation(str(tmp_path))
    assert read_state(item) is None
    state = RotationState("abc", None, 2, "2026-12-01T00:00:00+00:00", 17, 1024, 4096, "now")
    write_state(item, state)
    assert read_state(item) == state
    (tmp_path / STATE_FILE).write_text("{broken")
    assert read_state(item) is None
